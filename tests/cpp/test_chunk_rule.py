"""ChunkRule and StepBudget: the chunk rule and the per-step budget, stated as properties in the scheduler's words.

Models are drawn over every coefficient set ``accept`` can return (finite, >= 0,
c3 + c4 > 0, including zero terms), limits over vLLM's settings.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from cpp_samples import TRUE
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, StepBudget, whole_tokens
from vllm_ascend.core.cpp_latency_model import LatencyModel

PROPERTIES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NPU_LIKE = LatencyModel(c0_ms=30.0, c1_ms=0.01, c2_ms=1e-4, c3_ms=5e-7, c4_ms=2e-7)  # fixed cost dominates
CPU_LIKE = LatencyModel(c0_ms=0.5, c1_ms=0.05, c2_ms=0.0, c3_ms=1e-5, c4_ms=1.5e-5)  # attention dominates
MIDDLE = TRUE  # history reads visible: C*(H) grows with H
LIMITS = ChunkLimits(max_chunk_tokens=8192, max_model_len=262_144)


def log_uniform(low_exponent: float, high_exponent: float, zero: bool = True):
    values = st.floats(low_exponent, high_exponent).map(lambda exponent: 10.0**exponent)
    return (st.just(0.0) | values) if zero else values


# Built once: hypothesis strategies are costly to build per draw.
C0_MS, C1_MS, C2_MS = log_uniform(-2, 3), log_uniform(-5, 0), log_uniform(-7, -2)
POSITIVE_C0_MS, CHEAPEST_TOKENS = log_uniform(-2, 3, zero=False), log_uniform(1.2, 4.5, zero=False)
C3_MS, C4_MS, POSITIVE_C3_MS = log_uniform(-10, -4), log_uniform(-10, -4), log_uniform(-10, -4, zero=False)
SMOOTH_FACTORS, TAIL_TOLERANCES = st.floats(0.05, 1.0), st.sampled_from([0.0, 0.15, 0.5])
MAX_BATCH_MS = st.none() | log_uniform(-1, 4, zero=False)
TARGET_EXPONENTS = st.floats(-0.3, 1.2)  # position of a target in (or a little outside) the planner's range


@st.composite
def latency_models(draw, c2=None, cheapest_in_range=False):
    """``cheapest_in_range``: c0 > 0 and C*(0) = sqrt(c0 / c3) between 16 and 32768 tokens, where it binds."""
    c0 = draw(POSITIVE_C0_MS if cheapest_in_range else C0_MS)
    c4 = draw(C4_MS)
    if cheapest_in_range:
        c3 = c0 / draw(CHEAPEST_TOKENS) ** 2
    else:
        c3 = draw(C3_MS if c4 > 0 else POSITIVE_C3_MS)  # c3 + c4 > 0
    return LatencyModel(c0, draw(C1_MS), draw(C2_MS) if c2 is None else c2, c3, c4)


@st.composite
def rules(draw, smooth_factor=None, c2=None, tail_tolerance=None, max_batch_ms=False, cheapest_in_range=False):
    max_chunk_tokens = draw(st.integers(1, 32_768))
    limits = ChunkLimits(
        max_chunk_tokens=max_chunk_tokens,
        max_model_len=draw(st.integers(1, 1_000_000)),
        min_chunk_tokens=draw(st.integers(0, max_chunk_tokens)),
        smooth_factor=draw(SMOOTH_FACTORS) if smooth_factor is None else smooth_factor,
        tail_tolerance=draw(TAIL_TOLERANCES) if tail_tolerance is None else tail_tolerance,
        max_batch_ms=draw(MAX_BATCH_MS) if max_batch_ms else None,
    )
    model = draw(latency_models(c2=c2, cheapest_in_range=cheapest_in_range))
    return ChunkRule(model, limits, draw(st.integers(1, 16)))


def draw_position(draw, max_model_len):
    """(history_tokens, remaining_tokens) of a request that fits max_model_len."""
    history_tokens = draw(st.integers(0, max_model_len - 1))
    return history_tokens, draw(st.integers(1, max_model_len - history_tokens))


def floor_forces_more(rule, history_tokens, target_ms):
    """The floor chunk alone is over the target: the rule grants it anyway (progress beats the target)."""
    return rule.model.time_ms(rule.limits.floor_tokens, history_tokens) > target_ms


# ---------------------------------------------------------------- one request's chunk
@st.composite
def requests(draw, **rule_options):
    """A rule, a request position that fits max_model_len, and a target around the planner's range."""
    rule = draw(rules(**rule_options))
    history_tokens, remaining_tokens = draw_position(draw, rule.limits.max_model_len)
    low, high = rule.target_bounds([(history_tokens, remaining_tokens)], rule.model.c0_ms)
    target_ms = low * (high / low) ** draw(TARGET_EXPONENTS)
    return rule, history_tokens, remaining_tokens, target_ms


