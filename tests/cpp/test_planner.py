"""plan_target: the batch-time target, against brute force, and never a fault whatever it is given."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from cpp_samples import (
    BENT,
    CPU_LIKE,
    NPU_LIKE,
    TRUE,
    Quadratic,
    Tiles,
    Waves,
    located_model,
    measured_model,
    start_up_samples,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rule_cases import draw_position, rules
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_check import pipeline_done_ms
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, Plan
from vllm_ascend.core.cpp_planner import plan_target, predicted_ttft_ms, target_bounds
from vllm_ascend.core.cpp_step_budget import StepBudget

PROPERTIES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=262_144)


def rule_for(truth, num_stages, limits=LIMITS, **measure):
    return ChunkRule(
        measured_model(truth, noise=0.0, max_history_tokens=limits.max_model_len, **measure), limits, num_stages
    )


@st.composite
def held_prefills(draw, rule, max_count=6):
    return [draw_position(draw, rule.limits.max_model_len) for _ in range(draw(st.integers(1, max_count)))]


def chunk_times(rule, plan, history_tokens, remaining_tokens):
    """(chunk_tokens, history_tokens, ms) of a prefill alone in its batches, step by step, by the step budget."""
    end_tokens, chunks = history_tokens + remaining_tokens, []
    while history_tokens < end_tokens:
        budget = StepBudget(rule, plan)
        budget.start(plan.fixed_ms - rule.model.fixed_ms)
        chunk_tokens = budget.grant(history_tokens, end_tokens - history_tokens, 10**9)
        budget.charge("prefill", chunk_tokens, history_tokens)
        chunks.append((chunk_tokens, history_tokens, budget.predicted_ms()))
        history_tokens += chunk_tokens
    return chunks


def exact_ttft_ms(rule, prompts, plan):
    """Mean TTFT of FCFS prompts: the work of prompts 1..j, plus (P - 1) times the largest batch."""
    work_ms, largest_ms = [], 0.0
    for history_tokens, remaining_tokens in prompts:
        times_ms = [ms for _, _, ms in chunk_times(rule, plan, history_tokens, remaining_tokens)]
        work_ms.append(sum(times_ms))
        largest_ms = max(largest_ms, *times_ms)
    return float(np.mean(np.cumsum(work_ms))) + (rule.num_stages - 1) * largest_ms


# ---------------------------------------------------------------- against brute force
CASES = [
    pytest.param(NPU_LIKE, [(0, 131_072)], 1, id="npu-128k-P1"),
    pytest.param(NPU_LIKE, [(0, 131_072)], 4, id="npu-128k-P4"),
    pytest.param(NPU_LIKE, [(0, 32_768)], 8, id="npu-32k-P8"),
    pytest.param(CPU_LIKE, [(0, 4096)], 4, id="cpu-4k-P4"),
    pytest.param(TRUE, [(0, 8000)], 2, id="middle-8k-P2"),
    pytest.param(TRUE, [(0, 131_072)], 2, id="middle-128k-P2"),
    pytest.param(TRUE, [(0, 32_768), (0, 4096), (0, 16_384)], 8, id="middle-3-prompts-P8"),
    pytest.param(NPU_LIKE, [(0, 8000)], 2, id="npu-8k-P2"),
    pytest.param(BENT, [(0, 32_768)], 4, id="bent-32k-P4"),
    pytest.param(BENT, [(0, 131_072)], 8, id="bent-128k-P8"),
    pytest.param(Tiles(256), [(0, 32_768)], 4, id="tiles-32k-P4"),
]


@pytest.mark.parametrize(("truth", "prompts", "num_stages"), CASES)
def test_the_planned_target_is_within_2_percent_of_the_best_target_on_a_fine_grid(truth, prompts, num_stages):
    """The planner's correctness: brute force over targets, each run through the step budget chunk by chunk."""
    rule = rule_for(truth, num_stages)
    plan = plan_target(rule, prompts)
    low, high = target_bounds(rule, prompts, rule.model.fixed_ms)
    best_ms = min(exact_ttft_ms(rule, prompts, rule.plan(t)) for t in np.geomspace(low * (1 + 1e-6), high, 200))
    planned_ms = exact_ttft_ms(rule, prompts, plan)
    assert planned_ms <= 1.02 * best_ms, f"planned {planned_ms:.1f} ms, best {best_ms:.1f} ms"


