"""Split point choice and metadata split: unit tests and properties in the domain's words."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_ascend.dual_stream.split import (
    SPLIT_STRATEGIES,
    choose_split,
    imbalance,
    query_lens_from_cumulative,
    split_attn_metadata,
    split_metadata_by_layer,
    split_tokens,
)

from dual_stream.batches import FakeAttentionState, Request, build_batch, slot_of

BLOCK_SIZE = 4


def test_half_batch_cuts_at_half_the_requests():
    point = choose_split([1, 1, 300, 500, 40], "half_batch", balance_threshold=1.0, length_threshold=1)
    assert (point.first_requests, point.first_tokens, point.second_tokens) == (2, 2, 840)


def test_token_balanced_cuts_nearest_half_the_tokens():
    point = choose_split([1, 1, 300, 500, 40], "token_balanced", balance_threshold=1.0, length_threshold=1)
    # boundaries: 1, 2, 302, 802 of 842 tokens; 302 is nearest 421
    assert (point.first_requests, point.first_tokens) == (3, 302)
    assert imbalance(302, 540) <= 1.0


def test_token_balanced_refuses_imbalance_above_threshold():
    assert choose_split([100, 300], "token_balanced", balance_threshold=1.0, length_threshold=1) is None
    assert choose_split([100, 300], "token_balanced", balance_threshold=2.0, length_threshold=1) is not None


def test_both_strategies_refuse_short_micro_batches():
    for strategy in SPLIT_STRATEGIES:
        assert choose_split([127, 500], strategy, balance_threshold=10.0, length_threshold=128) is None
        assert choose_split([128, 500], strategy, balance_threshold=10.0, length_threshold=128) is not None


def test_a_single_request_is_never_split():
    for strategy in SPLIT_STRATEGIES:
        assert choose_split([4096], strategy, balance_threshold=10.0, length_threshold=1) is None


def test_split_rebases_cumulative_lengths_and_keeps_the_shared_mask():
    requests = [Request(7, 1), Request(12, 1), Request(16, 9), Request(0, 13), Request(3, 6)]
    metadata, _ = build_batch(requests, BLOCK_SIZE, num_blocks=64)
    point = choose_split(query_lens_from_cumulative(metadata.actual_seq_lengths_q), "half_batch", 1.0, 1)
    first, second = split_attn_metadata(metadata, point)
    assert first.actual_seq_lengths_q == [1, 2]
    assert second.actual_seq_lengths_q == [9, 22, 28]
    assert second.query_start_loc.tolist() == [0, 9, 22, 28]
    assert (first.num_decodes, first.num_decode_tokens, first.num_prefills) == (2, 2, 0)
    assert (second.num_decodes, second.num_decode_tokens, second.num_prefills) == (0, 0, 3)
    assert (first.max_query_len, second.max_query_len) == (1, 13)
    assert first.attn_mask is metadata.attn_mask and second.attn_mask is metadata.attn_mask
    assert second.attn_state is FakeAttentionState.ChunkedPrefill
    assert second.seq_lens_cpu is second.seq_lens  # the builder's aliasing is kept


def test_layers_sharing_metadata_share_one_split():
    metadata, _ = build_batch([Request(0, 5), Request(0, 6)], BLOCK_SIZE, num_blocks=16)
    other, _ = build_batch([Request(0, 5), Request(0, 6)], BLOCK_SIZE, num_blocks=16, seed=1)
    point = choose_split([5, 6], "half_batch", 1.0, 1)
    first, second = split_metadata_by_layer({"l0": metadata, "l1": metadata, "l2": other}, point)
    assert first["l0"] is first["l1"] and second["l0"] is second["l1"]
    assert first["l2"] is not first["l0"]


def test_residual_none_splits_into_none():
    point = choose_split([5, 6], "half_batch", 1.0, 1)
    assert split_tokens(None, point) == (None, None)
    first, second = split_tokens(torch.arange(11), point)
    assert first.tolist() == list(range(5)) and second.tolist() == list(range(5, 11))


# ---------------------------------------------------------------- properties

decode = st.builds(Request, history_tokens=st.integers(1, 40), query_tokens=st.just(1))
prefill = st.builds(Request, history_tokens=st.integers(0, 40), query_tokens=st.integers(2, 60))
batches = st.tuples(st.lists(decode, max_size=6), st.lists(prefill, min_size=1, max_size=6)).map(
    lambda parts: parts[0] + parts[1]
)
thresholds = st.tuples(st.sampled_from(SPLIT_STRATEGIES), st.floats(0.05, 4.0), st.integers(1, 40))


@settings(max_examples=150, deadline=None)
@given(query_lens=st.lists(st.integers(1, 500), min_size=1, max_size=20), knobs=thresholds)
def test_a_split_is_at_a_request_boundary_and_honours_the_thresholds(query_lens, knobs):
    strategy, balance, length = knobs
    point = choose_split(query_lens, strategy, balance, length)
    if point is None:
        return
    assert 0 < point.first_requests < len(query_lens)
    assert point.first_tokens == sum(query_lens[: point.first_requests])
    assert point.first_tokens + point.second_tokens == sum(query_lens)
    assert min(point.first_tokens, point.second_tokens) >= length >= 1
    if strategy == "token_balanced":
        assert imbalance(point.first_tokens, point.second_tokens) <= balance


@settings(max_examples=150, deadline=None)
@given(query_lens=st.lists(st.integers(1, 500), min_size=2, max_size=20), knobs=thresholds)
def test_token_balanced_takes_the_most_even_boundary_or_refuses_for_a_reason(query_lens, knobs):
    _, balance, length = knobs
    total = sum(query_lens)
    boundaries = [sum(query_lens[:k]) for k in range(1, len(query_lens))]
    best = min(boundaries, key=lambda b: abs(2 * b - total))
    point = choose_split(query_lens, "token_balanced", balance, length)
    if point is None:
        assert min(best, total - best) < length or imbalance(best, total - best) > balance
    else:
        assert abs(2 * point.first_tokens - total) == abs(2 * best - total)


@settings(max_examples=100, deadline=None)
@given(requests=batches, knobs=thresholds, seed=st.integers(0, 3))
def test_each_half_is_a_self_consistent_batch_and_nothing_is_lost(requests, knobs, seed):
    strategy, balance, length = knobs
    metadata, positions = build_batch(requests, BLOCK_SIZE, num_blocks=256, seed=seed)
    point = choose_split(query_lens_from_cumulative(metadata.actual_seq_lengths_q), strategy, balance, length)
    if point is None:
        return
    halves = split_attn_metadata(metadata, point)
    request_ranges = [(0, point.first_requests), (point.first_requests, len(requests))]
    token_ranges = [(0, point.first_tokens), (point.first_tokens, metadata.num_actual_tokens)]
    for half, (req_lo, req_hi), (tok_lo, tok_hi) in zip(halves, request_ranges, token_ranges, strict=True):
        own = requests[req_lo:req_hi]
        assert half.num_actual_tokens == tok_hi - tok_lo == sum(r.query_tokens for r in own)
        assert half.query_start_loc[0] == 0 and half.query_start_loc[-1] == half.num_actual_tokens
        assert half.actual_seq_lengths_q == half.query_start_loc[1:].tolist()
        assert query_lens_from_cumulative(half.actual_seq_lengths_q) == [r.query_tokens for r in own]
        assert half.seq_lens_list == [r.history_tokens + r.query_tokens for r in own] == half.seq_lens.tolist()
        assert half.block_tables.shape[0] == len(own)
        assert half.max_query_len == max(r.query_tokens for r in own)
        assert half.num_decodes + half.num_prefills == len(own)
        assert half.num_decode_tokens == sum(r.query_tokens for r in own[: half.num_decodes])
        assert all(r.query_tokens == 1 for r in own[: half.num_decodes])
        # every slot of the half is one of its own requests' positions, through its own block table
        expected_slots = [
            slot_of(half.block_tables, i, p, BLOCK_SIZE)
            for i, r in enumerate(own)
            for p in range(r.history_tokens, r.history_tokens + r.query_tokens)
        ]
        assert half.slot_mapping.tolist() == expected_slots
        assert positions[tok_lo:tok_hi].tolist() == [
            p for r in own for p in range(r.history_tokens, r.history_tokens + r.query_tokens)
        ]
    first, second = halves
    assert first.num_decodes + second.num_decodes == metadata.num_decodes
    assert first.num_decode_tokens + second.num_decode_tokens == metadata.num_decode_tokens
    assert torch.equal(torch.cat([first.slot_mapping, second.slot_mapping]), metadata.slot_mapping)
    assert torch.equal(torch.cat([first.block_tables, second.block_tables]), metadata.block_tables)
