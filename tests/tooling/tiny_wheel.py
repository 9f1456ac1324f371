"""A tiny stand-in for the pinned upstream wheel (the ``tiny_wheel`` fixture in tests/conftest.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from vllm_ascend_patchset.pin import Pin
from vllm_ascend_patchset.record import record_hash

TINY_PACKAGE = {
    "vllm_ascend/__init__.py": b"def register():\n    return 'vllm_ascend.platform.NPUPlatform'\n",
    "vllm_ascend/platform.py": b"class NPUPlatform:\n    device_name = 'npu'\n",
    "vllm_ascend/core/__init__.py": b"",
    "vllm_ascend/core/scheduler.py": b"CHUNK_TOKENS = 8192\n",
    "vllm_ascend/_C.so": bytes(range(256)) * 4,
}


def write_wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel holding ``files`` plus the pinned version's METADATA and a correct RECORD."""
    pin = Pin.load()
    info = f"{pin.dist_name}-{pin.version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {pin.project}\nVersion: {pin.version}\n".encode(),
    }
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path
