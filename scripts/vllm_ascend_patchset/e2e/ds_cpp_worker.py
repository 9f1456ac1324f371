"""CPP and dual stream together on vLLM's CPU engine (one ``--worker-extension-cls`` takes one class).

``--worker-extension-cls vllm_ascend_patchset.e2e.ds_cpp_worker.DsCppCpuWorker``: CPP's
profiling RPC and step timing (``worker``) and dual stream's registration and hooks
(``ds_worker``), both installed by importing their modules.
"""

from __future__ import annotations

from .ds_worker import DsCpuWorker
from .worker import CppCpuWorker


class DsCppCpuWorker(CppCpuWorker, DsCpuWorker):
    """CPP's worker RPC; dual stream needs none."""