@PROPERTIES
@given(requests())
def test_chunks_stay_within_the_token_budget_and_the_context(request_case):
    rule, history_tokens, remaining_tokens, target_ms = request_case
    chunk_tokens = rule.wanted_chunk(history_tokens, remaining_tokens, target_ms)
    assert 0 < chunk_tokens <= min(remaining_tokens, rule.limits.max_chunk_tokens)
    assert history_tokens + chunk_tokens <= rule.limits.max_model_len


@PROPERTIES
@given(requests(smooth_factor=1.0, cheapest_in_range=True), st.floats(0.25, 4.0), st.booleans())
def test_a_chunk_is_never_larger_than_the_cheapest_per_token_unless_tail_or_floor(request_case, share, low_floor):
    """Beyond C*(H) = sqrt((c0 + c2*H) / c3) every token costs more: the rule never goes there.

    Targets around the time of C*(H) itself, so that C* binds in about half the cases.
    """
    rule, history_tokens, remaining_tokens, _ = request_case
    if low_floor:
        rule = rule.with_limits(min_chunk_tokens=0)
    efficient_tokens = rule.efficient_tokens(history_tokens)
    target_ms = rule.model.time_ms(share * efficient_tokens, history_tokens)
    chunk_tokens = rule.wanted_chunk(history_tokens, remaining_tokens, target_ms)
    assert chunk_tokens == remaining_tokens or chunk_tokens <= max(
        whole_tokens(efficient_tokens), rule.limits.floor_tokens
    )


@PROPERTIES
@given(requests(smooth_factor=1.0), SMOOTH_FACTORS)
def test_smoothing_only_moves_chunks_towards_the_token_budget(request_case, smooth_factor):
    rule, history_tokens, remaining_tokens, target_ms = request_case
    sharp = rule.wanted_chunk(history_tokens, remaining_tokens, target_ms)
    smooth = rule.with_limits(smooth_factor=smooth_factor).wanted_chunk(history_tokens, remaining_tokens, target_ms)
    assert sharp <= smooth <= max(sharp, rule.limits.max_chunk_tokens)


@PROPERTIES
@given(requests(), st.floats(0.0, 3.0))
def test_chunk_within_is_the_largest_chunk_that_fits_a_budget(request_case, budget_share):
    rule, history_tokens, remaining_tokens, target_ms = request_case
    budget_ms = budget_share * target_ms
    chunk_tokens = rule.chunk_within(history_tokens, budget_ms, remaining_tokens)
    limit = min(remaining_tokens, rule.limits.max_chunk_tokens, rule.limits.max_model_len - history_tokens)
    assert 0 <= chunk_tokens <= limit
    if chunk_tokens > 0:
        assert rule.model.request_ms(chunk_tokens, history_tokens) <= budget_ms * (1 + 1e-9)
    bigger = chunk_tokens + 1
    if bigger <= limit and budget_ms > 0:  # (no budget: no chunk, even a free one)
        assert rule.model.request_ms(bigger, history_tokens) > budget_ms * (1 - 1e-9)


