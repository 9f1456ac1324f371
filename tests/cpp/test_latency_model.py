"""LatencyModel: the fit's guards, its special cases, and the closed-form inverse."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from vllm_ascend.core.profiling_chunk_predictor import FitError, LatencyModel, batch_features

TRUE = LatencyModel(c0_ms=5.0, c1_ms=0.02, c2_ms=0.002, c3_ms=2e-6, c4_ms=3e-7)


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


def test_module_works_without_vllm_torch_or_torch_npu():
    import subprocess
    import sys

    from vllm_ascend.core import profiling_chunk_predictor

    script = (
        "import importlib.util, sys\n"
        "for name in ('vllm', 'torch', 'torch_npu', 'vllm_ascend'):\n"
        "    sys.modules[name] = None  # any import of them fails\n"
        f"spec = importlib.util.spec_from_file_location('alone', {profiling_chunk_predictor.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['alone'] = module\n"
        "spec.loader.exec_module(module)\n"
        "chunks = [512 * i for i in range(1, 11)]\n"
        "model = module.LatencyModel.fit(chunks, [0] * 10, [1 + 0.01 * c + 1e-5 * c * c for c in chunks])\n"
        "print(module.ChunkSizePredictor(model, base_chunk_size=4096, page_size=128, max_model_len=10**6,\n"
        "      max_num_scheduled_tokens=4096).next_chunk(0, 10**5))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4096"
