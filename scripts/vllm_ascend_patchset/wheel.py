"""Repack the pinned upstream wheel with the assembled tree into the patched wheel.

Compiled files stay byte-for-byte upstream's; Python files come from the assembled
tree. The version becomes a PEP 440 local version (``0.23.0+cpp.ds1``), RECORD is
regenerated, and entries are sorted with a fixed timestamp so two builds from the same
inputs are byte-identical. The result is verified before it is reported.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .assemble import Assembly, assemble
from .atomic import remove_stale, scratch_dir
from .paths import DIST_DIR, PACKAGE
from .pin import Pin, sha256_of
from .record import matches, read_record, record_hash
from .wheel_target import WheelTarget

FIXED_DATE = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644
SCRATCH_PREFIX = ".wheel-"


class WheelError(RuntimeError):
    """The built wheel failed verification."""


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str
    size: int
    files: int


def _entry(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (mode & 0xFFFF) << 16
    info.create_system = 3
    return info


def wheel_filename(pin: Pin, target: WheelTarget) -> str:
    return f"{pin.dist_name}-{pin.version}+{pin.local_version}-{target.py}-{target.py}-{target.platform_tag}.whl"


def build_wheel(
    target: WheelTarget | None = None,
    *,
    pin: Pin | None = None,
    out_dir: Path = DIST_DIR,
    assembly: Assembly | None = None,
    verify_install: bool = True,
) -> BuiltWheel:
    pin = pin or Pin.load()
    target = target or WheelTarget.host()
    assembly = assembly or assemble(target, pin=pin)
    version = f"{pin.version}+{pin.local_version}"
    old_info = f"{pin.dist_name}-{pin.version}.dist-info"
    new_info = f"{pin.dist_name}-{version}.dist-info"

    files: dict[str, tuple[bytes, int]] = {}
    with zipfile.ZipFile(assembly.wheel) as upstream:
        modes = {i.filename: (i.external_attr >> 16) or FILE_MODE for i in upstream.infolist()}
        for info in upstream.infolist():
            name = info.filename
            if name.endswith("/") or name.startswith(PACKAGE + "/"):
                continue  # directories are implied; the package comes from the assembled tree
            if not name.startswith(old_info + "/"):
                files[name] = (upstream.read(name), modes[name])
                continue
            base = name[len(old_info) + 1 :]
            if base == "RECORD":
                continue
            data = upstream.read(name)
            if base == "METADATA":
                data, n = re.subn(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
                if n != 1:
                    raise WheelError(f"{assembly.wheel.name}: METADATA has no Version line")
            files[f"{new_info}/{base}"] = (data, modes[name])
    for path in sorted(assembly.package.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        name = path.relative_to(assembly.root).as_posix()
        files[name] = (path.read_bytes(), modes.get(name, FILE_MODE))

    record_name = f"{new_info}/RECORD"
    rows = [(name, record_hash(data), str(len(data))) for name, (data, _) in sorted(files.items())]
    rows.append((record_name, "", ""))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    files[record_name] = (buf.getvalue().encode(), FILE_MODE)

    # Written and verified in a scratch folder, then renamed into place: dist/ never holds an
    # unverified or partial wheel, and the previous wheel stays until the new one is proven.
    dest = out_dir / wheel_filename(pin, target)
    remove_stale(out_dir, SCRATCH_PREFIX)
    scratch = scratch_dir(out_dir, SCRATCH_PREFIX)
    try:
        tmp = scratch / dest.name
        # dist-info last, RECORD at the very end, as the wheel spec recommends
        order = sorted(files, key=lambda n: (n.startswith(new_info + "/"), n == record_name, n))
        with zipfile.ZipFile(tmp, "w") as z:
            for name in order:
                data, mode = files[name]
                z.writestr(_entry(name, mode), data, compresslevel=6)
        verify_wheel(tmp, target, install=verify_install)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return BuiltWheel(dest, sha256_of(dest), dest.stat().st_size, len(files))


def verify_wheel(path: Path, target: WheelTarget, *, install: bool = True) -> None:
    """Every RECORD hash and size matches; pip installs it into a throw-away target."""
    with zipfile.ZipFile(path) as z:
        try:
            record, rows = read_record(z)
        except ValueError as exc:
            raise WheelError(str(exc)) from None
        names = set(z.namelist())
        for name, (digest, size) in rows.items():
            if name == record:
                continue
            if name not in names:
                raise WheelError(f"{path.name}: RECORD lists {name}, which is not in the wheel")
            if not matches(z.read(name), digest, size):
                raise WheelError(f"{path.name}: RECORD hash or size of {name} does not match its content")
        unlisted = names - set(rows)
        if unlisted:
            raise WheelError(f"{path.name}: not in RECORD: {', '.join(sorted(unlisted)[:5])}")
    if not install:
        return
    with tempfile.TemporaryDirectory(prefix="wheel-install-") as tmp:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", tmp]
        if target != WheelTarget.host():
            ver = target.py[2:]
            cmd += ["--platform", target.platform_tag, "--python-version", f"{ver[0]}.{ver[1:]}"]
            cmd += ["--implementation", "cp", "--abi", target.py, "--only-binary=:all:"]
        res = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
        if res.returncode != 0:
            raise WheelError(f"{path.name}: pip install --target failed:\n{res.stdout}{res.stderr}")
        if not (Path(tmp) / PACKAGE / "patchset.py").exists():
            raise WheelError(f"{path.name}: installed, but {PACKAGE}/patchset.py is missing")