@pytest.mark.parametrize(("truth", "prompts", "num_stages"), [c for c in CASES if c.id.endswith(("P4", "P8"))])
def test_the_planners_prediction_is_right_chunk_by_chunk(truth, prompts, num_stages):
    """What the planner integrates is what the step budget then schedules, within 3%."""
    rule = rule_for(truth, num_stages)
    plan = plan_target(rule, prompts)
    predicted, _ = predicted_ttft_ms(rule, prompts, np.array([plan.target_ms]), plan.fixed_ms, 0.0, plan.efficient)
    assert float(predicted[0]) == pytest.approx(exact_ttft_ms(rule, prompts, plan), rel=0.03)


@pytest.mark.parametrize("num_stages", [1, 2, 4, 8])
@pytest.mark.parametrize("prompt_tokens", [8000, 32_768, 131_072])
def test_a_large_fixed_cost_plans_fewer_larger_chunks_than_a_small_one(prompt_tokens, num_stages):
    """Accelerator-like (30 ms per step) against CPU-like (0.3 ms), every other term equal."""
    accelerator = rule_for(NPU_LIKE, num_stages)
    cpu = rule_for(Quadratic(0.3, NPU_LIKE.c1, NPU_LIKE.c2, NPU_LIKE.c3, NPU_LIKE.c4), num_stages)
    prompt = [(0, prompt_tokens)]
    accelerator_chunks = chunk_times(accelerator, plan_target(accelerator, prompt), 0, prompt_tokens)
    cpu_chunks = chunk_times(cpu, plan_target(cpu, prompt), 0, prompt_tokens)
    assert len(accelerator_chunks) < len(cpu_chunks)
    assert accelerator_chunks[0][0] > cpu_chunks[0][0]


def test_a_deeper_pipeline_plans_shorter_batches_for_one_long_prompt():
    targets = [plan_target(rule_for(TRUE, stages), [(0, 131_072)]).target_ms for stages in (1, 2, 4, 8, 16)]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(targets, targets[1:], strict=False)), targets
    assert targets[-1] < targets[0]


@pytest.mark.parametrize(
    ("truth", "base_tokens", "prompt_tokens", "num_stages"),
    [
        pytest.param(Tiles(128, fixed_ms=2.0, token_ms=0.02), 2048, 32_768, 8, id="tiles128-small-fixed-32k-P8"),
        pytest.param(Tiles(512, fixed_ms=30.0), 4096, 98_304, 8, id="tiles512-96k-P8"),
    ],
)
def test_on_tiles_no_constant_chunk_beats_the_plan_in_the_pipeline(truth, base_tokens, prompt_tokens, num_stages):
    """A chunk that shrinks a tile at a time makes batches shorter than the ones P places before
    them, and the engine's limit of P in flight idles the stages at each step down: the plan must
    not lose to a constant chunk, whose batches only grow, once both run through P stages."""
    limits = ChunkLimits(base_tokens, 262_144, granule_tokens=truth.tile_tokens)
    rule = ChunkRule(measured_model(truth, noise=0.0, base_chunk_tokens=base_tokens), limits, num_stages)
    prompt = [(0, prompt_tokens)]

    def pipeline_ttft_ms(plan):
        times_ms = [ms for _, _, ms in chunk_times(rule, plan, 0, prompt_tokens)]
        return pipeline_done_ms(times_ms, num_stages)[-1]

    planned_ms = pipeline_ttft_ms(plan_target(rule, prompt))
    sizes = range(truth.tile_tokens, base_tokens + 1, truth.tile_tokens)
    efficient = rule.efficient_chunks()
    constant_ms = min(
        pipeline_ttft_ms(Plan(math.inf, rule.model.fixed_ms, efficient.capped(size), size)) for size in sizes
    )
    assert planned_ms <= 1.005 * constant_ms, f"planned {planned_ms:.1f} ms, best constant chunk {constant_ms:.1f} ms"


