"""judge: broken data is refused, noise never is, a fall that repeats is kept, stability is judged on decisions,
the fallback is the best fixed chunk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from cpp_samples import BENT, CPU_LIKE, NPU_LIKE, TRUE, Quadratic, Tiles, Waves, model_of, start_up_samples
from vllm_ascend.config_table import settings
from vllm_ascend.core import cpp_acceptance
from vllm_ascend.core.cpp_acceptance import (
    MAX_ROUNDS,
    best_fixed_chunk,
    detect_granule,
    judge,
    locate_steps,
    reference_prompt_tokens,
    schedule_ttft_ms,
)
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_planner import plan_target
from vllm_ascend.core.cpp_profile_plan import chunk_ladder
from vllm_ascend.core.cpp_profiling import EXTRA_ROUNDS, LOCATE_RUNS, LOCATE_TOKENS, locate_runs
from vllm_ascend.core.cpp_samples import group_points

MAX_HISTORY = 65_536
LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=MAX_HISTORY + 8192)


def verdict_on(samples, *, last_round=True, stages=4, limits=LIMITS):
    return judge(samples, limits, stages, max_history_tokens=MAX_HISTORY, last_round=last_round)


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT, Tiles(128), Tiles(256)])
def test_a_clean_profile_of_any_shape_is_accepted_at_once(truth):
    verdict = verdict_on(start_up_samples(truth, noise=0.005), last_round=False)
    assert verdict.model is not None and not verdict.noisy, verdict.reason


@pytest.mark.parametrize("noise", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("truth", [TRUE, CPU_LIKE, BENT])
def test_noise_alone_never_refuses_a_profile(truth, noise):
    """After the last round the medians are the best estimate there is: noisy, not broken."""
    for seed in range(3):
        samples = start_up_samples(truth, noise=noise, seed=seed) + start_up_samples(truth, noise=noise, seed=seed + 10)
        verdict = verdict_on(samples)
        assert verdict.model is not None, verdict.reason


def fast_2048_samples():
    """A profile whose 2048-token chunks take 0.4x at every history, in every run: a size that hits a
    better kernel, not broken data."""
    return [(c, h, t * (0.4 if c == 2048 else 1.0)) for c, h, t in start_up_samples(TRUE, noise=0.01)]


def test_times_that_fall_in_every_run_are_a_fact_the_model_keeps():
    verdict = verdict_on(fast_2048_samples(), last_round=False)
    assert verdict.model is not None and not verdict.noisy and not verdict.remeasure
    assert "5 fall(s) that repeated kept" in verdict.reason and "odd point(s) kept" in verdict.reason
    model = verdict.model
    assert (2048, 0) in model.odd_points and model.time_ms(2048, 0) < model.time_ms(1536, 0)
    assert model.time_ms(2048, 0) == pytest.approx(0.4 * TRUE.time_ms(2048, 0), rel=0.03)


def broken_samples():
    """A profile where every run at the deepest history length but the smallest size's gave no measurement
    (the two sizes over half the base chunk are not run there: they do not fit)."""
    samples = start_up_samples(TRUE, noise=0.01)
    deep = max(h for _, h, _ in samples)
    return [(c, h, t if h != deep or c == 1 else float("nan")) for c, h, t in samples]


def test_the_fallback_may_run_a_size_too_large_for_the_deepest_level():
    """A step's fixed cost that dominates (a large chunk is best) and a middle history length broken: the
    fixed chunk that runs is the base chunk, which was not run at the deepest length (it does not fit)."""
    truth = Quadratic(200.0, 0.01, 1e-5, 1e-7, 1e-8)
    samples = start_up_samples(truth, noise=0.01)
    middle = sorted({h for _, h, _ in samples})[2]
    verdict = verdict_on([(c, h, t if h != middle or c in (1, 32) else float("nan")) for c, h, t in samples])
    assert verdict.model is None and verdict.fixed_chunk_tokens == 8192


@pytest.mark.parametrize("lost", [512, 4096])
def test_one_size_lost_at_the_deepest_level_costs_that_size_only(lost):
    """Both runs of one size at the deepest level gave no measurement: the grid loses that size, not the
    sizes too large for that level (which the grid takes without it), and the model still reaches the base."""
    samples = start_up_samples(TRUE, noise=0.01)
    deep = max(h for _, h, _ in samples)
    verdict = verdict_on([(c, h, float("nan") if (c, h) == (lost, deep) else t) for c, h, t in samples])
    model = verdict.model
    assert model is not None and lost not in model.chunk_tokens and model.chunk_tokens[-2:] == (6144, 8192)
    for history in (0, deep):
        assert model.time_ms(8192, history) == pytest.approx(TRUE.time_ms(8192, history), rel=0.05)


def test_a_profile_of_broken_data_is_refused_with_the_best_fixed_chunk():
    verdict = verdict_on(broken_samples())
    assert verdict.model is None and not verdict.noisy and "no usable profile" in verdict.reason
    assert verdict.fixed_chunk_tokens is not None


def test_the_fallback_is_the_best_fixed_chunk_for_the_reference_prompt_and_never_the_token_budget():
    """Times fixed chunks on the truth for the reference prompt: the fallback is the best of them."""
    verdict = verdict_on(broken_samples())
    prompt = LIMITS.max_model_len

    def ttft(chunk):
        starts = np.arange(0, prompt, chunk)
        times = [TRUE.time_ms(min(chunk, prompt - s), s) for s in starts]
        return sum(times) + 3 * max(times)

    sizes = [128, 256, 512, 1024, 4096, 8192]
    best = min(ttft(c) for c in sizes)
    assert ttft(verdict.fixed_chunk_tokens) <= 1.1 * best
    assert ttft(verdict.fixed_chunk_tokens) < ttft(LIMITS.base_chunk_tokens)


def test_best_fixed_chunk_picks_a_profiled_size_within_the_limits():
    rule = ChunkRule(verdict_on(start_up_samples(CPU_LIKE)).model, LIMITS, 8)
    chunk = best_fixed_chunk(rule, 100_000)
    assert chunk in rule.model.chunk_tokens and LIMITS.floor_tokens <= chunk <= LIMITS.cap_tokens


def test_samples_that_are_not_measurements_are_dropped_and_counted():
    samples = start_up_samples(TRUE) + [(256, 0, 1e-320), (256, 0, float("nan")), ("123", 0, 1.0)]
    verdict = verdict_on(samples)
    assert verdict.model is not None and "3 sample(s) not measurements" in verdict.reason


def test_nothing_valid_gives_upstream_behaviour():
    verdict = verdict_on([(256, 0, 1e-320)] * 10)
    assert verdict.model is None and verdict.fixed_chunk_tokens is None and not verdict.noisy


def test_a_round_that_contradicts_the_others_where_the_decisions_are_asks_for_another_round():
    clean = start_up_samples(CPU_LIKE, noise=0.0, repeats=1)
    liar = [(c, h, t * (2.0 if 128 <= c <= 512 else 1.0)) for c, h, t in clean]
    first = verdict_on(clean + liar, last_round=False)
    assert first.noisy and "unstable decisions" in first.reason
    assert verdict_on(clean + clean, last_round=False).model is not None
    # Where no decision is made, a contradiction costs nothing and asks for nothing.
    harmless = [(c, h, t * (1.5 if c == 1 and h > 0 else 1.0)) for c, h, t in clean]
    assert verdict_on(clean + harmless, last_round=False).model is not None


def test_no_more_rounds_are_planned_than_a_fresh_profile_makes(monkeypatch):
    """A cached file of 3,333 passes over a small grid once planned 3,333 schedules (a minute of start-up)."""
    assert MAX_ROUNDS >= (1 + EXTRA_ROUNDS) * settings(CppConfig)["profile_repeats"][1].high
    one_pass = start_up_samples(TRUE, noise=0.01, repeats=1, points=8, history_points=1)
    planned = []
    monkeypatch.setattr(cpp_acceptance, "schedule_ttft_ms", lambda *a: planned.append(a) or schedule_ttft_ms(*a))
    verdict = verdict_on(one_pass * (MAX_ROUNDS + 40), last_round=False)
    assert verdict.model is not None, verdict.reason
    assert len(planned) == 1 + MAX_ROUNDS  # the full model's own schedule, then one per round judged


@pytest.mark.parametrize("tile, noise", [(64, 0.002), (128, 0.01), (256, 0.01), (512, 0.01)])
def test_the_tile_probe_finds_the_tile_a_device_steps_at(tile, noise):
    verdict = verdict_on(start_up_samples(Tiles(tile), noise=noise))
    assert verdict.granule_tokens == tile
    assert f"every {tile} tokens" in verdict.reason


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT])
def test_a_smooth_device_has_no_granule(truth):
    assert verdict_on(start_up_samples(truth, noise=0.02)).granule_tokens == 1


def test_a_jump_inside_the_scatter_is_not_a_tile():
    points, _ = group_points(start_up_samples(Tiles(256), noise=0.0))
    assert detect_granule(points, scatter=0.0) == 256
    # A 24% step is within 4 standard errors of the difference of two medians of six runs at 10% noise.
    assert detect_granule(points, scatter=0.10) == 1


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "truth, noise",
    [(Tiles(128, fixed_ms=2.0, token_ms=0.02), 0.10), (Tiles(256), 0.03), (Tiles(128), 0.02), (Tiles(512), 0.05)],
    ids=["128-small-step-cost-10%", "256-3%", "128-2%", "512-5%"],
)
def test_the_tile_probe_sees_tiles_through_the_noise_of_a_real_host(truth, noise, seed):
    """A host's step times scatter by a few percent; the probe must still see a tile's step."""
    verdict = verdict_on(start_up_samples(truth, noise=noise, seed=seed))
    assert verdict.granule_tokens == truth.tile_tokens


def test_a_time_that_falls_after_the_probe_is_no_tile():
    """A broken size just past S + 1 must not pass for the step a tile would make there."""
    samples = [(c, h, t * (0.3 if c == 384 else 1.0)) for c, h, t in start_up_samples(CPU_LIKE, noise=0.0)]
    points, scatter = group_points(samples)
    assert detect_granule(points, scatter) == 1


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT])
def test_noise_alone_makes_no_tile(truth, seed):
    assert verdict_on(start_up_samples(truth, noise=0.10, seed=seed)).granule_tokens == 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("span", [3072, 6144])
def test_a_wave_step_at_a_profiled_size_is_found_and_a_chunk_past_it_costs_the_next_size(span, seed):
    """One token past a wave costs a whole wave: between the wave and the next profiled size the
    model must not offer a share of the jump (a chunk there would pay the wave for a few tokens)."""
    verdict = verdict_on(start_up_samples(Waves(span), noise=0.02, seed=seed))
    model = verdict.model
    nodes = model.chunk_tokens
    i = nodes.index(span)
    # Every wave that falls on a profiled size (3072 and 6144, or 6144) is a step, and nothing else is.
    assert [nodes[j] for j in model.steps] == [c for c in nodes[1:-1] if c % span == 0]
    assert f"a step after {span} tokens" in verdict.reason
    upper_ms = model.time_ms(nodes[i + 1], 0)
    assert model.time_ms(span + 1, 0) == model.time_ms(span + 500, 0) == upper_ms
    assert model.chunk_for_time(0, upper_ms * (1 - 1e-9)) == span
    rule = ChunkRule(model, LIMITS, 4)
    # The cheapest per token is a wave's end, which a grid of sizes would miss by a few tokens.
    assert rule.efficient_chunks().at(0) in [nodes[j] for j in model.steps]
    plan = plan_target(rule, [(0, 32_768)])
    assert all(not span < rule.chunk_alone(h, plan, model.fixed_ms) < nodes[i + 1] for h in range(0, 32_768, 1024))


def located_profile(truth, noise, seed):
    """A start-up profile, then the runs that place its steps, as ``initialise_profile`` measures them."""
    samples = start_up_samples(truth, noise=noise, seed=seed)
    first = verdict_on(samples).model
    rng = np.random.default_rng(seed + 100)
    runs = []

    def measure(chunk, history):
        runs.append((chunk, history))
        return truth.time_ms(chunk, history) * float(np.exp(noise * rng.standard_normal()))

    located = locate_runs(measure, first, repeats=2)
    assert [(c, h) for c, h, _ in located] == runs
    return first, verdict_on(samples + located), runs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("span", [2304, 2560, 2800])
def test_a_wave_between_profiled_sizes_is_placed_by_bisecting_its_segment(span, seed):
    """20 cores of 128-row tiles step every 2560 tokens, between the profiled 2048 and 3072: a few
    runs inside the segment place the jump, and chunks up to it cost what they do, not the wave after."""
    truth = Waves(span)
    first, verdict, runs = located_profile(truth, noise=0.03, seed=seed)
    # (2800: the second wave, 5600, falls between 4096 and 6144, a flat segment above it: a step too)
    assert [(first.chunk_tokens[i], first.chunk_tokens[i + 1]) for i in first.steps][:1] == [(2048, 3072)]
    assert 0 < len(runs) <= LOCATE_RUNS and all(2048 < c < 3072 and h == 0 for c, h in runs[:4])
    model = verdict.model
    lower, upper = model.chunk_tokens[model.steps[0]], model.chunk_tokens[model.steps[0] + 1]
    assert span - LOCATE_TOKENS < lower <= span and upper == 3072
    assert f"a step after {lower} tokens" in verdict.reason
    for history in model.history_tokens[::2]:
        # Up to the wave: within the noise of the truth (the upper size's time is about twice it): the size
        # placed is measured without history only (two runs of 3% noise), deeper it adds what its segment's
        # sizes add; past it: the upper size's time, at every profiled history.
        for chunk in (2100, lower):
            assert model.time_ms(chunk, history) == pytest.approx(truth.time_ms(chunk, history), rel=0.1)
        assert model.time_ms(lower + 1, history) == model.time_ms(3072, history)
    rule = ChunkRule(model, LIMITS, 4)
    plan = plan_target(rule, [(0, 32_768)])
    assert all(not lower < rule.chunk_alone(h, plan, model.fixed_ms) < 3072 for h in range(0, 32_768, 1024))


@pytest.mark.parametrize("seed", range(3))
def test_a_placed_waves_multiples_between_profiled_sizes_are_steps_too(seed):
    """Waves every 2560 tokens: the grid marks only 2048-3072 (the segments around 5120 and 7680
    hold a jump each, like growth that steepens); a run at each multiple and one just past it
    make them steps, so a chunk of two or three whole waves is offered at its own time."""
    truth = Waves(2560)
    _, verdict, runs = located_profile(truth, noise=0.03, seed=seed)
    model = verdict.model
    steps = [(model.chunk_tokens[i], model.chunk_tokens[i + 1]) for i in model.steps]
    assert steps == [(2560, 3072), (5120, 6144), (7680, 8192)] and len(runs) <= LOCATE_RUNS
    for lower, upper in steps:
        assert model.time_ms(lower, 0) == pytest.approx(truth.time_ms(lower, 0), rel=0.1)
        assert model.time_ms(lower + 1, 32_768) == model.time_ms(upper, 32_768)
    rule = ChunkRule(model, LIMITS, 2)
    plan = plan_target(rule, [(0, 131_072)])
    chunks = {int(rule.chunk_alone(h, plan, model.fixed_ms)) for h in range(0, 131_072, 2048)}
    assert not [c for c in chunks for lower, upper in steps if lower < c < upper]


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT])
def test_two_runs_close_together_on_smooth_growth_make_no_step(truth):
    """A pair of sizes 64 tokens apart inside a segment holds a small share of its growth."""
    samples = start_up_samples(truth, noise=0.0)
    pairs = [(c, 0, truth.time_ms(c, 0)) for c in (2560, 2624, 5120, 5184, 7680, 7744)]
    model = verdict_on(samples + pairs).model
    assert model.steps == () and model.chunk_tokens == verdict_on(samples).model.chunk_tokens


@pytest.mark.parametrize("seed", range(3))
def test_a_tile_the_probe_does_not_try_is_found_from_a_step_of_the_grid(seed):
    """96-token tiles: the probe tries 64 to 512 by powers of two, and none steps; the grid's step
    right after 96 makes the profile measure one token past 96 and past 192, and both jump."""
    first, verdict, runs = located_profile(Tiles(96, fixed_ms=2.0, token_ms=0.02), noise=0.03, seed=seed)
    assert [first.chunk_tokens[i] for i in first.steps][:1] == [96]
    assert sorted(set(runs)) == [(97, 0), (193, 0)] and len(runs) <= LOCATE_RUNS
    assert verdict.granule_tokens == 96


@dataclass(frozen=True)
class Switch:
    """A kernel that switches once, past 96 tokens: a step of the grid that does not recur."""

    def time_ms(self, chunk_tokens, history_tokens):
        return 2.0 + 0.004 * chunk_tokens + (2.0 if chunk_tokens > 96 else 0.0) + 3e-7 * chunk_tokens * history_tokens


def test_a_single_switch_after_a_small_size_is_no_tile():
    first, verdict, runs = located_profile(Switch(), noise=0.02, seed=0)
    assert [first.chunk_tokens[i] for i in first.steps][:1] == [96] and (97, 0) in runs
    assert verdict.granule_tokens == 1


@pytest.mark.parametrize("span", [3072, 6144])
def test_a_wave_on_a_profiled_size_stays_where_it_is(span):
    """Every run inside the segment is past the jump: the model is the one without them."""
    first, verdict, runs = located_profile(Waves(span), noise=0.02, seed=0)
    assert verdict.model.chunk_tokens == first.chunk_tokens and verdict.model.steps == first.steps
    assert 0 < len(runs) <= LOCATE_RUNS


def test_runs_that_contradict_each_other_place_the_jump_below_the_first_one_past_it():
    """Noise may put a run past the jump below one on its flat side: the lower reading wins."""
    truth = Waves(2560)
    samples = start_up_samples(truth, noise=0.0)
    first = verdict_on(samples).model
    flat, past = truth.time_ms(2048, 0), truth.time_ms(3072, 0)
    points, _ = group_points([*samples, (2304, 0, flat), (2560, 0, past), (2816, 0, flat)])
    model = locate_steps(first, points, first.steps)
    assert [model.chunk_tokens[i] for i in model.steps] == [2304]
    assert 2304 in model.chunk_tokens and 2816 not in model.chunk_tokens


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, BENT, Tiles(256)])
def test_smooth_growth_and_noise_make_no_step(truth, seed):
    """A surface whose growth steepens is steep beside the steeper segment too; noise makes no 30% jump."""
    assert verdict_on(start_up_samples(truth, noise=0.10, seed=seed)).model.steps == ()
    assert verdict_on(start_up_samples(truth, noise=0.0)).model.steps == ()


def test_the_decisions_are_judged_on_a_prompt_that_fills_the_history_in_use():
    rule = ChunkRule(verdict_on(start_up_samples(TRUE)).model, LIMITS, 4)
    assert reference_prompt_tokens(rule, MAX_HISTORY) == LIMITS.max_model_len
    assert schedule_ttft_ms(rule, rule.model, 10_000) > 0


@pytest.mark.parametrize("base", [8, 32, 33, 64, 96, 100, 126, 127, 128, 200, 2048])
def test_every_token_budget_keeps_every_profiled_size_in_its_model(base):
    """A small token budget fits fewer than three sizes half a base chunk deeper (a row of the model needs
    three): the deepest level then stays the base chunk's, so no profiled size drops out of the model."""
    samples = start_up_samples(TRUE, base_chunk_tokens=base, max_history_tokens=8192 - base, noise=0.0)
    assert sorted(model_of(samples).chunk_tokens) == chunk_ladder(base, 24)
