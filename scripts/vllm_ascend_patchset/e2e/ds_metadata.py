"""Dual stream's metadata splitter for vLLM's CPU attention backend (test and bench code).

The product reads and cuts vllm-ascend's ``AscendMetadata`` (``dual_stream.gate``); on
vLLM's CPU engine the layers get ``CPUAttentionMetadata`` instead. ``install_builder_hook``
makes ``CPUAttentionMetadataBuilder.build`` keep, on what it builds, the batch's
``CommonAttentionMetadata`` and the builder itself; ``CpuAttentionSplitter`` then

- reads the per-request query lengths from that common metadata's host copy of
  ``query_start_loc`` (the gate's rule: host values every TP rank of a stage holds alike),
  and refuses decode-only, padded and foreign metadata with a reason;
- cuts a batch by cutting the common metadata at the request boundary (vLLM's own
  ``split_attn_metadata``, the one its micro-batching uses) and building each half with
  the same builder, so each half is a complete CPU attention batch (its own scheduler
  metadata, sequence lengths, block table rows and slot mapping).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
from vllm.v1.worker.ubatch_utils import UBatchSlice, split_attn_metadata

SOURCE = "dual_stream_source"  # (builder, common metadata) kept on each built CPUAttentionMetadata


def install_builder_hook(builder_cls: type = CPUAttentionMetadataBuilder) -> bool:
    """Hook ``builder_cls.build`` once; False if it already is."""
    build = builder_cls.build
    if getattr(build, "_ds_hooked", False):
        return False

    @functools.wraps(build)
    def keeping_its_source(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = build(self, common_prefix_len, common_attn_metadata, fast_build)
        setattr(metadata, SOURCE, (self, common_attn_metadata))
        return metadata

    keeping_its_source._ds_hooked = True
    builder_cls.build = keeping_its_source
    return True


class CpuAttentionSplitter:
    """``MetadataSplitter`` of ``dual_stream.gate`` for ``CPUAttentionMetadata``."""

    def query_lens(self, attn_metadata: dict[str, Any], num_input_tokens: int) -> list[int] | str:
        starts = None
        for metadata in {id(m): m for m in attn_metadata.values()}.values():
            source = getattr(metadata, SOURCE, None)
            if source is None:
                return f"{type(metadata).__name__} was not built by the CPU attention builder"
            common = source[1]
            these = [int(x) for x in common.query_start_loc_cpu[: common.num_reqs + 1].tolist()]
            if starts is not None and these != starts:
                return "attention groups disagree on the batch"
            starts = these
            if common.num_actual_tokens != num_input_tokens or these[-1] != num_input_tokens:
                return "padded batch"
        if starts is None or len(starts) < 3:
            return "fewer than two requests"
        lens = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        if max(lens) <= 1:
            return "DecodeOnly batch"
        return lens

    def split(self, attn_metadata: dict[str, Any], point: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        k, t = point.first_requests, point.first_tokens
        slices = [
            UBatchSlice(slice(0, k), slice(0, t)),
            UBatchSlice(slice(k, point.num_requests), slice(t, point.num_tokens)),
        ]
        halves_of: dict[int, tuple[Any, Any]] = {}
        first, second = {}, {}
        for name, metadata in attn_metadata.items():
            if id(metadata) not in halves_of:
                builder, common = getattr(metadata, SOURCE)
                halves_of[id(metadata)] = tuple(builder.build(0, half) for half in split_attn_metadata(slices, common))
            first[name], second[name] = halves_of[id(metadata)]
        return first, second