@pytest.mark.parametrize(("prompt_tokens", "num_stages"), [(32_768, 2), (32_768, 4), (131_072, 2)])
def test_on_waves_no_chunk_of_whole_waves_beats_the_plan_in_the_pipeline(prompt_tokens, num_stages):
    """Waves of 100 ms every 2560 tokens over a 40 ms step cost: two or three whole waves amortise it
    best, and between them a chunk pays a wave for a few tokens. The plan, on the profile with
    its steps placed, must not lose to a constant chunk of whole waves."""
    truth = Waves(2560, fixed_ms=40.0, wave_ms=100.0)
    # A deployment whose context is the prompt: the profile's history reaches three quarters of it.
    limits, history = ChunkLimits(8192, prompt_tokens), prompt_tokens * 3 // 4
    model = located_model(truth, limits, num_stages, history)
    rule = ChunkRule(model, limits, num_stages)
    assert model.step_lowers() == [2560, 5120, 7680]

    def pipeline_ttft_ms(plan):
        times_ms = [truth.time_ms(c, h) for c, h, _ in chunk_times(rule, plan, 0, prompt_tokens)]
        return pipeline_done_ms(times_ms, num_stages)[-1]

    planned_ms = pipeline_ttft_ms(plan_target(rule, [(0, prompt_tokens)]))
    efficient = rule.efficient_chunks()
    constant_ms = min(
        pipeline_ttft_ms(Plan(math.inf, rule.model.fixed_ms, efficient.capped(size), size))
        for size in (2560, 5120, 7680)
    )
    assert planned_ms <= 1.005 * constant_ms, f"planned {planned_ms:.1f} ms, best whole waves {constant_ms:.1f} ms"


@pytest.mark.parametrize("num_stages", [2, 4])
def test_the_plan_adds_no_last_chunk_that_costs_a_whole_wave(num_stages):
    """Waves wider than the cap (3072 tokens against a 2048-token base), flat within: every chunk up to the cap
    costs a whole wave, so chunks that shrink with the history add a 65th, short one to a
    128k prompt that pays a wave for a few hundred tokens. The integral over the prompt counts
    chunks continuously and cannot see it; the plan must not lose to the constant base chunk."""
    truth = Waves(3072, fixed_ms=40.0, wave_ms=150.0, token_ms=0.0)  # flat within a wave
    prompt_tokens = 131_072
    limits, history = ChunkLimits(2048, prompt_tokens), prompt_tokens * 3 // 4
    samples = start_up_samples(truth, noise=0.0, max_history_tokens=history)
    rule = ChunkRule(
        judge(samples, limits, num_stages, max_history_tokens=history, last_round=True).model, limits, num_stages
    )

    def pipeline_ttft_ms(plan):
        times_ms = [truth.time_ms(c, h) for c, h, _ in chunk_times(rule, plan, 0, prompt_tokens)]
        return pipeline_done_ms(times_ms, num_stages)[-1], len(times_ms)

    planned_ms, planned_chunks = pipeline_ttft_ms(plan_target(rule, [(0, prompt_tokens)]))
    constant_ms, constant_chunks = pipeline_ttft_ms(Plan(math.inf, rule.model.fixed_ms, rule.efficient_chunks(), 2048))
    assert constant_chunks == 64
    assert (
        planned_ms <= 1.001 * constant_ms
    ), f"planned {planned_ms:.1f} ms in {planned_chunks} chunks, constant 2048 {constant_ms:.1f} ms in 64"


# ---------------------------------------------------------------- bounds
@PROPERTIES
@given(st.data())
def test_the_planned_target_is_finite_and_within_its_bounds(data):
    rule = data.draw(rules(decode_step_ms=True))
    held = data.draw(held_prefills(rule))
    fixed_ms = rule.model.fixed_ms + data.draw(st.sampled_from([0.0, 1.0, 50.0]))
    inflight_ms = data.draw(st.sampled_from([0.0, 10.0, 1000.0]))
    decoding = data.draw(st.integers(0, 3))
    low, high = target_bounds(rule, held, fixed_ms, decoding)
    plan = plan_target(rule, held, fixed_ms=fixed_ms, inflight_ms=inflight_ms, decoding=decoding)
    assert math.isfinite(plan.target_ms)
    assert low <= plan.target_ms <= high * (1 + 1e-12)