@PROPERTIES
@given(requests(c2=0.0), st.data())
def test_chunks_never_grow_as_history_grows_without_a_history_read_cost(request_case, data):
    rule, history_tokens, remaining_tokens, target_ms = request_case
    assume(history_tokens + remaining_tokens < rule.limits.max_model_len)
    longer = data.draw(st.integers(history_tokens + 1, rule.limits.max_model_len - remaining_tokens))
    shorter_chunk = rule.wanted_chunk(history_tokens, remaining_tokens, target_ms)
    assert rule.wanted_chunk(longer, remaining_tokens, target_ms) <= shorter_chunk


def test_with_a_history_read_cost_chunks_grow_until_the_target_binds_then_shrink():
    """Each chunk re-reads the history (c2*H), so the cheapest chunk grows with H until the target caps it."""
    rule = ChunkRule(MIDDLE, LIMITS, num_stages=4)
    target_ms = MIDDLE.time_ms(8192, 0)
    histories = range(0, 200_000, 4096)
    chunks = [rule.wanted_chunk(history, 60_000, target_ms) for history in histories]
    cheapest = [min(rule.efficient_tokens(h), MIDDLE.chunk_for_time(h, target_ms)) for h in histories]
    floor = LIMITS.floor_tokens
    assert chunks == [max(floor, min(int(c + 1e-9), LIMITS.max_chunk_tokens)) for c in cheapest]
    peak = chunks.index(max(chunks))
    assert 0 < peak < len(chunks) - 1  # grows, then shrinks
    assert chunks[: peak + 1] == sorted(chunks[: peak + 1]) and chunks[peak:] == sorted(chunks[peak:], reverse=True)
    assert all(
        MIDDLE.time_ms(c, h) <= target_ms * (1 + 1e-9) for c, h in zip(chunks, histories, strict=True) if c > floor
    )


@PROPERTIES
@given(st.data())
def test_every_chunk_of_a_whole_prefill_keeps_to_the_rule(data):
    """A prompt alone in its batches, step after step: chunks within the target, then its tail."""
    rule, _, _, target_ms = data.draw(requests(smooth_factor=1.0, tail_tolerance=0.0))
    prompt_tokens = data.draw(st.integers(1, min(rule.limits.max_model_len, 200_000)))
    history_tokens, chunks = 0, []
    while history_tokens < prompt_tokens and len(chunks) < 2000:
        chunk_tokens = StepBudget(rule, target_ms).grant(history_tokens, prompt_tokens - history_tokens, 10**9)
        assert chunk_tokens > 0
        if not floor_forces_more(rule, history_tokens, target_ms):
            assert rule.model.time_ms(chunk_tokens, history_tokens) <= target_ms * (1 + 1e-9)
        chunks.append(chunk_tokens)
        history_tokens += chunk_tokens
    assume(history_tokens == prompt_tokens)  # (a prompt of over 2000 chunks is not followed to its end)
    assert sum(chunks) == prompt_tokens


# ---------------------------------------------------------------- one step's budget
@st.composite
def steps(draw, **rule_options):
    """A rule, a target, running decodes (new_tokens, history) and prefills (history, remaining, allowed)."""
    rule, _, _, target_ms = draw(requests(**rule_options))
    max_model_len = rule.limits.max_model_len
    decodes = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(0, max_model_len - 1)), max_size=12))
    prefills = []
    for _ in range(draw(st.integers(1, 5))):
        history_tokens, remaining_tokens = draw_position(draw, max_model_len)
        allowed_tokens = draw(st.integers(0, 2 * rule.limits.max_chunk_tokens))
        prefills.append((history_tokens, remaining_tokens, allowed_tokens))
    return rule, target_ms, decodes, prefills


