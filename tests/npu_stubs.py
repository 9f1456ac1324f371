"""The NPU-only stand-ins for the tests: the tooling's (scripts/vllm_ascend_patchset/npu_stubs.py), so that
one installer serves the tests, the twin and the e2e engine.

torch_npu cannot load without CANN; upstream's own CPU tests stub the same modules. A
stand-in is installed only when the real module cannot be imported.
"""

from vllm_ascend_patchset.npu_stubs import NPU_ONLY_MODULES as STUBBED
from vllm_ascend_patchset.npu_stubs import install_npu_stubs as install

__all__ = ["STUBBED", "install"]
