"""Falls in a profile: measured again; one that repeats is a fact the model keeps and the rule uses, one that does
not is noise; the profile stays within its runs; and no plan for one prompt is adopted behind a fixed chunk."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from cpp_samples import BENT, CPU_LIKE, TRUE, Tiles, start_up_samples, timed
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from vllm_ascend.core import cpp_profiling
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_check import exact_cost, fixed_sweep, prefill_chunk_ms
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, EfficientChunks, Plan
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_falls import CONFIRM_SAMPLES, find_falls, runs_by_point
from vllm_ascend.core.cpp_planner import plan_target, target_bounds
from vllm_ascend.core.cpp_profile_plan import chunk_ladder, history_levels_for
from vllm_ascend.core.cpp_samples import group_points

MAX_HISTORY = 65_536
LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=MAX_HISTORY + 8192)
LADDER = chunk_ladder(8192, 24)
LEVELS = history_levels_for(8192, MAX_HISTORY, 4)
PROPERTIES = settings(max_examples=12, deadline=None)


@dataclass(frozen=True)
class Odd:
    """A truth with odd points: at each (chunk, history) of ``points`` the time above the truth's fixed cost
    is ``factor`` of the truth's, in every run (a size that hits a better or a worse kernel at that history)."""

    truth: object
    points: tuple[tuple[int, int, float], ...]

    def time_ms(self, chunk_tokens, history_tokens):
        factor = next((f for c, h, f in self.points if (c, h) == (chunk_tokens, history_tokens)), 1.0)
        fixed_ms = getattr(self.truth, "c0", getattr(self.truth, "fixed_ms", 0.0))
        return fixed_ms + (self.truth.time_ms(chunk_tokens, history_tokens) - fixed_ms) * factor


def verdict_on(samples, *, last_round=True, budget=0, stages=4):
    return judge(
        samples, LIMITS, stages, max_history_tokens=MAX_HISTORY, last_round=last_round, remeasure_budget=budget
    )


def falls_of(samples):
    valid = [(c, h, t) for c, h, t in samples]
    points, scatter = group_points(valid)
    return find_falls(points, runs_by_point(valid), scatter)


@PROPERTIES
@given(
    st.sampled_from([c for c in LADDER if 96 <= c <= 4096]),
    st.sampled_from(LEVELS),
    st.floats(0.3, 0.7),
    st.floats(0.0, 0.01),
    st.integers(0, 1000),
)
def test_a_fall_every_run_shows_is_kept_and_the_rule_takes_the_faster_larger_size(chunk, history, factor, noise, seed):
    truth = Odd(TRUE, ((chunk, history, factor),))
    smaller = LADDER[LADDER.index(chunk) - 1]
    share = 1.0 - truth.time_ms(chunk, history) / truth.time_ms(smaller, history)
    assume(share > 0.1)  # a fall beyond any noise this profile has (4 x 1% x its medians' error)
    verdict = verdict_on(start_up_samples(truth, noise=noise, seed=seed), last_round=False, budget=8)
    model = verdict.model
    assert model is not None and not verdict.remeasure, verdict.reason  # every run agreed: nothing to ask
    assert (chunk, history) in model.odd_points and (smaller, history) in model.odd_points
    assert model.time_ms(chunk, history) == pytest.approx(truth.time_ms(chunk, history), rel=0.05)
    # Used: for any time the fast size fits and the smaller one does not, the chunk is the fast size or more.
    fast, slow = model.time_ms(chunk, history), model.time_ms(smaller, history)
    for time_ms in np.linspace(fast, slow, 5)[:-1]:
        assert model.chunk_for_time(history, time_ms) >= chunk
        rule = ChunkRule(model, LIMITS, 4)
        assert rule.chunk_within(history, time_ms - model.fixed_ms, 100_000) >= chunk


@PROPERTIES
@given(
    st.sampled_from([c for c in LADDER if 96 <= c <= 4096]),
    st.sampled_from(LEVELS),
    st.floats(0.3, 0.6),
    st.integers(0, 1000),
)
def test_a_fall_one_run_shows_is_measured_again_and_averaged_away_as_noise(chunk, history, factor, seed):
    truth = TRUE
    samples = start_up_samples(truth, noise=0.005, seed=seed)
    first = samples.index(next(s for s in samples if (s[0], s[1]) == (chunk, history)))
    samples[first] = (chunk, history, samples[first][2] * factor)  # one run, in one pass, took less
    doubtful = [f for f in falls_of(samples) if chunk == f.later[0] and history == f.later[1]]
    assume(doubtful)  # the hiccup made a fall beyond the noise
    assert not any(f.repeated for f in doubtful)  # the other pass did not show it
    verdict = verdict_on(samples, last_round=False, budget=8)
    assert (chunk, history) in verdict.remeasure and len(verdict.remeasure) <= 8
    again = timed(truth, verdict.remeasure, noise=0.005, seed=seed + 1)
    final = verdict_on(samples + again)
    assert final.model is not None and (chunk, history) not in final.model.odd_points
    assert final.model.time_ms(chunk, history) == pytest.approx(truth.time_ms(chunk, history), rel=0.03)
    # With no room to measure it again, it is averaged away all the same: never kept, never a refusal.
    unconfirmed = verdict_on(samples)
    assert unconfirmed.model is not None and (chunk, history) not in unconfirmed.model.odd_points