def run_step(rule, target_ms, decodes, prefills):
    """What the scheduler does in one step: reserve decodes, then grant and charge each prefill in order."""
    budget = StepBudget(rule, target_ms)
    budget.reserve_decodes((f"decode-{index}", n, h) for index, (n, h) in enumerate(decodes))
    granted = []
    for index, (history_tokens, remaining_tokens, allowed_tokens) in enumerate(prefills):
        used_before_ms = budget.used_ms
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, allowed_tokens)
        if chunk_tokens > 0:
            budget.charge(f"prefill-{index}", chunk_tokens, history_tokens)
        granted.append((chunk_tokens, used_before_ms, budget.used_ms))
    for index, (new_tokens, history_tokens) in enumerate(decodes):
        budget.charge(f"decode-{index}", new_tokens, history_tokens)
    return budget, granted


@PROPERTIES
@given(steps())
def test_a_grant_never_exceeds_what_vllm_allows_nor_the_context(step):
    rule, target_ms, decodes, prefills = step
    _, granted = run_step(rule, target_ms, decodes, prefills)
    for (chunk_tokens, _, _), (history_tokens, remaining_tokens, allowed_tokens) in zip(granted, prefills, strict=True):
        assert 0 <= chunk_tokens <= min(allowed_tokens, remaining_tokens, rule.limits.max_chunk_tokens)
        assert history_tokens + chunk_tokens <= rule.limits.max_model_len


@PROPERTIES
@given(steps(smooth_factor=1.0, tail_tolerance=0.0))
def test_prefills_keep_the_batch_within_the_target_unless_the_floor_forces_the_first_one(step):
    rule, target_ms, decodes, prefills = step
    _, granted = run_step(rule, target_ms, decodes, prefills)
    first = True
    for chunk_tokens, used_before_ms, used_after_ms in granted:
        if chunk_tokens == 0:
            continue
        if used_after_ms > target_ms * (1 + 1e-9):
            assert first and chunk_tokens <= rule.limits.floor_tokens, (chunk_tokens, used_before_ms, used_after_ms)
        first = False


@PROPERTIES
@given(steps())
def test_the_steps_first_prefill_advances_by_at_least_the_floor_even_behind_decodes(step):
    rule, target_ms, decodes, prefills = step
    _, granted = run_step(rule, target_ms, decodes, prefills)
    history_tokens, remaining_tokens, allowed_tokens = prefills[0]
    context_tokens = whole_tokens(rule.limits.max_model_len - history_tokens)
    least = min(rule.limits.floor_tokens, remaining_tokens, allowed_tokens, rule.limits.cap_tokens, context_tokens)
    assert granted[0][0] >= least


@PROPERTIES
@given(steps())
def test_reserved_decodes_are_never_cut_and_the_step_time_is_the_models(step):
    """Every decode is in the batch whole; the budget's time is the model's time of exactly that batch."""
    rule, target_ms, decodes, prefills = step
    budget, granted = run_step(rule, target_ms, decodes, prefills)
    decodes_ms = sum(rule.model.request_ms(new_tokens, history_tokens) for new_tokens, history_tokens in decodes)
    assert granted[0][1] == pytest.approx(rule.model.c0_ms + decodes_ms, rel=1e-9)  # booked before any prefill
    pairs = budget.pairs()
    assert list(pairs[: len(decodes)]) == decodes
    assert budget.predicted_ms() == pytest.approx(rule.model.batch_time_ms(pairs), rel=1e-9)
    assert budget.used_ms == pytest.approx(budget.predicted_ms(), rel=1e-9)


@PROPERTIES
@given(steps(), st.data())
def test_charge_then_refund_returns_the_step_time_to_where_it_was(step, data):
    """A request preempted within the step leaves nothing of its cost behind (a decode: nor of its reservation)."""
    rule, target_ms, decodes, prefills = step
    budget = StepBudget(rule, target_ms)
    for index, (new_tokens, history_tokens) in enumerate(decodes):
        before_ms = budget.used_ms
        budget.reserve_decodes([(f"decode-{index}", new_tokens, history_tokens)])
        charged_tokens = data.draw(st.sampled_from([new_tokens, new_tokens + 1]))  # a spec token more or not
        budget.charge(f"decode-{index}", charged_tokens, history_tokens)
        if data.draw(st.booleans()):
            budget.refund(f"decode-{index}")
            assert budget.used_ms == pytest.approx(before_ms, rel=1e-9, abs=1e-9 * before_ms)
    for index, (history_tokens, remaining_tokens, allowed_tokens) in enumerate(prefills):
        before_ms = budget.used_ms
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, allowed_tokens)
        budget.charge(f"prefill-{index}", chunk_tokens, history_tokens)
        if data.draw(st.booleans()):
            budget.refund(f"prefill-{index}")
            assert budget.used_ms == pytest.approx(before_ms, rel=1e-9, abs=1e-9 * before_ms)
    assert budget.used_ms == pytest.approx(rule.model.batch_time_ms(budget.pairs()), rel=1e-9)


