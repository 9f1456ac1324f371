"""Stand-ins for the NPU-only modules, so the assembled vllm_ascend imports on a CPU.

torch_npu cannot load without CANN; upstream's own CPU tests stub the same modules.
A stub is installed only when the real module cannot be imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from unittest import mock

STUBBED = ("torch_npu", "torch_npu._C", "torch_npu.npu", "acl", "mooncake", "mooncake.engine")


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def install() -> list[str]:
    installed = []
    for name in STUBBED:
        if name in sys.modules or not _missing(name.split(".")[0]):
            continue
        module = mock.MagicMock(name=name, spec=types.ModuleType(name))
        module.__name__ = name
        module.__path__ = []
        # a real spec: transformers' availability probes reject a module whose __spec__ is None
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
        installed.append(name)
    return installed
