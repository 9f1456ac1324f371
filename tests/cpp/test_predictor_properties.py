"""ChunkSizePredictor: the chunk rule, stated as properties in the scheduler's words."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm_ascend.core.profiling_chunk_predictor import ChunkSizePredictor, LatencyModel

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def latency_models(draw):
    c3 = draw(st.sampled_from([0.0, 1e-8, 1e-7, 1e-6, 1e-5]))
    c4 = draw(st.sampled_from([0.0, 1e-9, 1e-8, 1e-7, 1e-6]))
    assume(c3 + c4 > 0)
    return LatencyModel(
        c0_ms=draw(st.floats(0.0, 50.0)),
        c1_ms=draw(st.floats(1e-4, 0.2)),
        c2_ms=draw(st.sampled_from([0.0, 1e-5, 1e-4, 1e-3])),
        c3_ms=c3,
        c4_ms=c4,
    )


@st.composite
def predictors(draw, smooth_factor=None):
    page_size = draw(st.sampled_from([16, 48, 64, 128, 256]))
    align = page_size * -(-64 // page_size)
    base_chunk_size = align * draw(st.integers(1, 16384 // align))
    max_num_scheduled_tokens = draw(st.integers(base_chunk_size, 2 * base_chunk_size + 777))
    return ChunkSizePredictor(
        draw(latency_models()),
        base_chunk_size=base_chunk_size,
        page_size=page_size,
        max_model_len=draw(st.integers(base_chunk_size, 1_000_000)),
        max_num_scheduled_tokens=max_num_scheduled_tokens,
        smooth_factor=draw(st.floats(0.05, 1.0)) if smooth_factor is None else smooth_factor,
        min_chunk=draw(st.none() | st.integers(0, base_chunk_size)),
        tail_tolerance=draw(st.sampled_from([0.0, 0.15, 0.5])),
    )


def request_positions(draw, predictor):
    history_tokens = draw(st.integers(0, predictor.max_model_len - 1))
    remaining_tokens = draw(st.integers(1, predictor.max_model_len - history_tokens))
    return history_tokens, remaining_tokens


def floor_forces_more(predictor, history_tokens):
    return predictor.time_ms(predictor.floor_tokens, history_tokens) > predictor.tail_limit_ms


@PROPERTY_SETTINGS
@given(st.data())
def test_chunks_are_page_multiples_unless_they_are_the_final_tail(data):
    predictor = data.draw(predictors())
    history_tokens, remaining_tokens = request_positions(data.draw, predictor)
    chunk_tokens = predictor.next_chunk(history_tokens, remaining_tokens)
    assert chunk_tokens == remaining_tokens or chunk_tokens % predictor.page_size == 0


@PROPERTY_SETTINGS
@given(st.data())
def test_chunks_lie_within_their_floor_and_caps(data):
    predictor = data.draw(predictors())
    history_tokens, remaining_tokens = request_positions(data.draw, predictor)
    chunk_tokens = predictor.next_chunk(history_tokens, remaining_tokens)
    context_left = predictor.max_model_len - history_tokens
    assert 0 < chunk_tokens <= min(remaining_tokens, predictor.max_num_scheduled_tokens, context_left)
    aligned_caps = min(predictor.scheduled_cap_tokens, context_left // predictor.align * predictor.align)
    assert chunk_tokens >= min(predictor.floor_tokens, remaining_tokens, aligned_caps)


@PROPERTY_SETTINGS
@given(st.data())
def test_chunks_never_grow_as_history_grows(data):
    predictor = data.draw(predictors())
    shorter = data.draw(st.integers(0, predictor.max_model_len - 1))
    longer = data.draw(st.integers(shorter, predictor.max_model_len - 1))
    remaining_tokens = data.draw(st.integers(1, predictor.max_model_len - longer))
    assert predictor.next_chunk(longer, remaining_tokens) <= predictor.next_chunk(shorter, remaining_tokens)


@PROPERTY_SETTINGS
@given(st.data())
def test_predicted_time_stays_within_the_target_unless_the_floor_forces_more(data):
    predictor = data.draw(predictors(smooth_factor=1.0))
    history_tokens, remaining_tokens = request_positions(data.draw, predictor)
    assume(not floor_forces_more(predictor, history_tokens))
    chunk_tokens = predictor.next_chunk(history_tokens, remaining_tokens)
    assert predictor.time_ms(chunk_tokens, history_tokens) <= predictor.tail_limit_ms * (1 + 1e-12)


@PROPERTY_SETTINGS
@given(st.data())
def test_smoothing_only_moves_chunks_toward_the_base_chunk(data):
    sharp = data.draw(predictors(smooth_factor=1.0))
    smooth_factor = data.draw(st.floats(0.05, 1.0))
    smooth = ChunkSizePredictor(
        sharp.model,
        base_chunk_size=sharp.base_chunk_size,
        page_size=sharp.page_size,
        max_model_len=sharp.max_model_len,
        max_num_scheduled_tokens=sharp.max_num_scheduled_tokens,
        smooth_factor=smooth_factor,
        min_chunk=sharp.min_chunk,
        tail_tolerance=sharp.tail_tolerance,
    )
    history_tokens, remaining_tokens = request_positions(data.draw, sharp)
    sharp_chunk = sharp.next_chunk(history_tokens, remaining_tokens)
    smooth_chunk = smooth.next_chunk(history_tokens, remaining_tokens)
    assert sharp_chunk <= smooth_chunk <= max(sharp_chunk, sharp.base_chunk_size, smooth.floor_tokens)


@PROPERTY_SETTINGS
@given(st.data())
def test_every_chunk_of_a_whole_prefill_keeps_to_the_rule(data):
    predictor = data.draw(predictors(smooth_factor=1.0))
    prompt_tokens = data.draw(st.integers(1, min(predictor.max_model_len, 300_000)))
    history_tokens = 0
    chunks = []
    while history_tokens < prompt_tokens:
        chunk_tokens = predictor.next_chunk(history_tokens, prompt_tokens - history_tokens)
        assert chunk_tokens > 0
        if not floor_forces_more(predictor, history_tokens):
            assert predictor.time_ms(chunk_tokens, history_tokens) <= predictor.tail_limit_ms * (1 + 1e-12)
        chunks.append(chunk_tokens)
        history_tokens += chunk_tokens
    assert history_tokens == prompt_tokens
    assert all(c % predictor.page_size == 0 for c in chunks[:-1])
    assert chunks[:-1] == sorted(chunks[:-1], reverse=True)  # only the last chunk may be a merged tail


@PROPERTY_SETTINGS
@given(st.data())
def test_max_chunk_within_is_the_largest_chunk_that_fits_the_budget(data):
    predictor = data.draw(predictors())
    history_tokens, remaining_tokens = request_positions(data.draw, predictor)
    budget_ms = data.draw(st.floats(0.0, 3 * predictor.target_ms))
    chunk_tokens = predictor.max_chunk_within(history_tokens, budget_ms, remaining_tokens)
    limit = min(remaining_tokens, predictor.max_num_scheduled_tokens, predictor.max_model_len - history_tokens)
    assert 0 <= chunk_tokens <= limit
    assert chunk_tokens == remaining_tokens or chunk_tokens % predictor.align == 0
    if chunk_tokens > 0:
        assert predictor.request_ms(chunk_tokens, history_tokens) <= budget_ms * (1 + 1e-9)
    bigger = chunk_tokens // predictor.align * predictor.align + predictor.align
    if bigger <= limit:
        assert predictor.request_ms(bigger, history_tokens) > budget_ms * (1 - 1e-9)


MODEL = LatencyModel(c0_ms=5.0, c1_ms=0.02, c2_ms=0.0, c3_ms=1e-6, c4_ms=2e-6)


def make(**overrides):
    kwargs = dict(
        base_chunk_size=4096, page_size=128, max_model_len=262_144, max_num_scheduled_tokens=8192, min_chunk=512
    )
    kwargs.update(overrides)
    return ChunkSizePredictor(MODEL, **kwargs)


def test_target_is_the_base_chunk_without_history():
    predictor = make()
    assert predictor.target_ms == MODEL.time_ms(4096, 0)
    assert predictor.next_chunk(0, 100_000) == 4096


def test_chunks_round_down_and_shrink_with_history():
    predictor = make()
    raw_tokens = MODEL.chunk_for_time(20_000, predictor.target_ms)
    assert predictor.next_chunk(20_000, 100_000) == int(raw_tokens // 128) * 128


def test_blend_formula_is_base_plus_s_times_raw_minus_base():
    predictor = make(smooth_factor=0.5)
    raw_tokens = MODEL.chunk_for_time(20_000, predictor.target_ms)
    expected = int((4096 + 0.5 * (raw_tokens - 4096)) // 128) * 128
    assert predictor.next_chunk(20_000, 100_000) == expected


def test_floor_and_caps():
    assert make(min_chunk=2000).next_chunk(200_000, 60_000) == 1920  # floor rounded down to the page
    assert make(min_chunk=None).floor_tokens == 1024  # base // 4
    assert make(max_model_len=20_100).next_chunk(20_000, 50) == 50
    assert make(max_num_scheduled_tokens=1000, base_chunk_size=512).next_chunk(0, 10_000) == 512
    assert make(page_size=16).align == 64 and make(page_size=48).align == 96


def test_tail_merge_takes_a_small_tail_now_when_it_stays_within_tolerance():
    predictor = make(min_chunk=256)
    chunk_tokens = predictor.next_chunk(0, 100_000)
    assert chunk_tokens == 4096
    assert predictor.next_chunk(0, 4096 + 300) == 4396  # 300 left < 4096/4, 4396 tokens within +15%
    assert MODEL.time_ms(4396, 0) <= 1.15 * predictor.target_ms
    assert predictor.next_chunk(0, 4096 + 1100) == 4096  # 1100 left is not a small tail
    strict = make(min_chunk=256, tail_tolerance=0.0)
    assert strict.next_chunk(0, 4096 + 300) == 4096  # no room for the tail


def test_bad_config_names_the_key():
    for key, value in [("smooth_factor", 0.0), ("smooth_factor", 1.5), ("page_size", 0), ("tail_tolerance", -1)]:
        with pytest.raises(ValueError, match=key):
            make(**{key: value})
    with pytest.raises(ValueError, match="max_num_scheduled_tokens"):
        make(max_num_scheduled_tokens=32)


def test_a_fresh_prompt_gets_exactly_the_base_chunk():
    """The target is defined as the base chunk's time, so its own root must not lose an aligned unit."""
    from vllm_ascend.core.profiling_chunk_predictor import ChunkSizePredictor, LatencyModel

    for coefficients in [
        (5.0, 0.01, 0.0, 3e-6, 6e-6),
        (1.3, 0.0371, 1e-5, 7.7e-7, 2.9e-6),
        (0.0, 0.02, 0.0, 1e-7, 0.0),
    ]:
        model = LatencyModel(*coefficients)
        for base in (512, 2048, 8192, 65536):
            predictor = ChunkSizePredictor(
                model, base_chunk_size=base, page_size=128, max_model_len=10**6, max_num_scheduled_tokens=base
            )
            assert predictor.next_chunk(0, 10 * base) == base