@PROPERTIES
@given(steps(), st.data())
def test_settling_keeps_exactly_the_scheduled_requests(step, data):
    """Decodes reserved but never scheduled (preempted before their turn) leave the step's time at settle."""
    rule, target_ms, decodes, prefills = step
    budget, granted = run_step(rule, target_ms, decodes, prefills)
    everything = dict(budget.charged)
    scheduled = {r: everything[r][0] for r in everything if data.draw(st.booleans(), label=r)}
    budget.settle(scheduled)
    assert set(budget.charged) == set(scheduled)
    assert budget.used_ms == pytest.approx(rule.model.batch_time_ms(budget.pairs()), rel=1e-9, abs=1e-12)
    assert budget.predicted_ms() == pytest.approx(budget.used_ms, rel=1e-9, abs=1e-12)


def test_a_refunded_first_prefill_lets_the_next_one_be_first():
    rule = ChunkRule(
        LatencyModel(5.0, 0.02, 0.0, 1e-6, 2e-6),
        ChunkLimits(max_chunk_tokens=8192, max_model_len=10**6, min_chunk_tokens=512),
        4,
    )
    budget = StepBudget(rule, target_ms=6.0)
    budget.reserve_decodes([("decode", 1, 900_000)])  # 5 ms + 1.82 ms: the decode alone fills the target
    budget.charge("decode", 1, 900_000)
    assert budget.used_ms > 6.0
    assert budget.grant(0, 100_000, 8192) == 512  # the first prefill: the floor
    budget.charge("first", 512, 0)
    assert budget.grant(0, 100_000, 8192) == 0  # the second: nothing left
    budget.refund("first")
    assert budget.grant(0, 100_000, 8192) == 512  # preempted first: the next prefill is now the first


# ---------------------------------------------------------------- the planned target
@st.composite
def held_prefills(draw, rule, max_count=6):
    return [draw_position(draw, rule.limits.max_model_len) for _ in range(draw(st.integers(1, max_count)))]


@PROPERTIES
@given(st.data())
def test_the_planned_target_is_finite_and_within_its_bounds(data):
    rule = data.draw(rules(max_batch_ms=True))
    held = data.draw(held_prefills(rule))
    fixed_ms = rule.model.c0_ms + data.draw(st.sampled_from([0.0, 1.0, 50.0]))
    inflight_ms = data.draw(st.sampled_from([0.0, 10.0, 1000.0]))
    low, high = rule.target_bounds(held, fixed_ms)
    target_ms = rule.plan_target(held, fixed_ms=fixed_ms, inflight_ms=inflight_ms)
    assert math.isfinite(target_ms)
    assert low <= target_ms <= high * (1 + 1e-12)


@PROPERTIES
@given(st.data())
def test_the_planned_target_never_exceeds_max_batch_ms_whatever_the_prefills(data):
    rule = data.draw(rules())
    held = data.draw(held_prefills(rule))
    low, high = rule.target_bounds(held, rule.model.c0_ms)
    rule = rule.with_limits(max_batch_ms=low * (high / low) ** data.draw(st.floats(0.0, 1.5)))
    assert rule.plan_target(held) <= rule.limits.max_batch_ms * (1 + 1e-12)


