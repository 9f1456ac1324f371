"""LatencyModel: the fit's guards, its special cases, the closed-form inverse, and ``accept``."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from cpp_samples import TRUE, start_up_samples, timed
from vllm_ascend.core.profiling_chunk_predictor import FitError, LatencyModel, accept, batch_features


def noisy_samples(model, chunks, histories, repeats=3, noise=0.01, seed=0):
    rng = np.random.default_rng(seed)
    c, h, t = [], [], []
    for chunk in chunks:
        for history in histories:
            for _ in range(repeats):
                c.append(chunk)
                h.append(history)
                t.append(model.time_ms(chunk, history) * (1.0 + noise * rng.standard_normal()))
    return c, h, t


def assert_close_coefficients(fitted, expected, rel):
    for name in ("c0_ms", "c1_ms", "c2_ms", "c3_ms", "c4_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(expected, name), rel=rel, abs=0), name


def test_fit_recovers_known_coefficients_within_2_percent_from_noisy_samples():
    chunks = np.arange(256, 8192 + 1, 512)
    c, h, t = noisy_samples(TRUE, chunks, [0, 8192, 32768, 65536], repeats=3, noise=0.01)
    fitted = LatencyModel.fit(c, h, t)
    assert_close_coefficients(fitted, TRUE, rel=0.02)
    assert fitted.mape < 0.01


def test_fit_is_well_conditioned_for_lengths_up_to_a_million():
    true = LatencyModel(c0_ms=20.0, c1_ms=0.01, c2_ms=1e-4, c3_ms=1e-7, c4_ms=5e-8)
    chunks = np.linspace(4096, 1_000_000, 12).round()
    c, h, t = noisy_samples(true, chunks, [0, 250_000, 1_000_000], repeats=1, noise=0.0)
    fitted = LatencyModel.fit(c, h, t)
    assert_close_coefficients(fitted, true, rel=1e-6)


def test_without_history_samples_the_start_up_form_is_imposed():
    # f(l) = a l^2 + b l + c; a chunk after H tokens costs f(H + C) - f(H) (+ c once per step).
    a, b, c = 3e-6, 0.05, 4.0
    chunks = np.arange(512, 8192 + 1, 512)
    fitted = LatencyModel.fit(chunks, np.zeros_like(chunks), a * chunks**2 + b * chunks + c)
    assert fitted.c2_ms == 0.0
    assert fitted.c4_ms == 2.0 * fitted.c3_ms
    assert (fitted.c0_ms, fitted.c1_ms, fitted.c3_ms) == pytest.approx((c, b, a), rel=1e-6)

    def f(length):
        return a * length**2 + b * length + c

    for chunk, history in [(1000, 0), (2048, 50_000), (64, 131_072)]:
        assert fitted.time_ms(chunk, history) == pytest.approx(f(history + chunk) - f(history) + c, rel=1e-6)


def test_seed_online_form_is_a_special_case():
    # f(C, H) = a*C*(C + H) + b*(C + H) + c  ->  c3 = c4 = a, c1 = c2 = b, c0 = c.
    a, b, c = 2e-6, 0.01, 3.0
    chunks, histories = np.meshgrid(np.arange(256, 4097, 512), [0, 4096, 16384, 65536])
    chunks, histories = chunks.ravel(), histories.ravel()
    latency_ms = a * chunks * (chunks + histories) + b * (chunks + histories) + c
    fitted = LatencyModel.fit(chunks, histories, latency_ms)
    assert fitted.coefficients == pytest.approx((c, b, b, a, a), rel=1e-6)


def test_repeats_are_reduced_by_median_so_one_wild_repeat_does_not_count():
    chunks = np.arange(512, 8192 + 1, 512)
    c, h, t = noisy_samples(TRUE, chunks, [0, 16384], repeats=3, noise=0.0)
    t[0] *= 20.0  # a cold first run
    fitted = LatencyModel.fit(c, h, t)
    assert_close_coefficients(fitted, TRUE, rel=1e-6)


def test_a_single_wild_sample_cannot_move_the_target():
    chunks = np.arange(256, 8192 + 1, 256)
    c, h, t = noisy_samples(TRUE, chunks, [0], repeats=1, noise=0.005, seed=3)
    clean = LatencyModel.fit(c, h, t)
    for index, factor in [(0, 30.0), (len(t) - 1, 0.2), (len(t) // 2, 8.0)]:
        wild = list(t)
        wild[index] *= factor
        fitted = LatencyModel.fit(c, h, wild)
        assert fitted.time_ms(8192, 0) == pytest.approx(clean.time_ms(8192, 0), rel=0.01)


@pytest.mark.parametrize(
    ("chunks", "histories", "latencies", "message"),
    [
        ([2048] * 12, [0] * 12, list(np.linspace(50, 60, 12)), "distinct"),
        ([512 * i for i in range(1, 8)], [0] * 7, [10.0 * i for i in range(1, 8)], "distinct"),
        ([512 * i for i in range(1, 11)], [0] * 10, [10.0 * i - 20 for i in range(1, 11)], "latency_ms"),
        ([512 * i for i in range(1, 11)], [0] * 10, [math.nan] + [10.0 * i for i in range(2, 11)], "latency_ms"),
        ([512 * i for i in range(1, 11)], [0] * 10, [100.0 - 5 * i for i in range(1, 11)], "quadratic"),
        ([512 * i for i in range(1, 11)], [0] * 10, [10.0 * i for i in range(1, 11)], "quadratic"),
        ([512 * i for i in range(1, 11)], [0] * 9, [10.0 * i for i in range(1, 11)], "length"),
        ([512 * i for i in range(1, 11)], [0] * 10, [10.0, 100.0] * 5, "MAPE"),
        ([0] + [512 * i for i in range(1, 10)], [0] * 10, [10.0 * i for i in range(1, 11)], "chunk_tokens"),
    ],
    ids=[
        "all-equal-lengths",
        "fewer-than-8-points",
        "negative-latency",
        "nan-latency",
        "latency-falls-as-chunks-grow",
        "purely-linear",
        "unequal-lengths",
        "noise-only",
        "zero-chunk",
    ],
)
def test_degenerate_inputs_raise_fit_error_naming_the_rule(chunks, histories, latencies, message):
    with pytest.raises(FitError, match=message):
        LatencyModel.fit(chunks, histories, latencies)


def test_model_is_an_immutable_value_with_non_negative_coefficients():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TRUE.c0_ms = 1.0
    with pytest.raises(FitError, match="c1_ms"):
        LatencyModel(1.0, -0.1, 0.0, 1e-6, 0.0)
    with pytest.raises(FitError, match="quadratic"):
        LatencyModel(1.0, 0.1, 0.0, 0.0, 0.0)
    assert LatencyModel.from_dict(TRUE.to_dict()) == TRUE


def test_chunk_for_time_inverts_time_ms():
    for history in [0, 1000, 50_000, 500_000]:
        for target_ms in [TRUE.time_ms(64, history) + 1.0, 300.0, 5000.0]:
            chunk = TRUE.chunk_for_time(history, target_ms)
            if chunk > 0:
                assert TRUE.time_ms(chunk, history) == pytest.approx(target_ms, rel=1e-9)


def test_chunk_for_time_linear_when_c3_is_zero_and_floor_when_history_alone_is_over():
    linear_at_zero_history = LatencyModel(c0_ms=2.0, c1_ms=0.05, c2_ms=0.01, c3_ms=0.0, c4_ms=1e-6)
    assert linear_at_zero_history.chunk_for_time(0, 102.0) == pytest.approx(2000.0)
    assert linear_at_zero_history.chunk_for_time(20_000, 150.0) == 0.0  # 2 + 0.01*20000 > 150
    assert TRUE.chunk_for_time(0, TRUE.c0_ms) == 0.0


def test_batch_costs_count_the_step_overhead_once():
    pairs = [(2048, 0), (512, 8192), (1, 30_000), (1, 100)]
    expected = TRUE.c0_ms + sum(TRUE.time_ms(c, h) - TRUE.c0_ms for c, h in pairs)
    assert TRUE.batch_time_ms(pairs) == pytest.approx(expected)
    assert TRUE.batch_time_ms([]) == TRUE.c0_ms
    assert TRUE.features_time_ms(batch_features(pairs))[0] == pytest.approx(expected)
    assert TRUE.decode_ms(30_000) == pytest.approx(TRUE.time_ms(1, 30_000) - TRUE.c0_ms)
    assert TRUE.decode_ms(60_000) > TRUE.decode_ms(30_000)


def test_fit_on_batches_of_several_requests():
    rng = np.random.default_rng(7)
    rows, latency_ms = [], []
    for _ in range(40):
        pairs = [(int(rng.integers(1, 4096)), int(rng.integers(0, 65536))) for _ in range(int(rng.integers(1, 6)))]
        rows.append(batch_features(pairs))
        latency_ms.append(TRUE.batch_time_ms(pairs) * (1 + 0.005 * rng.standard_normal()))
    fitted = LatencyModel.fit_features(np.array(rows), latency_ms)
    for chunk, history in [(4096, 0), (1024, 60_000)]:
        assert fitted.time_ms(chunk, history) == pytest.approx(TRUE.time_ms(chunk, history), rel=0.02)


def test_model_and_acceptance_run_without_vllm_torch_or_torch_npu():
    """The twin simulator and the bench load the model alone: it must need numpy only."""
    import subprocess
    import sys

    from vllm_ascend.core import cpp_latency_model

    script = (
        "import importlib.util, sys\n"
        "for name in ('vllm', 'torch', 'torch_npu', 'vllm_ascend'):\n"
        "    sys.modules[name] = None  # any import of them fails\n"
        f"spec = importlib.util.spec_from_file_location('alone', {cpp_latency_model.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['alone'] = module\n"
        "spec.loader.exec_module(module)\n"
        "samples = [(c, h, 1 + 0.01 * c + 1e-4 * h + 1e-5 * c * c + 1e-7 * c * h)\n"
        "           for c in range(256, 4097, 256) for h in (0, 8192, 32768)]\n"
        "model = module.accept(samples, max_chunk_tokens=4096, max_history_tokens=32768)\n"
        "print(round(model.time_ms(4096, 0), 3))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(1 + 0.01 * 4096 + 1e-5 * 4096**2, rel=1e-6)


# ---------------------------------------------------------------- accept: the one acceptance rule
DOMAIN = {"max_chunk_tokens": 8192, "max_history_tokens": 65_536}


def test_eight_distinct_noisy_points_are_refused():
    """Eight points that span the range in use still cannot pin five terms down against 10% noise."""
    plan = [(c, h) for c in np.linspace(1024, 8192, 4).round() for h in (0, DOMAIN["max_history_tokens"])]
    for seed in range(5):
        with pytest.raises(FitError, match="unstable fit"):
            accept(timed(TRUE, plan, noise=0.10, seed=seed), **DOMAIN)


def test_a_profile_that_never_reached_the_history_in_use_is_refused():
    """Without history samples the history terms are a guess (c2 = 0, c4 = 2*c3): exact or not, refused."""
    plan = [(c, 0) for c in np.linspace(8192 / 12, 8192, 12).round()]
    with pytest.raises(FitError, match="history reaches 0 tokens"):
        accept(timed(TRUE, plan), **DOMAIN)
    accept(timed(TRUE, plan), max_chunk_tokens=8192, max_history_tokens=0)  # no history in use: fine


def test_a_dozen_noisy_points_are_refused_or_accepted_close_to_the_truth():
    """Whatever accept lets through from a handful of noisy points predicts the range in use within 25%."""
    plan = [(c, h) for c in np.linspace(8192 / 6, 8192, 6).round() for h in (0, DOMAIN["max_history_tokens"])]
    chunks, histories = np.meshgrid(np.geomspace(8192 / 6, 8192, 6), np.linspace(0, DOMAIN["max_history_tokens"], 5))
    accepted = 0
    for seed in range(20):
        try:
            model = accept(timed(TRUE, plan, noise=0.10, seed=seed), **DOMAIN)
        except FitError as error:
            assert "unstable fit" in str(error) or "fit error too large" in str(error)
            continue
        accepted += 1
        assert np.max(np.abs(model.time_ms(chunks, histories) / TRUE.time_ms(chunks, histories) - 1)) <= 0.25
    assert accepted >= 1


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.10])
def test_a_normal_start_up_profile_is_accepted_and_predicts_its_range(noise):
    """64 sizes x 3 repeats plus 4 histories x 2 sizes x 3 repeats, as ``initialise_profile`` runs them."""
    for seed in range(4):
        samples = start_up_samples(noise=noise, seed=seed)
        assert len(samples) == 64 * 3 + 4 * 2 * 3
        model = accept(samples, **DOMAIN)
        for chunk in (16, 256, 2048, 8192):
            for history in (0, 16_384, 65_536):
                assert model.time_ms(chunk, history) == pytest.approx(TRUE.time_ms(chunk, history), rel=0.15)


# A CPU-like step (fitted on the CPU engine at PP = 2): a large share of linear work.
CPU_LIKE = LatencyModel(c0_ms=10.0, c1_ms=0.087, c2_ms=0.0025, c3_ms=5e-5, c4_ms=1e-4)


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_leaving_out_the_smallest_chunk_is_extrapolation_not_instability(noise):
    """The smallest chunk runs 30% under the model's line (a CPU's short steps): a refit without
    it extrapolates there and moves by more than the limit, yet it is judged only where it measured.
    """
    domain = {"max_chunk_tokens": 2048, "max_history_tokens": 15_360}
    samples = start_up_samples(CPU_LIKE, base_chunk_tokens=2048, points=32, noise=noise, max_history_tokens=15_360)
    smallest = min(c for c, _, _ in samples)
    samples = [(c, h, t * 0.7 if (c, h) == (smallest, 0) else t) for c, h, t in samples]
    full = LatencyModel.fit(*(np.array(column, dtype=float) for column in zip(*samples, strict=True)))
    rest = [row for row in samples if (row[0], row[1]) != (smallest, 0)]
    without = LatencyModel.fit(*(np.array(column, dtype=float) for column in zip(*rest, strict=True)))
    assert without.time_ms(smallest, 0) / full.time_ms(smallest, 0) - 1 > 0.25  # what used to refuse it
    model = accept(samples, **domain)
    chunks, histories = np.meshgrid(np.geomspace(2 * smallest, 2048, 6), np.linspace(0, 15_360, 5))
    error = np.abs(model.time_ms(chunks, histories) / CPU_LIKE.time_ms(chunks, histories) - 1)
    assert np.max(error) <= 0.25  # the limit the rule stands for


def test_a_smallest_chunk_that_bends_the_whole_fit_is_still_refused():
    """Far enough off (40% under the line) the point drags the full fit off the other points: refused."""
    domain = {"max_chunk_tokens": 2048, "max_history_tokens": 15_360}
    samples = start_up_samples(CPU_LIKE, base_chunk_tokens=2048, points=32, noise=0.0, max_history_tokens=15_360)
    smallest = min(c for c, _, _ in samples)
    samples = [(c, h, t * 0.6 if (c, h) == (smallest, 0) else t) for c, h, t in samples]
    with pytest.raises(FitError, match="unstable fit"):
        accept(samples, **domain)


def outcome(samples, max_history_tokens):
    try:
        accept(samples, max_chunk_tokens=8192, max_history_tokens=max_history_tokens)
    except FitError as error:
        return str(error)
    return "accepted"


def test_history_measured_only_to_8k_is_refused_for_a_64k_range():
    for seed in range(5):
        short = start_up_samples(max_history_tokens=8192, noise=0.02, seed=seed)
        assert outcome(short, 8192) == "accepted"
        for max_history_tokens in (65_536, 262_144):
            assert "history reaches 8192 tokens" in outcome(short, max_history_tokens)
        # The same noise with history measured over the whole range passes: the refusal is about reach.
        assert outcome(start_up_samples(max_history_tokens=65_536, noise=0.02, seed=seed), 65_536) == "accepted"


@pytest.mark.parametrize(
    "bad_ms", [1e300, 1e7, math.inf, -math.inf, math.nan], ids=["huge", "3-hours", "inf", "-inf", "nan"]
)
def test_latency_samples_that_are_not_measurements_are_refused_with_fit_error(bad_ms):
    samples = start_up_samples()
    samples[10] = (samples[10][0], samples[10][1], bad_ms)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way to the refusal
        with pytest.raises(FitError, match="latency"):
            accept(samples, **DOMAIN)


@pytest.mark.parametrize(
    "bad_sample",
    [
        pytest.param((10**400, 0, 50.0), id="integer-too-large-for-a-float"),
        pytest.param((1e300, 0, 50.0), id="chunk-1e300"),
        pytest.param((8192, 1e300, 50.0), id="history-1e300"),
        pytest.param((8192, -5, 50.0), id="negative-history"),
        pytest.param(("many", 0, 50.0), id="text"),
        pytest.param((8192, 0), id="two-fields"),
    ],
)
def test_one_sample_with_impossible_token_counts_gives_fit_error_or_the_same_model(bad_sample):
    """A cached profile is untrusted input: accept refuses it (FitError) or the bad row cannot move the model."""
    samples = start_up_samples()
    samples[10] = bad_sample
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow on the way
        try:
            model = accept(samples, **DOMAIN)
        except FitError:
            return
    for chunk, history in [(16, 0), (8192, 0), (2048, 65_536)]:
        assert model.time_ms(chunk, history) == pytest.approx(TRUE.time_ms(chunk, history), rel=0.02)


def _cpp_settings() -> dict:
    from vllm_ascend.config_table import settings
    from vllm_ascend.core.cpp_config import CppConfig

    return settings(CppConfig)


@pytest.mark.parametrize("extra", [0, 1, 48])
def test_every_profile_the_config_allows_is_accepted_when_measured_exactly(extra):
    """The fewest profile points and history lengths the config allows still pass accept when exact."""
    low = {key: int(_cpp_settings()[key][1].low) for key in ("profile_points", "profile_history_points")}
    samples = start_up_samples(
        points=low["profile_points"] + extra, repeats=1, history_points=low["profile_history_points"], noise=0.0
    )
    model = accept(samples, **DOMAIN)
    assert model.time_ms(8192, 0) == pytest.approx(TRUE.time_ms(8192, 0), rel=1e-6)
