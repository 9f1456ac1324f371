"""Stand-ins for NPU-only modules so a vllm_ascend tree imports on a CPU host.

torch_npu cannot load without CANN; the twin only needs vllm_ascend's scheduler code,
which imports these modules at import time but never calls them. A stand-in is
installed only for a module that is not importable for real.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from unittest import mock

NPU_ONLY_MODULES = ("torch_npu", "torch_npu._C", "torch_npu.npu", "acl", "mooncake", "mooncake.engine")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def set_cpu_environment() -> None:
    """Pure-vLLM platform (no plugin auto-load, no torch device backend auto-load)."""
    os.environ["VLLM_PLUGINS"] = ""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"


def install_npu_stubs() -> list[str]:
    """Put a MagicMock module in ``sys.modules`` for each NPU-only module missing here."""
    installed: list[str] = []
    for name in NPU_ONLY_MODULES:
        if name in sys.modules or _importable(name):
            continue
        module = mock.MagicMock(name=name, spec=types.ModuleType(name))
        module.__name__ = name
        module.__path__ = []
        module.__spec__ = None
        sys.modules[name] = module
        installed.append(name)
    return installed