def test_the_planned_target_never_exceeds_an_upper_bound_just_above_the_lower_one():
    rule = ChunkRule(MIDDLE, LIMITS, num_stages=4)
    low, _ = rule.target_bounds([(0, 1)], MIDDLE.c0_ms)
    rule = rule.with_limits(max_batch_ms=low * (1 + 5e-7))
    assert rule.plan_target([(0, 1)]) <= rule.limits.max_batch_ms


def test_the_planned_target_never_exceeds_max_batch_ms():
    rule = ChunkRule(MIDDLE, LIMITS, num_stages=4).with_limits(max_batch_ms=20.0)
    assert rule.plan_target([(0, 150_000)]) <= 20.0  # planned: 306 ms, one 16-token chunk at 150k


@PROPERTIES
@given(st.data())
def test_a_longer_backlog_never_plans_a_shorter_batch(data):
    """More prefills queued behind the first: throughput counts more, so the target grows (or stays)."""
    rule = data.draw(rules(smooth_factor=1.0))
    first = data.draw(held_prefills(rule, max_count=1))[0]
    deepest = sum(first)
    behind = data.draw(st.lists(st.tuples(st.integers(0, deepest - 1), st.integers(1, deepest)), max_size=8))
    behind = [(history, min(remaining, deepest - history)) for history, remaining in behind]
    targets = [rule.plan_target([first, *behind[:count]]) for count in range(len(behind) + 1)]
    assert all(later >= earlier * (1 - 1e-9) for earlier, later in zip(targets, targets[1:], strict=False)), targets


@PROPERTIES
@given(st.data())
def test_a_deeper_pipeline_never_plans_a_longer_batch(data):
    """More stages: the fill and drain (P - 1 times the largest chunk) weigh more, so the target shrinks (or stays)."""
    rule = data.draw(rules(smooth_factor=1.0))
    held = data.draw(held_prefills(rule, max_count=3))
    targets = [ChunkRule(rule.model, rule.limits, stages).plan_target(held) for stages in (1, 2, 3, 4, 8, 16)]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(targets, targets[1:], strict=False)), targets


# ---------------------------------------------------------------- the planner against brute force


def prefill_chunks(rule, history_tokens, remaining_tokens, target_ms):
    """(chunk_tokens, history_tokens) of a prefill alone in its batches, step by step, under the rule."""
    end_tokens, chunks = history_tokens + remaining_tokens, []
    while history_tokens < end_tokens:
        chunk_tokens = rule.wanted_chunk(history_tokens, end_tokens - history_tokens, target_ms)
        chunks.append((chunk_tokens, history_tokens))
        history_tokens += chunk_tokens
    return chunks


def predicted_ttft_ms(rule, prompts, target_ms):
    """Mean TTFT of FCFS prompts: the work of prompts 1..j, plus (P - 1) times the largest chunk's time."""
    work_ms, largest_ms = [], 0.0
    for history_tokens, remaining_tokens in prompts:
        times_ms = [
            rule.model.time_ms(c, h) for c, h in prefill_chunks(rule, history_tokens, remaining_tokens, target_ms)
        ]
        work_ms.append(sum(times_ms))
        largest_ms = max(largest_ms, *times_ms)
    return float(np.mean(np.cumsum(work_ms))) + (rule.num_stages - 1) * largest_ms


