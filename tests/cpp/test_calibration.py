"""OnlineCalibration: timed steps refine the measured table where they ran, within bounds, never on odd steps."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from cpp_samples import NPU_LIKE, TRUE, measured_model, start_up_samples
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_calibration import MIN_WINDOW, OnlineCalibration
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule

PROFILED = measured_model(TRUE, noise=0.0)


def calibration(**overrides):
    kwargs = dict(window_size=30, refit_every=8, max_shift=0.25)
    kwargs.update(overrides)
    return OnlineCalibration(PROFILED, **kwargs)


def mixed_steps(truth_ms, count, seed=1, noise=0.01):
    """Steps as the scheduler times them: one prefill chunk with history plus up to 7 decodes."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(count):
        pairs = [(int(rng.integers(256, 8192)), int(rng.integers(0, 65_536)))]
        pairs += [(1, int(rng.integers(100, 60_000))) for _ in range(int(rng.integers(0, 8)))]
        steps.append((pairs, truth_ms(pairs) * (1 + noise * rng.standard_normal())))
    return steps


def test_the_window_is_bounded_and_never_below_what_a_correction_needs():
    calib = calibration(window_size=16)
    for pairs, ms in mixed_steps(PROFILED.batch_time_ms, 40):
        calib.record(pairs, ms)
    assert len(calib.window) == 16
    assert calibration(window_size=3).window.maxlen == MIN_WINDOW


def test_steps_the_model_already_predicts_never_move_it():
    calib = calibration()
    adopted = [calib.record(pairs, ms) for pairs, ms in mixed_steps(PROFILED.batch_time_ms, 60)]
    assert not any(adopted) and calib.model is PROFILED


def test_a_device_slower_than_its_profile_is_learned_where_the_steps_ran():
    """Real data runs 20% slower than the profile's dummy inputs: after a window the model predicts it."""
    slower = 1.2
    calib = calibration()
    steps = mixed_steps(lambda pairs: slower * PROFILED.batch_time_ms(pairs), 40)
    for pairs, ms in steps:
        calib.record(pairs, ms)
    assert calib.refits_adopted >= 1
    assert calib.window_error(calib.model) < 0.5 * calib.window_error(PROFILED)
    # Where the steps ran (chunks of 256 to 8192) the table moved; within max_shift.
    assert calib.model.time_ms(4096, 30_000) == pytest.approx(slower * PROFILED.time_ms(4096, 30_000), rel=0.08)
    grid_ratio = np.array(calib.model.step_ms) / np.array(PROFILED.step_ms)
    assert grid_ratio.max() <= 1.25 + 1e-9 and grid_ratio.min() >= 1 / 1.25 - 1e-9


def test_a_series_of_small_batches_moves_only_the_points_around_them():
    """Health checks: tiny prompts timed with a large overhead say nothing of the batches CPP sizes."""
    calib = calibration()
    for index in range(40):
        calib.record([(16 + index % 3, 0)], PROFILED.time_ms(16, 0) + 30.0)
    rule, corrected = ChunkRule(PROFILED, ChunkLimits(8192, 73_728), 4), calib.corrected()
    assert corrected.time_ms(4096, 30_000) == pytest.approx(PROFILED.time_ms(4096, 30_000), rel=1e-9)
    assert corrected.chunk_for_time(30_000, rule.plan(200.0).target_ms) == pytest.approx(
        PROFILED.chunk_for_time(30_000, 200.0), rel=1e-6
    )


def test_the_first_steps_of_a_prompt_leave_the_table_away_from_them_as_profiled():
    """A prompt's first steps, of one size and within the first interval between the profile's history
    levels, run faster than the table's line between those two levels says (history costs less at first
    than the line through the levels): the points around them move, the rest of the table does not."""
    calib = calibration()
    for index in range(MIN_WINDOW):
        history = 256 * index
        calib.record([(256, history)], PROFILED.time_ms(256, history) * (0.88 if history else 1.0))
    assert calib.refits_adopted == 1 and calib.window_error(calib.model) < calib.window_error(PROFILED) / 2
    for chunk, history in ((4096, 50_000), (8192, 65_536), (1024, 30_000)):
        assert calib.model.time_ms(chunk, history) == pytest.approx(PROFILED.time_ms(chunk, history), rel=1e-9)


