"""Does this batch take the dual-stream path? The decision and its split point.

Dual stream runs only when all hold: the feature is on, TP > 1, the forward is eager
(no graph captured or replayed), the attention metadata is the plain per-layer dict of
one prefill-type batch (not DecodeOnly, not SpecDecoding; with speculative decoding, not
a batch of verifications alone, which vllm-ascend labels ChunkedPrefill for every method
but MTP: no request schedules more than ``decode_tokens``), no padding request or padded
token, no context-parallel / KV-compression metadata, and the split strategy accepts a
split point. With ``length_threshold`` unset, that split must leave ``MEASURE_FLOOR``
tokens in each micro-batch, and the measured gate (``measured``) decides on the rest.

Every input is the same on every TP rank (the config, the TP size, the graph mode, and
metadata built from the one scheduler output every rank receives; host-side lists and
counts only, never device values), so all ranks take the same path. A rank that went
dual-stream while another did not would issue collectives of other sizes: a hang.

``decide`` runs no tensor operation at all (no device work, no allocation): a fault in
it is a fault of the same inputs on every rank, so the model may fall back to single
stream on it and all ranks fall back together. Cutting the metadata in two
(``split.split_metadata_by_layer``) slices device tensors and happens after the decision.

The attention metadata is read through a ``MetadataSplitter``: ``AscendMetadataSplitter``
(vllm-ascend's ``AscendMetadata``) is what the package serves with; the model takes
another one for another attention backend (the CPU engine's tests supply theirs). Under
pipeline parallelism each stage decides on its own batch metadata, which is the same on
every TP rank of the stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend.dual_stream.measured import MEASURE_FLOOR
from vllm_ascend.dual_stream.split import (
    KNOWN_FIELDS,
    SplitPoint,
    choose_split,
    query_lens_from_cumulative,
    required_defaults_violated,
    split_metadata_by_layer,
)

SINGLE_STREAM_STATES = frozenset({"DecodeOnly", "SpecDecoding"})
PADDED = "padded batch"


@dataclass(frozen=True)
class GateDecision:
    point: SplitPoint | None
    reason: str  # why single stream; "split" when the point is set


def _state_name(metadata: Any) -> str:
    state = getattr(metadata, "attn_state", None)
    return getattr(state, "name", str(state))


class MetadataSplitter(Protocol):
    """How a backend's per-layer attention metadata is read (request lengths) and cut in two.

    ``query_lens`` is host-side only (no tensor operation): the gate's fault rule depends
    on it. ``split`` runs after the decision and may slice device tensors.
    """

    def query_lens(self, attn_metadata: dict[str, Any], num_input_tokens: int) -> list[int] | str:
        """Per-request query lengths of a batch the splitter can cut, or why it cannot."""
        ...

    def split(self, attn_metadata: dict[str, Any], point: SplitPoint) -> tuple[dict[str, Any], dict[str, Any]]:
        """The per-layer metadata of the two micro-batches."""
        ...


class AscendMetadataSplitter:
    """vllm-ascend's ``AscendMetadata`` (``split.py`` lists the fields and what is done to each)."""

    def query_lens(self, attn_metadata: dict[str, Any], num_input_tokens: int) -> list[int] | str:
        reference = next(iter(attn_metadata.values()))
        cumulative = getattr(reference, "actual_seq_lengths_q", None)
        if cumulative is None or len(cumulative) < 2:
            return "fewer than two requests"
        for metadata in {id(m): m for m in attn_metadata.values()}.values():  # layers of a KV group share one
            if _state_name(metadata) in SINGLE_STREAM_STATES:
                return f"{_state_name(metadata)} batch"
            if not dataclasses.is_dataclass(metadata) or {f.name for f in dataclasses.fields(metadata)} - KNOWN_FIELDS:
                return f"{type(metadata).__name__} has fields the splitter does not know"
            field = required_defaults_violated(metadata)
            if field is not None:
                return f"metadata field {field} in use"
            if metadata is not reference and list(metadata.actual_seq_lengths_q) != list(cumulative):
                return "attention groups disagree on the batch"
        num_requests = len(cumulative)
        num_tokens = int(cumulative[-1])
        if (
            num_tokens != num_input_tokens
            or reference.num_actual_tokens != num_tokens
            or (reference.seq_lens_list is not None and len(reference.seq_lens_list) != num_requests)
            or (reference.block_tables is not None and reference.block_tables.shape[0] < num_requests)
        ):
            return PADDED
        return query_lens_from_cumulative(cumulative)

    def split(self, attn_metadata: dict[str, Any], point: SplitPoint) -> tuple[dict[str, Any], dict[str, Any]]:
        return split_metadata_by_layer(attn_metadata, point)


ASCEND_METADATA = AscendMetadataSplitter()


def decide(
    config: DualStreamConfig,
    attn_metadata: Any,
    num_input_tokens: int,
    tp_world_size: int,
    eager: bool,
    splitter: MetadataSplitter = ASCEND_METADATA,
    decode_tokens: int = 1,
) -> GateDecision:
    """Where to split this batch, or why it runs single-stream; host-side values only.

    ``decode_tokens``: the most tokens a decoding request schedules in one step (1 plus the
    speculative tokens it verifies)."""
    if not config.enabled:
        return GateDecision(None, "disabled")
    if tp_world_size <= 1:
        return GateDecision(None, "tensor parallel size is 1")
    if not eager:
        return GateDecision(None, "graph mode")
    if not isinstance(attn_metadata, dict) or not attn_metadata:
        return GateDecision(None, "no per-layer attention metadata (profile, dummy or speculative run)")
    query_lens = splitter.query_lens(attn_metadata, num_input_tokens)
    if isinstance(query_lens, str):
        return GateDecision(None, query_lens)
    if max(query_lens, default=0) <= decode_tokens:
        return GateDecision(None, "decodes only (speculative verification)")
    length_threshold = MEASURE_FLOOR if config.length_threshold is None else config.length_threshold
    point = choose_split(query_lens, config.split_strategy, config.balance_threshold, length_threshold)
    if point is None:
        return GateDecision(None, "split refused by strategy")
    return GateDecision(point, "split")
