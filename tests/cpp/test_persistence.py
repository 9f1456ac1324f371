"""ProfilingChunkManager: start-up fit, online calibration and the cached profile."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
from vllm_ascend.core import profiling_chunk_predictor
from vllm_ascend.core.profiling_chunk_predictor import (
    PROFILE_SCHEMA_VERSION,
    LatencyModel,
    ProfilingChunkManager,
    make_fingerprint,
)

TRUE = LatencyModel(c0_ms=5.0, c1_ms=0.02, c2_ms=0.001, c3_ms=1e-6, c4_ms=2e-6)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def warnings_logged():
    """Warnings of the module's logger, whichever logger it is (vLLM's does not propagate)."""
    handler = _Records()
    profiling_chunk_predictor.logger.addHandler(handler)
    yield handler.records
    profiling_chunk_predictor.logger.removeHandler(handler)


def fingerprint(**overrides):
    values = dict(
        model="Qwen/Qwen3-8B",
        dtype="bfloat16",
        quantization=None,
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        max_num_batched_tokens=8192,
        block_size=128,
        vllm_version="0.23.0",
        vllm_ascend_version="0.23.0+cpp",
        device_name="Ascend910B3",
        cann_version="8.3.RC1",
    )
    values.update(overrides)
    return make_fingerprint(**values)


def manager(**overrides):
    kwargs = dict(
        base_chunk_size=8192,
        page_size=128,
        max_model_len=262_144,
        max_num_scheduled_tokens=8192,
        fingerprint=fingerprint(),
    )
    kwargs.update(overrides)
    return ProfilingChunkManager(**kwargs)


def start_up_samples(model=TRUE, seed=0):
    """64 sizes from the base chunk down (like a start-up profile), after one cold warm-up run."""
    rng = np.random.default_rng(seed)
    sizes = [8192 - i * 128 for i in range(64)]
    samples = [(8192, 0, 50.0 * model.time_ms(8192, 0))]  # warm-up: far too slow
    samples += [(c, 0, model.time_ms(c, 0) * (1 + 0.01 * rng.standard_normal())) for c in sizes]
    return samples


def fitted_manager(**overrides):
    mgr = manager(**overrides)
    assert mgr.fit_profile(start_up_samples())
    return mgr


def test_no_predictor_until_a_fit_is_accepted(warnings_logged):
    mgr = manager()
    assert mgr.predictor is None
    assert not mgr.fit_profile([(1024, 0, 10.0)] * 20)
    assert mgr.predictor is None
    assert "distinct" in mgr.last_error
    assert len(warnings_logged) == 1
    assert "distinct" in warnings_logged[0].getMessage()


def test_start_up_fit_drops_the_warm_up_run_and_sets_the_target():
    mgr = fitted_manager()
    predictor = mgr.predictor
    assert predictor is not None
    assert predictor.target_ms == pytest.approx(mgr.model.time_ms(8192, 0))
    # start-up form: c4 = 2*c3, c2 = 0, and the target matches the true time of a base chunk
    assert mgr.model.c4_ms == 2 * mgr.model.c3_ms and mgr.model.c2_ms == 0
    assert predictor.target_ms == pytest.approx(TRUE.time_ms(8192, 0), rel=0.01)
    assert len(mgr.profile_samples) == 64


def test_save_and_load_round_trip(tmp_path):
    mgr = fitted_manager()
    path = tmp_path / "profile.json"
    mgr.save(path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == PROFILE_SCHEMA_VERSION
    assert data["fingerprint"] == fingerprint()
    assert data["target_ms"] == pytest.approx(mgr.target_ms)
    assert len(data["samples"]) == 64

    fresh = manager()
    assert fresh.load_cached(path)
    assert fresh.model == mgr.model
    assert fresh.target_ms == mgr.target_ms
    assert fresh.profile_samples == mgr.profile_samples
    assert fresh.predictor.next_chunk(30_000, 100_000) == mgr.predictor.next_chunk(30_000, 100_000)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda text: text[: len(text) // 2], "Expecting|Unterminated|delimiter"),
        (lambda text: "[1, 2, 3]", "JSON object"),
        (lambda text: text.replace(f'"schema_version": {PROFILE_SCHEMA_VERSION}', '"schema_version": 99'), "schema"),
        (lambda text: text.replace('"tensor_parallel_size": 4', '"tensor_parallel_size": 8'), "fingerprint"),
        (lambda text: text.replace('"c1_ms": ', '"c1_ms": -'), "c1_ms"),
        (lambda text: text.replace('"coefficients"', '"coefs"'), "coefficients"),
    ],
    ids=["truncated", "not-an-object", "other-schema", "other-fingerprint", "negative-coefficient", "missing-key"],
)
def test_a_bad_cached_profile_is_ignored_with_one_warning(tmp_path, warnings_logged, mutate, reason):
    path = tmp_path / "profile.json"
    fitted_manager().save(path)
    path.write_text(mutate(path.read_text()))
    fresh = manager()
    assert not fresh.load_cached(path)
    warnings = warnings_logged
    assert len(warnings) == 1
    assert "ignoring cached profile" in warnings[0].getMessage()
    assert re.search(reason, warnings[0].getMessage())
    assert fresh.predictor is None


def test_a_missing_cache_file_is_quietly_absent(tmp_path, warnings_logged):
    assert not manager().load_cached(tmp_path / "nothing.json")
    assert not warnings_logged


def test_another_base_chunk_does_not_reuse_the_profile(tmp_path):
    path = tmp_path / "profile.json"
    fitted_manager().save(path)
    assert not manager(base_chunk_size=4096).load_cached(path)


def history_batches(model, count, seed=1):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        pairs = [(int(rng.integers(256, 8192)), int(rng.integers(0, 131_072)))]
        pairs += [(1, int(rng.integers(100, 100_000))) for _ in range(int(rng.integers(0, 8)))]  # decodes
        batches.append((pairs, model.batch_time_ms(pairs) * (1 + 0.01 * rng.standard_normal())))
    return batches


def test_online_calibration_learns_the_history_terms():
    mgr = fitted_manager()
    start_up = mgr.model
    adopted = [mgr.record_batch(pairs, ms) for pairs, ms in history_batches(TRUE, 64)]
    assert any(adopted)
    assert mgr.model != start_up
    assert len(mgr.window) == 64
    for chunk, history in [(2048, 100_000), (8192, 50_000)]:
        assert mgr.model.time_ms(chunk, history) == pytest.approx(TRUE.time_ms(chunk, history), rel=0.03)
    assert mgr.target_ms == pytest.approx(TRUE.time_ms(8192, 0), rel=0.01)


def test_online_steps_with_a_cost_the_profile_never_saw_are_learned_from_the_window():
    mgr = fitted_manager()
    batches = history_batches(TRUE, 64, seed=4)
    for pairs, ms in batches:  # every real step also pays 30 ms (sampling, scheduling, ...)
        mgr.record_batch(pairs, ms + 30.0)
    assert mgr.window_mape(mgr.model) < 0.03
    assert mgr.target_ms == pytest.approx(TRUE.time_ms(8192, 0) + 30.0, rel=0.05)


def test_without_an_accepted_profile_the_window_never_sets_a_model():
    mgr = manager()
    assert not any(mgr.record_batch(pairs, ms) for pairs, ms in history_batches(TRUE, 64))
    assert mgr.predictor is None and len(mgr.window) == 64


def test_the_window_is_bounded():
    mgr = fitted_manager(window_size=16)
    for pairs, ms in history_batches(TRUE, 40):
        mgr.record_batch(pairs, ms)
    assert len(mgr.window) == 16


def test_a_handful_of_small_batches_never_moves_the_target():
    mgr = fitted_manager()
    target_ms = mgr.target_ms
    for index in range(16):  # health checks: tiny prompts, timed with a big fixed overhead
        mgr.record_batch([(16 + index, 0)], 35.0)
    assert mgr.target_ms == pytest.approx(target_ms, rel=0.02)


@pytest.mark.parametrize("candidate_is_better", [True, False])
def test_a_refit_is_adopted_only_if_it_predicts_the_window_better(monkeypatch, candidate_is_better):
    mgr = fitted_manager(refit_every=8)
    current = mgr.model
    slower_history = LatencyModel(current.c0_ms, current.c1_ms, 0.002, current.c3_ms, 3e-6)
    overshoot = LatencyModel(current.c0_ms, current.c1_ms, 0.004, current.c3_ms, 6e-6)
    # The window is timed from `truth`; the refit proposes `candidate`.
    truth = slower_history if candidate_is_better else current
    candidate = slower_history if candidate_is_better else overshoot
    monkeypatch.setattr(LatencyModel, "fit_features", classmethod(lambda cls, rows, ms: candidate))
    results = [mgr.record_batch(pairs, ms) for pairs, ms in history_batches(truth, 8)]
    assert results == [False] * 7 + [candidate_is_better]
    assert mgr.model == (candidate if candidate_is_better else current)


def test_a_refit_that_would_move_the_target_too_far_is_not_adopted(monkeypatch):
    mgr = fitted_manager(refit_every=8)
    current = mgr.model
    truth = LatencyModel(current.c0_ms * 40, current.c1_ms * 2, 0.0, current.c3_ms * 2, current.c4_ms * 2)
    monkeypatch.setattr(LatencyModel, "fit_features", classmethod(lambda cls, rows, ms: truth))
    assert not any(mgr.record_batch(pairs, ms) for pairs, ms in history_batches(truth, 8))
    assert mgr.model == current


def test_feature_vectors_and_bad_times_in_record_batch():
    mgr = fitted_manager()
    assert not mgr.record_batch([(1024, 0)], float("nan"))
    assert not mgr.record_batch([(1024, 0)], -3.0)
    assert not mgr.record_batch([], 3.0)
    assert len(mgr.window) == 0
    mgr.record_batch(np.array([1.0, 1024.0, 0.0, 1024.0**2, 0.0]), 30.0)
    assert len(mgr.window) == 1


def test_malformed_input_degrades_with_one_warning_never_a_crash(warnings_logged):
    mgr = fitted_manager()
    assert not mgr.record_batch([("a lot", 0)], 30.0)
    assert not mgr.record_batch([(1024,)], 30.0)
    assert not mgr.record_batch([(1024, 0)], "slow")
    assert len(warnings_logged) == 1 and len(mgr.window) == 0
    fresh = manager()
    assert not fresh.fit_profile([(1024, 0, "n/a")] * 20)
    assert fresh.predictor is None and len(warnings_logged) == 2


def test_bad_manager_config_names_the_key():
    with pytest.raises(ValueError, match="smooth_factor"):
        manager(smooth_factor=2.0)
    with pytest.raises(ValueError, match="window_size"):
        manager(window_size=4)