def test_each_point_of_a_doubtful_fall_is_measured_until_a_majority_of_runs_decides():
    one_pass = start_up_samples(TRUE, noise=0.005, repeats=1)
    samples = [(c, h, t * (0.5 if (c, h) == (1024, 0) else 1.0)) for c, h, t in one_pass]
    verdict = verdict_on(samples, last_round=False, budget=8)  # one run a point: nothing agreed yet
    assert sorted(verdict.remeasure) == sorted([(768, 0), (1024, 0)] * (CONFIRM_SAMPLES - 1))
    assert not verdict_on(samples, last_round=False, budget=3).remeasure  # a fall is measured whole, or not at all


def test_the_default_profile_with_ten_odd_points_stays_within_its_bound_and_keeps_them():
    """218 runs in all, the runs measuring how far the odd points reach in history included (there were up to
    48 more of those before)."""
    points = tuple((c, h, 0.5 if k % 2 else 1.6) for k, (c, h) in enumerate(zip(LADDER[3:13], LEVELS * 2, strict=True)))
    device_runs = []

    def measure(chunk, history):  # a quiet host: 0.5% scatter
        device_runs.append((chunk, history))
        return Odd(TRUE, points).time_ms(chunk, history) * (1.0 + 0.005 * np.sin(len(device_runs)))

    result = cpp_profiling.initialise_profile(
        CppConfig(cache_dir=""), LIMITS, 4, fingerprint={}, measure=measure, max_history_tokens=MAX_HISTORY
    )
    assert result.verdict.model is not None, result.verdict.reason
    assert len(device_runs) - cpp_profiling.WARMUP_RUNS <= 218
    kept = set(result.verdict.model.odd_points)
    assert {(c, h) for c, h, _ in points if (c, h) != (LADDER[3], 0)} <= kept


@dataclass(frozen=True)
class Narrow:
    """A truth whose size ``chunk`` takes ``factor`` of its time above the fixed cost at ``history``, fading
    linearly to the truth's own within ``reach`` tokens of history either side (narrower than the levels)."""

    truth: object
    chunk: int
    history: int
    reach: int
    factor: float

    def time_ms(self, chunk_tokens, history_tokens):
        near = max(0.0, 1.0 - abs(history_tokens - self.history) / self.reach) if chunk_tokens == self.chunk else 0
        fixed_ms = self.truth.c0
        return fixed_ms + (self.truth.time_ms(chunk_tokens, history_tokens) - fixed_ms) * (1 + (self.factor - 1) * near)