@pytest.mark.parametrize(
    ("model", "prompts", "num_stages"),
    [
        pytest.param(NPU_LIKE, [(0, 131_072)], 1, id="npu-128k-P1"),
        pytest.param(NPU_LIKE, [(0, 131_072)], 4, id="npu-128k-P4"),
        pytest.param(NPU_LIKE, [(0, 32_768)], 8, id="npu-32k-P8"),
        pytest.param(CPU_LIKE, [(0, 4096)], 4, id="cpu-4k-P4"),
        pytest.param(MIDDLE, [(0, 8000)], 2, id="middle-8k-P2"),
        pytest.param(MIDDLE, [(0, 131_072)], 2, id="middle-128k-P2"),
        pytest.param(MIDDLE, [(0, 32_768), (0, 4096), (0, 16_384)], 8, id="middle-3-prompts-P8"),
        pytest.param(NPU_LIKE, [(0, 8000)], 2, id="npu-8k-P2"),
        pytest.param(MIDDLE, [(0, 32_768)], 4, id="middle-32k-P4"),
    ],
)
def test_the_planned_target_is_within_2_percent_of_the_best_target_on_a_fine_grid(model, prompts, num_stages):
    """The planner's correctness: brute force over targets, each run through the rule chunk by chunk."""
    rule = ChunkRule(model, LIMITS, num_stages)
    low, high = rule.target_bounds(prompts, model.c0_ms)
    best_ms = min(predicted_ttft_ms(rule, prompts, t) for t in np.geomspace(low * (1 + 1e-6), high, 300))
    planned_ms = predicted_ttft_ms(rule, prompts, rule.plan_target(prompts))
    assert planned_ms <= 1.02 * best_ms, f"planned {planned_ms:.1f} ms, best {best_ms:.1f} ms"


@pytest.mark.parametrize("num_stages", [1, 2, 4, 8])
@pytest.mark.parametrize("prompt_tokens", [8000, 32_768, 131_072])
def test_a_large_fixed_cost_plans_fewer_larger_chunks_than_a_small_one(prompt_tokens, num_stages):
    """Accelerator-like (c0 = 30 ms) against CPU-like (c0 = 0.3 ms), every other coefficient equal."""
    accelerator = ChunkRule(NPU_LIKE, LIMITS, num_stages)
    cpu = ChunkRule(dataclasses.replace(NPU_LIKE, c0_ms=0.3), LIMITS, num_stages)
    prompt = [(0, prompt_tokens)]
    accelerator_chunks = prefill_chunks(accelerator, 0, prompt_tokens, accelerator.plan_target(prompt))
    cpu_chunks = prefill_chunks(cpu, 0, prompt_tokens, cpu.plan_target(prompt))
    assert len(accelerator_chunks) < len(cpu_chunks)
    assert accelerator_chunks[0][0] > cpu_chunks[0][0]


# ---------------------------------------------------------------- arithmetic at the edges
EXTREME_COEFFICIENT = log_uniform(-12, 6)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_no_overflow_nor_nan_for_any_model_accept_can_return(data):
    """Coefficients from 1e-12 to 1e6, histories to 1e6: chunks stay integers in range, times finite."""
    c4 = data.draw(EXTREME_COEFFICIENT)
    model = LatencyModel(
        *(data.draw(EXTREME_COEFFICIENT) for _ in range(3)), data.draw(log_uniform(-12, 6, zero=c4 > 0)), c4
    )
    max_chunk_tokens = data.draw(st.integers(1, 1 << 20))
    limits = ChunkLimits(
        max_chunk_tokens=max_chunk_tokens,
        max_model_len=data.draw(st.integers(1, 2_000_000)),
        min_chunk_tokens=data.draw(st.integers(0, max_chunk_tokens)),
        smooth_factor=data.draw(SMOOTH_FACTORS),
        max_batch_ms=data.draw(MAX_BATCH_MS),
    )
    rule = ChunkRule(model, limits, data.draw(st.integers(1, 64)))
    history_tokens, remaining_tokens = draw_position(data.draw, limits.max_model_len)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target_ms = rule.plan_target([(history_tokens, remaining_tokens)] * 3, inflight_ms=1e9)
        assert math.isfinite(target_ms) and target_ms > 0
        budget = StepBudget(rule, target_ms)
        budget.reserve_decodes([("decode", 1, limits.max_model_len - 1)])
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, max_chunk_tokens)
        assert 0 < chunk_tokens <= remaining_tokens
        assert 0 <= rule.chunk_within(history_tokens, target_ms, remaining_tokens) <= remaining_tokens
        budget.charge("prefill", chunk_tokens, history_tokens)
        assert math.isfinite(budget.predicted_ms()) and math.isfinite(budget.used_ms)
