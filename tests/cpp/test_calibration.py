"""OnlineCalibration: timed steps refine the accepted model, within bounds, never on a few odd steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cpp_samples import TRUE, start_up_samples
from vllm_ascend.core.cpp_calibration import PROFILE, STEP, OnlineCalibration
from vllm_ascend.core.cpp_latency_model import LatencyModel, accept, batch_features

BASE_CHUNK_TOKENS = 8192
PROFILE_SAMPLES = start_up_samples()
PROFILED = accept(PROFILE_SAMPLES, max_chunk_tokens=BASE_CHUNK_TOKENS, max_history_tokens=65_536)


def calibration(**overrides):
    kwargs = dict(reference_chunk_tokens=BASE_CHUNK_TOKENS, window_size=30, refit_every=8, max_shift=0.25)
    kwargs.update(overrides)
    return OnlineCalibration(PROFILED, PROFILE_SAMPLES, **kwargs)


def mixed_steps(model, count, seed=1, extra_ms=0.0):
    """Steps as the scheduler times them: one prefill chunk with history plus up to 7 decodes; 1% noise."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(count):
        pairs = [(int(rng.integers(256, 8192)), int(rng.integers(0, 65_536)))]
        pairs += [(1, int(rng.integers(100, 60_000))) for _ in range(int(rng.integers(0, 8)))]
        steps.append((pairs, (model.batch_time_ms(pairs) + extra_ms) * (1 + 0.01 * rng.standard_normal())))
    return steps


def test_the_window_is_bounded_and_never_below_what_a_fit_needs():
    calib = calibration(window_size=16)
    for pairs, ms in mixed_steps(TRUE, 40):
        calib.record(pairs, ms)
    assert len(calib.window) == 16
    assert calibration(window_size=3).window.maxlen == 8  # a refit needs 8 distinct points


def test_rows_carry_their_source_and_profile_rows_never_leave():
    calib = calibration(window_size=10)
    steps = mixed_steps(TRUE, 25)
    for pairs, ms in steps:
        calib.record(pairs, ms)
    rows = calib.rows()
    profile_rows = [row for row in rows if row.source == PROFILE]
    step_rows = [row for row in rows if row.source == STEP]
    assert len(profile_rows) == len(PROFILE_SAMPLES) and len(step_rows) == 10
    assert all(
        np.array_equal(row.features, batch_features([(c, h)]))
        for row, (c, h, _) in zip(profile_rows, PROFILE_SAMPLES, strict=True)
    )
    assert [row.measured_ms for row in step_rows] == [ms for _, ms in steps[-10:]]  # the newest steps


def test_a_series_of_small_batches_never_moves_the_model():
    """Health checks: 16 tiny prompts timed with a large fixed overhead say nothing of the batches CPP sizes."""
    calib = calibration()
    for index in range(16):
        calib.record([(16 + index, 0)], 35.0)
    for chunk, history in [(BASE_CHUNK_TOKENS, 0), (2048, 32_768), (64, 0)]:
        assert calib.model.time_ms(chunk, history) == pytest.approx(PROFILED.time_ms(chunk, history), rel=0.02)


def test_online_steps_with_a_cost_the_profile_never_saw_are_learned():
    calib = calibration()
    steps = mixed_steps(TRUE, 64, seed=4, extra_ms=30.0)  # every real step also pays 30 ms (sampling, ...)
    assert calib.record(*steps[0]) is None
    for pairs, ms in steps[1:]:
        calib.record(pairs, ms)
    assert calib.model != PROFILED
    assert calib.window_error(calib.model) < 0.03 < calib.window_error(PROFILED)
    assert calib.model.time_ms(BASE_CHUNK_TOKENS, 0) == pytest.approx(
        TRUE.time_ms(BASE_CHUNK_TOKENS, 0) + 30.0, rel=0.05
    )


@pytest.mark.parametrize(("max_shift", "adopted"), [(0.25, False), (2.0, True)])
def test_a_refit_that_would_move_the_reference_time_beyond_max_shift_is_not_adopted(max_shift, adopted):
    """Steps twice as slow as the profile (another job on the device): a refit fits them but moves 100%."""
    calib = calibration(max_shift=max_shift)
    slower = LatencyModel(*(2 * c for c in TRUE.coefficients))
    for pairs, ms in mixed_steps(slower, 16):
        calib.record(pairs, ms)
    reference_ms = calib.model.time_ms(BASE_CHUNK_TOKENS, 0)
    expected_ms = (slower if adopted else PROFILED).time_ms(BASE_CHUNK_TOKENS, 0)
    assert reference_ms == pytest.approx(expected_ms, rel=0.03)


@pytest.mark.parametrize("candidate_is_better", [True, False])
def test_a_refit_is_adopted_only_if_it_predicts_the_window_better(monkeypatch, candidate_is_better):
    calib = calibration()
    current = calib.model
    slower_history = LatencyModel(current.c0_ms, current.c1_ms, 0.003, current.c3_ms, 6e-7)
    overshoot = LatencyModel(current.c0_ms, current.c1_ms, 0.006, current.c3_ms, 1.2e-6)
    truth = slower_history if candidate_is_better else current  # the steps are timed on this
    candidate = slower_history if candidate_is_better else overshoot  # every refit proposes this
    monkeypatch.setattr(LatencyModel, "fit_features", classmethod(lambda cls, rows, ms: candidate))
    results = [calib.record(pairs, ms) for pairs, ms in mixed_steps(truth, 8)]
    assert results == [None] * 7 + [candidate if candidate_is_better else None]  # one refit per 8 steps
    assert calib.model == (candidate if candidate_is_better else current)


@pytest.mark.parametrize(
    ("pairs", "measured_ms"),
    [
        ([(1024, 0)], math.nan),
        ([(1024, 0)], math.inf),
        ([(1024, 0)], 0.0),
        ([(1024, 0)], -3.0),
        ([], 3.0),
        ([(0, 5000)], 3.0),
    ],
    ids=["nan", "inf", "zero", "negative", "no-requests", "no-tokens"],
)
def test_steps_that_are_not_measurements_are_ignored(pairs, measured_ms):
    calib = calibration(refit_every=1)
    assert calib.record(pairs, measured_ms) is None
    assert len(calib.window) == 0 and calib.model == PROFILED