@PROPERTIES
@given(st.data())
def test_while_requests_decode_the_target_never_exceeds_the_decode_step_bound_whatever_the_prefills(data):
    rule = data.draw(rules())
    held = data.draw(held_prefills(rule))
    low, high = target_bounds(rule, held, rule.model.fixed_ms)
    rule = rule.with_limits(decode_step_ms=low * (high / low) ** data.draw(st.floats(0.0, 1.5)))
    decoding = data.draw(st.integers(1, 40))
    assert plan_target(rule, held, decoding=decoding).target_ms <= rule.limits.decode_step_ms * (1 + 1e-12)


def test_the_decode_step_bound_leaves_prefills_alone_and_is_the_target_for_a_long_prompt_beside_decodes():
    """No request decodes: the user's TPOT target owes nothing, the plan is the one without it. Decodes:
    within the bound, a long prompt wants the most time a step has (the least TTFT the bound allows)."""
    limits = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072)
    rule = rule_for(TRUE, 4, limits)
    held = [(0, 65_536)]
    free = plan_target(rule, held).target_ms
    bound_ms = free / 3
    paced = rule.with_limits(decode_step_ms=bound_ms)
    assert plan_target(paced, held).target_ms == pytest.approx(free)
    assert plan_target(paced, held, decoding=5).target_ms == pytest.approx(bound_ms, rel=0.02)
    assert plan_target(paced, held, decoding=5).batch_tokens == math.inf  # no fixed chunk caps the chunks


def test_a_prefill_that_fills_the_whole_context_is_planned_for_its_pipeline():
    """History + remaining = max_model_len: the last token has no room after it, which is no reason to give up."""
    limits = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072)
    targets = {}
    for stages in (1, 4, 16):
        rule = rule_for(TRUE, stages, limits)
        low, high = target_bounds(rule, [(4096, 131_072 - 4096)], rule.model.fixed_ms)
        targets[stages] = plan_target(rule, [(4096, 131_072 - 4096)]).target_ms
        assert low <= targets[stages] <= high
    assert targets[16] < targets[1]  # a deep pipeline still wants short batches


# ---------------------------------------------------------------- never a fault
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_planning_and_granting_never_raise_and_always_advance_a_prefill(data):
    """Any table (attention-dominated ones included), smooth factor, floor, cap, P from 1 to 64, held prefills and
    decodes: a finite target within bounds, and the step's first prefill always advances."""
    rule = data.draw(rules(decode_step_ms=True, granule=True))
    held = data.draw(held_prefills(rule, max_count=20))
    decoding = data.draw(st.integers(0, 40))
    decodes = [(f"d{i}", 1, data.draw(st.integers(0, rule.limits.max_model_len - 1))) for i in range(decoding)]
    fixed_ms = rule.model.fixed_ms + sum(rule.model.decode_ms(h) for _, _, h in decodes) / rule.num_stages
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_target(rule, held, fixed_ms=fixed_ms, inflight_ms=data.draw(st.sampled_from([0.0, 1e9])),
                           decoding=decoding)  # fmt: skip
        assert math.isfinite(plan.target_ms) and plan.target_ms > 0
        budget = StepBudget(rule, plan)
        budget.reserve_decodes(decodes)
        history_tokens, remaining_tokens = held[0]
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, rule.limits.base_chunk_tokens)
        room = min(remaining_tokens, rule.limits.base_chunk_tokens, rule.limits.max_model_len - history_tokens)
        assert 0 < chunk_tokens <= remaining_tokens if room > 0 else chunk_tokens == 0
        budget.charge("prefill", chunk_tokens, history_tokens)
        assert math.isfinite(budget.predicted_ms()) and math.isfinite(budget.used_ms)


def test_an_attention_dominated_model_with_smoothing_and_decodes_plans_without_a_fault():
    """A model whose C*H attention outweighs its C^2 one, smooth_factor 0.5, decodes running: once a planner fault."""
    limits = ChunkLimits(base_chunk_tokens=8192, max_model_len=20_512, smooth_factor=0.5)
    rule = rule_for(Quadratic(4, 0.00016, 0, 6.2e-7, 2.3e-6), 2, limits)
    plan = plan_target(rule, [(0, 20_000), (3000, 9000)], fixed_ms=rule.model.fixed_ms + 3.0, decoding=7)
    assert math.isfinite(plan.target_ms)
