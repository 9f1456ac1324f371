"""Stand-ins for NPU-only modules so a vllm_ascend tree imports on a CPU host.

torch_npu cannot load without CANN; the twin, the e2e engine and the tests only need
vllm_ascend code that imports these modules at import time but never calls them. A
stand-in is installed only for a module that is not importable for real. Also here:
``import_vllm`` (vLLM's config and scheduler modules, with given stand-ins set aside
meanwhile) and ``set_cpu_environment`` (pure vLLM, no plugin or device auto-load).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterable
from unittest import mock

NPU_ONLY_MODULES = ("torch_npu", "torch_npu._C", "torch_npu.npu", "acl", "mooncake", "mooncake.engine")
VLLM_MODULES = ("vllm.config", "vllm.v1.core.sched.scheduler", "vllm.v1.core.single_type_kv_cache_manager")


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
        # a real spec: transformers' availability probes reject a module whose __spec__ is None
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
        installed.append(name)
    return installed


def import_vllm(set_aside: Iterable[str] = ()) -> None:
    """Import vLLM's config and scheduler modules, the modules named in ``set_aside`` out of the way.

    Those are taken out of ``sys.modules`` for the import and put back after: transformers
    probes ``importlib.util.find_spec("torch_npu")``, which raises on a stand-in without
    a spec; vLLM itself needs no NPU module.
    """
    saved = {name: sys.modules.pop(name) for name in set_aside if name in sys.modules}
    try:
        for name in VLLM_MODULES:
            importlib.import_module(name)
    finally:
        sys.modules.update(saved)
