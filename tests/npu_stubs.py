"""The NPU-only stand-ins for the tests: the twin's, so that one installer serves both.

torch_npu cannot load without CANN; upstream's own CPU tests stub the same modules. A
stand-in is installed only when the real module cannot be imported
(scripts/vllm_ascend_patchset/twin/stubs.py).
"""

from vllm_ascend_patchset.twin.stubs import NPU_ONLY_MODULES as STUBBED
from vllm_ascend_patchset.twin.stubs import install_npu_stubs as install

__all__ = ["STUBBED", "install"]
