"""Identity of the patch set carried by this vllm_ascend build.

The wheel built by ``make wheel`` is upstream vllm-ascend at the pinned release plus the
patch set; this module says which, so a running server's log and a bug report name it.
"""

from __future__ import annotations

from vllm.logger import init_logger

logger = init_logger(__name__)

PATCHSET_VERSION = "0.23.0+cpp.ds1"
UPSTREAM_VERSION = "0.23.0"
FEATURES = {
    "cpp": "dynamic chunked pipeline parallelism (additional_config.profiling_chunk_config)",
    "dual-stream": "dual-stream TP all-reduce overlap for Qwen3 dense (additional_config.dual_stream_config)",
}

_logged = False


def describe() -> str:
    names = ", ".join(sorted(FEATURES))
    return f"vllm-ascend {UPSTREAM_VERSION} with patch set {PATCHSET_VERSION} ({names})"


def log_patchset() -> None:
    """Log the patch set once per process, at platform-plugin registration."""
    global _logged
    if _logged:
        return
    _logged = True
    logger.info("[PatchSet] %s", describe())
