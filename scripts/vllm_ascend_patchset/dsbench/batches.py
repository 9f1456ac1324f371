"""Batches as vllm-ascend's attention builder lays them out, for the CPU tests and the dual-stream bench.

``FakeAscendMetadata`` has exactly the fields of ``AscendMetadata`` at the pin
(tests/dual_stream/test_metadata_contract.py checks that against the pinned source); ``build_batch`` fills
it the way ``AscendAttentionMetadataBuilder.build`` does: decodes first, cumulative query
lengths without a leading 0, per-request sequence lengths (history + query) and block
tables, one slot per scheduled token.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any

import torch


class FakeAttentionState(enum.Enum):  # the names of AscendAttentionState at the pin
    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4


@dataclass
class FakeAscendMetadata:
    attn_mask: torch.Tensor | None = None
    attn_state: Any = FakeAttentionState.ChunkedPrefill
    num_actual_tokens_pcp_padded: int = 0
    num_actual_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
    seq_lens: torch.Tensor = None
    seq_lens_cpu: torch.Tensor = None
    seq_lens_list: list[int] = None
    actual_seq_lengths_q: list[int] = None
    query_start_loc: torch.Tensor = None
    max_query_len: int | None = None
    block_tables: torch.Tensor = None
    slot_mapping: torch.Tensor = None
    prefill: Any = None
    decode_meta: Any = None
    causal: bool = True
    model_runner_type: str = ""
    reshape_cache_event: Any = None
    kvcomp_metadata: Any = None


@dataclass(frozen=True)
class Request:
    history_tokens: int  # already in the KV cache
    query_tokens: int  # scheduled in this batch


SHARED_MASK = torch.triu(torch.ones(2048, 2048), diagonal=1).to(torch.int8)


def slot_of(block_tables: torch.Tensor, request: int, position: int, block_size: int) -> int:
    return int(block_tables[request, position // block_size]) * block_size + position % block_size


def build_batch(
    requests: list[Request], block_size: int, num_blocks: int, seed: int = 0, state: Any = None
) -> tuple[FakeAscendMetadata, torch.Tensor]:
    """Metadata and positions of a batch; decodes (query of one token) must come first."""
    rng = random.Random(seed)
    blocks_needed = [-(-(r.history_tokens + r.query_tokens) // block_size) for r in requests]
    pool = list(range(1, num_blocks))  # block 0 is the padding block
    rng.shuffle(pool)
    assert sum(blocks_needed) <= len(pool), "not enough KV blocks for this batch"
    width = max(blocks_needed)
    block_tables = torch.zeros(len(requests), width, dtype=torch.int32)
    for i, n in enumerate(blocks_needed):
        block_tables[i, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    positions, slots, cumulative, total = [], [], [], 0
    for i, r in enumerate(requests):  # slot_of for every token of the request, at once
        request_positions = torch.arange(r.history_tokens, r.history_tokens + r.query_tokens)
        positions.append(request_positions)
        blocks = block_tables[i, request_positions // block_size].long()
        slots.append(blocks * block_size + request_positions % block_size)
        total += r.query_tokens
        cumulative.append(total)
    num_decodes = 0
    while num_decodes < len(requests) and requests[num_decodes].query_tokens == 1:
        num_decodes += 1
    if state is None:
        if all(r.history_tokens == 0 for r in requests):
            state = FakeAttentionState.PrefillNoCache
        elif all(r.query_tokens == 1 for r in requests):
            state = FakeAttentionState.DecodeOnly
        else:
            state = FakeAttentionState.ChunkedPrefill
    seq_lens = torch.tensor([r.history_tokens + r.query_tokens for r in requests], dtype=torch.int32)
    metadata = FakeAscendMetadata(
        attn_mask=SHARED_MASK,
        attn_state=state,
        num_actual_tokens=total,
        num_decode_tokens=num_decodes,
        num_prefills=len(requests) - num_decodes,
        num_decodes=num_decodes,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens,
        seq_lens_list=seq_lens.tolist(),
        actual_seq_lengths_q=cumulative,
        query_start_loc=torch.tensor([0, *cumulative], dtype=torch.int32),
        max_query_len=max(r.query_tokens for r in requests),
        block_tables=block_tables,
        slot_mapping=torch.cat(slots),
        model_runner_type="generate",
    )
    return metadata, torch.cat(positions)