def test_a_correction_moves_a_size_measured_between_levels_with_its_levels():
    """The profile measured 384 tokens half-way between two levels (how far an odd point there reaches): a
    device 20% slower than its profile moves it as it moves the levels around it, at its measured ratio."""
    level = PROFILED.history_tokens[1]
    between = replace(PROFILED, reach=((384, level // 2, 0.8),))
    calib = OnlineCalibration(between, window_size=30, refit_every=8, max_shift=0.25)
    for pairs, ms in mixed_steps(lambda pairs: 1.2 * between.batch_time_ms(pairs), 40):
        calib.record(pairs, ms)
    assert calib.refits_adopted >= 1 and calib.model.reach == between.reach
    line_ms = (calib.model.time_ms(384, 0) + calib.model.time_ms(384, level)) / 2
    assert calib.model.time_ms(384, level // 2) == pytest.approx(0.8 * line_ms, rel=1e-9)


def test_a_correction_keeps_the_odd_points_a_profile_kept():
    """A size faster than a smaller one in every run of the profile is the device's: a device slower on real
    data than on the profile moves it with the rest, and does not average it away."""
    samples = [(c, h, t * (0.4 if c == 2048 else 1.0)) for c, h, t in start_up_samples(TRUE, noise=0.0)]
    profiled = judge(samples, ChunkLimits(8192, 73_728), 4, max_history_tokens=65_536, last_round=True).model
    assert (2048, 0) in profiled.odd_points
    calib = OnlineCalibration(profiled, window_size=30, refit_every=8, max_shift=0.25)
    for pairs, ms in mixed_steps(lambda pairs: 1.2 * profiled.batch_time_ms(pairs), 40):
        calib.record(pairs, ms)
    assert calib.refits_adopted >= 1 and calib.model.odd_points == profiled.odd_points
    assert calib.model.time_ms(2048, 30_000) < calib.model.time_ms(1536, 30_000)


def test_a_correction_is_adopted_only_if_it_halves_the_error_on_the_window_or_lowers_it_beyond_noise(monkeypatch):
    calib = calibration()
    monkeypatch.setattr(OnlineCalibration, "corrected", lambda self: self.model)  # a correction that helps nothing
    for pairs, ms in mixed_steps(lambda pairs: 1.3 * PROFILED.batch_time_ms(pairs), 40):
        assert calib.record(pairs, ms) is None
    assert calib.refits_adopted == 0
    calib = calibration()
    nudged = replace(  # 1% slower everywhere: helps, by less than noise shows
        PROFILED,
        step_ms=tuple(tuple(1.01 * t for t in row) for row in PROFILED.step_ms),
        fixed_ms=1.01 * PROFILED.fixed_ms,
    )
    monkeypatch.setattr(OnlineCalibration, "corrected", lambda self: nudged if self.model is PROFILED else self.model)
    for pairs, ms in mixed_steps(lambda pairs: 1.3 * PROFILED.batch_time_ms(pairs), 40):
        assert calib.record(pairs, ms) is None
    assert calib.refits_adopted == 0


@pytest.mark.parametrize("sigma", [0.2, 0.3])
def test_noise_around_an_unbiased_model_is_never_taken_for_a_correction(sigma):
    """A table fitted to the window lowers its error there by the window's own noise: with steps scattered
    +-20-30% around the profile that is over 5 points, yet the device is the profile."""
    calib = calibration()
    for pairs, ms in mixed_steps(PROFILED.batch_time_ms, 2000, seed=3, noise=sigma):
        calib.record(pairs, ms)
    assert calib.refits_adopted == 0 and calib.model is PROFILED


@pytest.mark.parametrize("slower", [1.6, 3.0])
def test_a_device_several_times_slower_than_its_profile_is_learned_over_a_few_refits(slower):
    """One refit moves a point by at most max_shift (25%), short of halving a 3x error: each one that lowers
    it beyond noise is taken and the next starts from it, so the model gets there."""
    calib = calibration()
    for pairs, ms in mixed_steps(lambda pairs: slower * PROFILED.batch_time_ms(pairs), 120):
        calib.record(pairs, ms)
    assert calib.refits_adopted >= 2
    assert calib.window_error(calib.model) < 0.05


@pytest.mark.parametrize(
    "pairs, measured_ms",
    [
        ([(1024, 0)], math.nan),
        ([(1024, 0)], -5.0),
        ([(1024, 0)], 1e-320),
        ([(1024, 0)], math.inf),
        ([], 10.0),
        ([(0, 0)], 10.0),
        ([(1024, -1)], 10.0),
        ([(1024.5, 0)], 10.0),
    ],
)
def test_steps_that_are_not_measurements_are_ignored(pairs, measured_ms):
    calib = calibration()
    assert calib.record(pairs, measured_ms) is None
    assert len(calib.window) == 0


NPU_PROFILED = measured_model(NPU_LIKE, noise=0.0)  # a fixed cost that dominates


def per_request_truth(floor_ms, profiled=NPU_PROFILED):
    """A device on which every request in a step costs at least ``floor_ms`` (a tile, a kernel per
    sequence): a step alone costs what the profile measured, a step of n requests (n - 1) floors more."""

    def truth_ms(pairs):
        return profiled.batch_time_ms(pairs) + floor_ms * (len(pairs) - 1)

    return truth_ms


@pytest.mark.parametrize("share", [0.4, 0.1])
def test_what_every_request_costs_at_least_is_learned_from_steps_of_several_requests(share):
    """The profile times one request per step, so its fixed cost holds what a step pays once and
    what each request pays at least; steps carrying decodes tell the two apart, even where the
    model is off by less than a grid correction would chase (share 0.1)."""
    floor_ms = share * NPU_PROFILED.fixed_ms
    truth = per_request_truth(floor_ms)
    calib = OnlineCalibration(NPU_PROFILED, window_size=30, refit_every=8, max_shift=0.25)
    for pairs, ms in mixed_steps(truth, 40, noise=0.002):
        calib.record(pairs, ms)
    assert calib.refits_adopted >= 1
    assert calib.model.fixed_ms == pytest.approx(NPU_PROFILED.fixed_ms - floor_ms, rel=0.05)
    assert calib.window_error(calib.model) < 0.5 * calib.window_error(NPU_PROFILED)
    # A prefill chunk with seven decodes: the decodes' floors are in the prediction now.
    step = [(2048, 20_000)] + [(1, 30_000)] * 7
    assert calib.model.batch_time_ms(step) == pytest.approx(truth(step), rel=0.01)
    assert NPU_PROFILED.batch_time_ms(step) < (1 - 0.6 * share) * truth(step)


@pytest.mark.parametrize("slower", [1.0, 1.2])
def test_the_fixed_cost_stays_whole_where_requests_cost_nothing_more(slower):
    calib = OnlineCalibration(NPU_PROFILED, window_size=30)
    for pairs, ms in mixed_steps(lambda pairs: slower * NPU_PROFILED.batch_time_ms(pairs), 30, noise=0.0):
        calib.record(pairs, ms)
    assert calib.shared_fixed_ms(NPU_PROFILED) == pytest.approx(NPU_PROFILED.fixed_ms, rel=1e-6)


def test_one_odd_step_or_deeper_decodes_never_split_the_fixed_cost():
    """A single slow step of two requests in a window of single ones, or decodes that cost more at
    depth than profiled (no floor at all): neither moves the fixed cost."""
    calib = OnlineCalibration(NPU_PROFILED, window_size=30)
    for index in range(29):
        pairs = [(512 * (1 + index % 8), 1000 * index)]
        calib.record(pairs, NPU_PROFILED.batch_time_ms(pairs))
    calib.record([(2048, 8000), (1, 9000)], 1.3 * NPU_PROFILED.batch_time_ms([(2048, 8000), (1, 9000)]))
    assert calib.shared_fixed_ms(NPU_PROFILED) == NPU_PROFILED.fixed_ms

    def deeper_decodes_ms(pairs):  # each decode's attention over its history costs 3x the profile
        decodes = sum(NPU_PROFILED.request_ms(c, h) - NPU_PROFILED.request_ms(c, 0) for c, h in pairs if c == 1)
        return NPU_PROFILED.batch_time_ms(pairs) + 2.0 * decodes

    calib = OnlineCalibration(NPU_PROFILED, window_size=30)
    for pairs, ms in mixed_steps(deeper_decodes_ms, 30, noise=0.0):
        calib.record(pairs, ms)
    assert calib.shared_fixed_ms(NPU_PROFILED) == pytest.approx(NPU_PROFILED.fixed_ms, rel=0.05)


def test_steps_of_one_request_each_leave_the_split_as_profiled():
    calib = OnlineCalibration(NPU_PROFILED, window_size=30)
    for index in range(20):
        pairs = [(512 * (1 + index % 8), 1000 * index)]
        calib.record(pairs, NPU_PROFILED.batch_time_ms(pairs) * 1.1)
    assert calib.shared_fixed_ms(NPU_PROFILED) == NPU_PROFILED.fixed_ms
    assert calib.split() is calib.model
