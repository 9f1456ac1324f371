"""Does this batch take the dual-stream path? The decision and its split point.

Dual stream runs only when all hold: the feature is on, TP > 1, the forward is eager
(no graph captured or replayed), the attention metadata is the plain per-layer dict of
one prefill-type batch (not DecodeOnly, not SpecDecoding), no padding request or padded
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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend.dual_stream.measured import MEASURE_FLOOR
from vllm_ascend.dual_stream.split import (
    KNOWN_FIELDS,
    SplitPoint,
    choose_split,
    query_lens_from_cumulative,
    required_defaults_violated,
)

SINGLE_STREAM_STATES = frozenset({"DecodeOnly", "SpecDecoding"})


@dataclass(frozen=True)
class GateDecision:
    point: SplitPoint | None
    reason: str  # why single stream; "split" when the point is set


def _state_name(metadata: Any) -> str:
    state = getattr(metadata, "attn_state", None)
    return getattr(state, "name", str(state))


def decide(
    config: DualStreamConfig,
    attn_metadata: Any,
    num_input_tokens: int,
    tp_world_size: int,
    eager: bool,
) -> GateDecision:
    """Where to split this batch, or why it runs single-stream; host-side values only."""
    if not config.enabled:
        return GateDecision(None, "disabled")
    if tp_world_size <= 1:
        return GateDecision(None, "tensor parallel size is 1")
    if not eager:
        return GateDecision(None, "graph mode")
    if not isinstance(attn_metadata, dict) or not attn_metadata:
        return GateDecision(None, "no per-layer attention metadata (profile, dummy or speculative run)")
    reference = next(iter(attn_metadata.values()))
    cumulative = getattr(reference, "actual_seq_lengths_q", None)
    if cumulative is None or len(cumulative) < 2:
        return GateDecision(None, "fewer than two requests")
    for metadata in {id(m): m for m in attn_metadata.values()}.values():  # layers of a KV group share one
        if _state_name(metadata) in SINGLE_STREAM_STATES:
            return GateDecision(None, f"{_state_name(metadata)} batch")
        if not dataclasses.is_dataclass(metadata) or {f.name for f in dataclasses.fields(metadata)} - KNOWN_FIELDS:
            return GateDecision(None, f"{type(metadata).__name__} has fields the splitter does not know")
        field = required_defaults_violated(metadata)
        if field is not None:
            return GateDecision(None, f"metadata field {field} in use")
        if metadata is not reference and list(metadata.actual_seq_lengths_q) != list(cumulative):
            return GateDecision(None, "attention groups disagree on the batch")
    num_requests = len(cumulative)
    num_tokens = int(cumulative[-1])
    if (
        num_tokens != num_input_tokens
        or reference.num_actual_tokens != num_tokens
        or (reference.seq_lens_list is not None and len(reference.seq_lens_list) != num_requests)
        or (reference.block_tables is not None and reference.block_tables.shape[0] < num_requests)
    ):
        return GateDecision(None, "padded batch")
    length_threshold = MEASURE_FLOOR if config.length_threshold is None else config.length_threshold
    point = choose_split(
        query_lens_from_cumulative(cumulative), config.split_strategy, config.balance_threshold, length_threshold
    )
    if point is None:
        return GateDecision(None, "split refused by strategy")
    return GateDecision(point, "split")
