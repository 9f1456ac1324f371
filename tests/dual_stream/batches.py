"""The CPU stand-in of ``AscendMetadata`` and its batch builder: the dual-stream bench's, so one
builder serves the tests and the bench (scripts/vllm_ascend_patchset/dsbench/batches.py)."""

from vllm_ascend_patchset.dsbench.batches import (
    SHARED_MASK,
    FakeAscendMetadata,
    FakeAttentionState,
    Request,
    build_batch,
    slot_of,
)

__all__ = ["SHARED_MASK", "FakeAscendMetadata", "FakeAttentionState", "Request", "build_batch", "slot_of"]
