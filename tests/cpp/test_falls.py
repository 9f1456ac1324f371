"""Falls in a profile: measured again; one that repeats is a fact the model keeps and the rule uses, one that does
not is noise; the profile stays within its runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from cpp_samples import TRUE, start_up_samples, timed
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from vllm_ascend.core import cpp_profiling
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_falls import CONFIRM_SAMPLES, find_falls, runs_by_point
from vllm_ascend.core.cpp_profile_plan import chunk_ladder, history_levels
from vllm_ascend.core.cpp_samples import group_points

MAX_HISTORY = 65_536
LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=MAX_HISTORY + 8192)
LADDER = chunk_ladder(8192, 24)
LEVELS = history_levels(MAX_HISTORY, 4)
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


def test_the_default_profile_with_ten_odd_points_stays_within_218_runs_and_keeps_them():
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
