"""Cut a prefill batch into two micro-batches at a request boundary.

vLLM flattens a batch into one token axis: request r owns tokens
``[cu[r-1], cu[r])`` of ``hidden_states``, where ``cu`` is the cumulative query length
(``AscendMetadata.actual_seq_lengths_q``). A split point is a request index ``k``
with ``0 < k < num_requests``; micro-batch 0 holds requests ``[0, k)`` and tokens
``[0, cu[k-1])``, micro-batch 1 the rest. Cutting only at request boundaries keeps each
request's attention inside one micro-batch, so the two halves are independent batches.

Strategies (those of the Qwen3-dense dual-stream proposal, vllm-ascend PR #1699):
``half_batch`` takes ``k = num_requests // 2``; ``token_balanced`` takes the ``k`` whose
``cu[k-1]`` is closest to ``total / 2`` and refuses when
``|len1 - len2| / min(len1, len2) > balance_threshold``. Both refuse when either
micro-batch would be shorter than ``length_threshold`` tokens.

Pure torch and stdlib: no NPU import, so it runs and is tested on CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

SPLIT_STRATEGIES = ("half_batch", "token_balanced")

# AscendMetadata fields (vllm_ascend/attention/attention_v1.py at the pin) and what the
# splitter does with each. A unit test parses attention_v1.py and fails, naming the
# field, when a field is added or dropped there without a line here.
HANDLED_FIELDS = frozenset(
    {
        "num_actual_tokens",  # token count of the half
        "num_decode_tokens",  # decodes come first; recounted per half
        "num_prefills",
        "num_decodes",
        "seq_lens",  # per request: sliced
        "seq_lens_cpu",
        "seq_lens_list",
        "actual_seq_lengths_q",  # cumulative query lengths: sliced and rebased to 0
        "query_start_loc",  # [0] + cumulative, on device: sliced and rebased to 0
        "max_query_len",  # recomputed per half
        "block_tables",  # per request rows
        "slot_mapping",  # per token
    }
)
# Valid for any subset of the batch's requests, shared unchanged by both halves.
PASSTHROUGH_FIELDS = frozenset(
    {
        "attn_mask",  # a batch-independent singleton (2048x2048 compressed causal mask)
        "attn_state",  # PrefillNoCache / PrefillCacheHit / ChunkedPrefill hold for subsets
        "causal",
        "model_runner_type",
    }
)
# Features whose metadata the splitter does not cut (context parallelism, KV compression,
# layer-wise KV transfer events): the batch is refused unless they carry their default.
REQUIRED_DEFAULT_FIELDS = {
    "num_actual_tokens_pcp_padded": 0,
    "prefill": None,
    "decode_meta": None,
    "reshape_cache_event": None,
    "kvcomp_metadata": None,
}
KNOWN_FIELDS = HANDLED_FIELDS | PASSTHROUGH_FIELDS | frozenset(REQUIRED_DEFAULT_FIELDS)


@dataclass(frozen=True)
class SplitPoint:
    """Micro-batch 0 = requests ``[0, first_requests)`` = tokens ``[0, first_tokens)``."""

    first_requests: int
    first_tokens: int
    num_requests: int
    num_tokens: int

    @property
    def second_requests(self) -> int:
        return self.num_requests - self.first_requests

    @property
    def second_tokens(self) -> int:
        return self.num_tokens - self.first_tokens


def query_lens_from_cumulative(cumulative_tokens: Sequence[int]) -> list[int]:
    """Per-request query lengths from ``actual_seq_lengths_q`` (cumulative, no leading 0)."""
    lens, previous = [], 0
    for end in cumulative_tokens:
        lens.append(int(end) - previous)
        previous = int(end)
    return lens


def imbalance(first_tokens: int, second_tokens: int) -> float:
    """``|len1 - len2| / min(len1, len2)``; infinite when a half is empty."""
    shorter = min(first_tokens, second_tokens)
    if shorter <= 0:
        return float("inf")
    return abs(first_tokens - second_tokens) / shorter


def choose_split(
    query_lens_tokens: Sequence[int],
    strategy: str,
    balance_threshold: float,
    length_threshold: int,
) -> SplitPoint | None:
    """The split point for a batch with these per-request query lengths, or None to refuse."""
    num_requests = len(query_lens_tokens)
    if num_requests < 2:
        return None
    cumulative, total = [], 0
    for length in query_lens_tokens:
        total += int(length)
        cumulative.append(total)
    if strategy == "half_batch":
        first_requests = num_requests // 2
    elif strategy == "token_balanced":
        # argmin over k of |cu[k-1] - total/2|, in integers; ties go to the smaller k.
        first_requests = min(range(1, num_requests), key=lambda k: abs(2 * cumulative[k - 1] - total))
    else:
        raise ValueError(f"unknown split strategy {strategy!r}; use one of {SPLIT_STRATEGIES}")
    first_tokens = cumulative[first_requests - 1]
    second_tokens = total - first_tokens
    if min(first_tokens, second_tokens) < length_threshold:
        return None
    if strategy == "token_balanced" and imbalance(first_tokens, second_tokens) > balance_threshold:
        return None
    return SplitPoint(first_requests, first_tokens, num_requests, total)


def required_defaults_violated(metadata: Any) -> str | None:
    """Name of a field whose feature the splitter cannot cut, when it is in use."""
    for name, default in REQUIRED_DEFAULT_FIELDS.items():
        value = getattr(metadata, name, default)
        if (value is not None) if default is None else (value != default):
            return name
    return None


def _slice_rows(value: Any, start: int, stop: int) -> Any:
    return None if value is None else value[start:stop]


def split_attn_metadata(metadata: Any, point: SplitPoint) -> tuple[Any, Any]:
    """The two halves of one ``AscendMetadata`` (a dataclass; copied with ``replace``).

    Each half is a self-contained batch: its cumulative query lengths start at its first
    token, its sequence lengths, block-table rows and slot mapping belong to its requests.
    """
    k, t = point.first_requests, point.first_tokens
    n, total = point.num_requests, point.num_tokens
    cumulative = [int(c) for c in metadata.actual_seq_lengths_q[:n]]
    query_lens = query_lens_from_cumulative(cumulative)
    num_decodes = int(metadata.num_decodes)
    halves = []
    for req_lo, req_hi, tok_lo, tok_hi in ((0, k, 0, t), (k, n, t, total)):
        lens = query_lens[req_lo:req_hi]
        decodes = max(0, min(num_decodes, req_hi) - req_lo)
        qsl = metadata.query_start_loc
        if qsl is not None:
            qsl = qsl[req_lo : req_hi + 1] - qsl[req_lo : req_lo + 1]
        seq_lens = _slice_rows(metadata.seq_lens, req_lo, req_hi)
        seq_lens_cpu = seq_lens if metadata.seq_lens_cpu is metadata.seq_lens else None
        if seq_lens_cpu is None:
            seq_lens_cpu = _slice_rows(metadata.seq_lens_cpu, req_lo, req_hi)
        halves.append(
            dataclasses.replace(
                metadata,
                num_actual_tokens=tok_hi - tok_lo,
                num_decodes=decodes,
                num_decode_tokens=sum(lens[:decodes]),
                num_prefills=len(lens) - decodes,
                seq_lens=seq_lens,
                seq_lens_cpu=seq_lens_cpu,
                seq_lens_list=None
                if metadata.seq_lens_list is None
                else [int(s) for s in metadata.seq_lens_list[req_lo:req_hi]],
                actual_seq_lengths_q=[c - tok_lo for c in cumulative[req_lo:req_hi]],
                query_start_loc=qsl,
                max_query_len=max(lens),
                block_tables=_slice_rows(metadata.block_tables, req_lo, req_hi),
                slot_mapping=_slice_rows(metadata.slot_mapping, tok_lo, tok_hi),
            )
        )
    return halves[0], halves[1]


def split_metadata_by_layer(attn_metadata: dict[str, Any], point: SplitPoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-layer metadata dicts of the two micro-batches; layers sharing one object share one split."""
    split_of: dict[int, tuple[Any, Any]] = {}
    first, second = {}, {}
    for layer_name, metadata in attn_metadata.items():
        key = id(metadata)
        if key not in split_of:
            split_of[key] = split_attn_metadata(metadata, point)
        first[layer_name], second[layer_name] = split_of[key]
    return first, second


def split_tokens(tensor: torch.Tensor | None, point: SplitPoint, dim: int = 0) -> tuple[Any, Any]:
    """Token-axis halves (views) of a per-token tensor; None stays None (residual at layer 0)."""
    if tensor is None:
        return None, None
    return tensor.narrow(dim, 0, point.first_tokens), tensor.narrow(dim, point.first_tokens, point.second_tokens)