@pytest.mark.parametrize("factor", [0.5, 1.6])
def test_an_odd_point_narrower_than_the_levels_is_read_as_far_as_it_was_measured_to_reach(factor):
    """A size fast (or slow) only within 4096 tokens of one level's history: the profile measures it between
    that level and the ones either side, where it has faded, and the model reads it there as measured, not on
    the line from the level's odd time to the next level's (which would spread it over the whole interval)."""
    spacing = LEVELS[1] - LEVELS[0]
    truth = Narrow(TRUE, 384, LEVELS[2], spacing // 4, factor)
    result = cpp_profiling.initialise_profile(
        CppConfig(cache_dir=""), LIMITS, 4, fingerprint={}, measure=truth.time_ms, max_history_tokens=MAX_HISTORY
    )
    model = result.verdict.model
    assert model is not None and (384, LEVELS[2]) in model.odd_points, result.verdict.reason
    for history in (LEVELS[2] - spacing // 2, LEVELS[2] + spacing // 2):  # faded there
        assert model.time_ms(384, history) == pytest.approx(truth.time_ms(384, history), rel=0.02)
    assert model.time_ms(384, LEVELS[2]) == pytest.approx(truth.time_ms(384, LEVELS[2]), rel=1e-9)
    again = type(model).from_dict(model.to_dict())
    assert again.time_ms(384, LEVELS[2] - spacing // 2) == model.time_ms(384, LEVELS[2] - spacing // 2)


def test_a_hiccup_is_measured_again_and_when_it_does_not_repeat_the_host_is_noisy_as_before():
    """One run of one point took 0.4x: its fall is measured again (its two points), does not repeat, and so
    says the host is noisy: the profile runs its second round, as a noisy host's does, and keeps no fall."""
    hiccup = {"left": 1}
    runs = []

    def measure(chunk, history):
        runs.append((chunk, history))
        factor = 1.0
        if (chunk, history) == (2048, LEVELS[2]) and hiccup["left"]:
            hiccup["left"], factor = 0, 0.4
        return TRUE.time_ms(chunk, history) * factor

    result = cpp_profiling.initialise_profile(
        CppConfig(cache_dir=""), LIMITS, 4, fingerprint={}, measure=measure, max_history_tokens=MAX_HISTORY
    )
    model = result.verdict.model
    assert model is not None and not model.odd_points
    planned = len(cpp_profiling.profile_plan(base_chunk_tokens=8192, points=24, repeats=2, history_points=4,
                                             max_history_tokens=MAX_HISTORY))  # fmt: skip
    again = runs[cpp_profiling.WARMUP_RUNS + planned : cpp_profiling.WARMUP_RUNS + planned + 2]
    assert sorted(again) == [(1536, LEVELS[2]), (2048, LEVELS[2])]  # the fall's two points, first
    assert len(runs) - cpp_profiling.WARMUP_RUNS == 2 * planned + 2
    assert model.time_ms(2048, LEVELS[2]) == pytest.approx(TRUE.time_ms(2048, LEVELS[2]), rel=1e-6)


# ---------------------------------------------------------------- never behind the simple alternative
def constant(rule, chunk, high):
    return Plan(high, rule.model.fixed_ms, EfficientChunks((0.0,), (float(chunk),)), chunk)


TRUTHS = {
    "smooth": TRUE,
    "bent": BENT,
    "attention": CPU_LIKE,
    "tiles": Tiles(128, fixed_ms=2.0, token_ms=0.02),
    "odd": Odd(TRUE, ((128, LEVELS[2], 0.4), (384, LEVELS[3], 0.5), (768, LEVELS[1], 1.5))),
}


@settings(max_examples=20, deadline=None)
@example("tiles", 8192, 4, 4096, 1)  # (the plan before this check: 1.6% behind 512-token chunks)
@example("smooth", 2048, 2, 32_768, 1)  # (0.7% behind 2048-token chunks)
@given(
    st.sampled_from(sorted(TRUTHS)),
    st.sampled_from([2048, 8192]),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([4096, 32_768, 70_000]),
    st.integers(0, 2**16),
)
def test_the_planned_ttft_is_never_above_the_best_fixed_chunk_s_under_the_same_model(name, base, stages, prompt, seed):
    limits = ChunkLimits(base_chunk_tokens=base, max_model_len=MAX_HISTORY + 8192)
    samples = start_up_samples(TRUTHS[name], base_chunk_tokens=base, noise=0.01, seed=seed)
    verdict = judge(samples, limits, stages, max_history_tokens=MAX_HISTORY, last_round=True)
    rule = ChunkRule(verdict.model, replace(limits, granule_tokens=verdict.granule_tokens), stages)
    held = [(0, prompt)]
    plan = plan_target(rule, held)
    _, high = target_bounds(rule, held, rule.model.fixed_ms)
    limit = prompt // rule.limits.floor_tokens + 2
    planned_ms = exact_cost(rule, held, plan, 0.0, limit)[0]
    for chunk in fixed_sweep(rule):
        fixed_ms = exact_cost(rule, held, constant(rule, chunk, high), 0.0, limit)[0]  # the step budget's own chunks
        assert planned_ms <= fixed_ms * (1 + 1e-9), (chunk, planned_ms, fixed_ms)


def test_a_constant_chunk_is_granted_as_the_check_counts_it():
    verdict = judge(start_up_samples(TRUE), LIMITS, 4, max_history_tokens=MAX_HISTORY, last_round=True)
    rule = ChunkRule(verdict.model, LIMITS, 4)
    _, high = target_bounds(rule, [(0, 50_000)], rule.model.fixed_ms)
    for chunk in fixed_sweep(rule):
        granted = prefill_chunk_ms(rule, constant(rule, chunk, high), 0, 50_000, 10_000)
        starts = np.arange(0, 50_000, chunk, dtype=np.float64)
        counted = rule.model.time_ms_many(np.minimum(float(chunk), 50_000 - starts), starts)
        assert granted == pytest.approx(counted.tolist(), rel=1e-12)
