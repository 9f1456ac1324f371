"""Start-up profiling pieces: the plan, the executor call shape, the engine-core hook."""

from __future__ import annotations

import itertools
import logging
import math
import os

import helpers
import numpy as np
import pytest
from vllm_ascend import deployment
from vllm_ascend.core import cpp_profile_store, cpp_profiling
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_profile_plan import history_levels_for


def test_plan_is_the_ladder_at_every_history_with_the_tile_probe_in_passes():
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=8192, points=24, repeats=2, history_points=4, max_history_tokens=100_000, align=128
    )
    ladder = [1, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    # The deepest level half a base chunk past the base chunk's deepest history: the sizes up to half the
    # base chunk run there (the context is 108192 tokens), the two larger ones do not fit.
    histories = [0, 25984, 51968, 77952, 104064]
    one_pass = plan[: len(plan) // 2]
    assert plan == one_pass * 2  # passes, not repeats in a row
    grid = [(c, h) for h in histories for c in ladder if h < histories[-1] or c <= 4096]
    assert one_pass[: len(grid)] == grid and len(set(grid)) == len(grid)  # every size at every history it fits
    probe = one_pass[len(grid) :]
    # Each tile's first boundary and one token past it, three times a pass (S's grid run counts), alternating.
    pairs = [(64, 0), (65, 0), (128, 0), (129, 0), (256, 0), (257, 0), (512, 0), (513, 0)]
    assert probe == pairs * 2 + [run for run in pairs if run[0] % 2]
    assert len(plan) + cpp_profiling.WARMUP_RUNS <= 218  # no more runs than the profile of the previous version


@pytest.mark.parametrize("points", [8, 12, 24])
def test_a_smaller_budget_of_sizes_drops_the_middle_sizes_first(points):
    ladder = cpp_profiling.chunk_ladder(8192, points)
    assert len(ladder) <= max(points, 3) and ladder[0] == 1 and ladder[-1] == 8192
    powers = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    if points >= 10:
        assert set(powers) <= set(ladder)


@pytest.mark.parametrize("base", [4, 16, 48, 100, 5000])
def test_any_token_budget_gets_three_sizes_or_more_up_to_itself(base):
    ladder = cpp_profiling.chunk_ladder(base, 24)
    assert len(ladder) >= 3 and ladder[-1] == base and ladder == sorted(set(ladder))


@pytest.mark.parametrize(
    "base, max_history, history_points, deeper",
    [(8192, 24_576, 4, True), (2048, 129_024, 4, True), (8192, 8192, 4, False), (8192, 24_576, 1, False)],
)
def test_the_deepest_level_is_as_deep_as_half_the_base_chunk_runs_when_the_level_above_fits_the_base(
    base, max_history, history_points, deeper
):
    """Every planned run fits the context; the sizes up to half the base chunk are run at every level, the
    base chunk at every level but (when the deepest is deeper than its own) the deepest. A level above that
    would not fit the base chunk (little history, or one level) keeps the deepest at the base chunk's."""
    context = max_history + base
    levels = history_levels_for(base, max_history, history_points)
    assert (levels[-1] == max_history + base // 2) is deeper and (levels[-1] == max_history) is not deeper
    plan = set(cpp_profiling.profile_plan(
        base_chunk_tokens=base, points=24, repeats=1, history_points=history_points, max_history_tokens=max_history
    ))  # fmt: skip
    assert all(c + h <= context for c, h in plan)
    for c in cpp_profiling.chunk_ladder(base, 24):
        missing = [h for h in levels if (c, h) not in plan]
        assert missing == ([levels[-1]] if deeper and 2 * c > base else []), c


def test_plan_without_room_for_history_has_only_fresh_runs():
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=512, points=24, repeats=1, history_points=4, max_history_tokens=0, align=64
    )
    assert {h for _, h in plan} == {0}
    assert [c for c, _ in plan][:9] == [1, 32, 64, 96, 128, 192, 256, 384, 512]


class Executor:
    """Every worker answers ``answer(chunk_tokens, history_tokens)`` (a list, one value per worker)."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None):
        self.calls.append((method, args, timeout, unique_reply_rank))
        return self.answer(*args)


def test_measure_asks_every_worker_and_keeps_the_slowest():
    executor = Executor(lambda c, h: [3.0, 5.5, np.float32(4.0), 5])
    measure = cpp_profiling.measure_with_executor(executor, timeout_s=12.0)
    assert measure(256, 1024) == 5.5 and type(measure(256, 1024)) is float
    assert executor.calls[0] == ("profile_prefill_latency", (256, 1024), 12.0, None)
    assert cpp_profiling.measure_with_executor(Executor(lambda c, h: 7))(1, 0) == 7.0  # one number, not a list


NOT_MEASUREMENTS = {
    "bool": [True],
    "strings": ["12.5", "13"],
    "nan-last": [21.9, math.nan],
    "nan-first": [math.nan, 21.9],
    "none": [3.0, 5.5, None],
    "zero": [0, 21.9],
    "infinite": [21.9, math.inf],
    "bool-beside-a-time": [21.9, True],
}


@pytest.mark.parametrize("answer", NOT_MEASUREMENTS.values(), ids=NOT_MEASUREMENTS.keys())
def test_a_run_where_any_worker_answers_no_measurement_is_dropped_whichever_worker(answer):
    """Each answer is checked as it came, before any conversion; the verdict does not depend on worker order."""
    for order in itertools.permutations(answer):
        measure = cpp_profiling.measure_with_executor(Executor(lambda c, h, order=order: list(order)))
        assert math.isnan(measure(256, 0)), order


def start_with(tmp_path, answer):
    config = CppConfig(cache_dir=str(tmp_path), profile_points=8, profile_repeats=1, profile_history_points=1)
    limits = ChunkLimits(base_chunk_tokens=1024, max_model_len=8192)
    measure = cpp_profiling.measure_with_executor(Executor(answer))
    kwargs = dict(fingerprint={"model": "m"}, measure=measure, max_history_tokens=4096)
    return cpp_profiling.initialise_profile(config, limits, 2, **kwargs)


def device_ms(chunk_tokens, history_tokens):
    return 5.0 + 0.02 * chunk_tokens + 3e-7 * chunk_tokens * (history_tokens + chunk_tokens / 2)


@pytest.mark.parametrize("answer", NOT_MEASUREMENTS.values(), ids=NOT_MEASUREMENTS.keys())
def test_workers_that_answer_no_measurement_give_no_model_and_no_cached_profile(tmp_path, answer):
    result = start_with(tmp_path, lambda c, h: list(answer))
    assert result.verdict.model is None and "not measurements, dropped" in result.verdict.reason
    assert list(tmp_path.iterdir()) == []  # nothing cached: the next start profiles again


def test_a_dropped_run_is_left_out_of_the_saved_profile_so_the_next_start_reuses_it(tmp_path, caplog):
    """One point's first worker answers NaN: the rest is a profile, saved as readable JSON and reused."""
    caplog.set_level(logging.INFO, logger=cpp_profiling.logger.name)
    answer = lambda c, h: [math.nan if (c, h) == (32, 0) else device_ms(c, h), device_ms(c, h)]  # noqa: E731
    first = start_with(tmp_path, answer)
    assert first.verdict.model is not None and "1 sample(s) not measurements, dropped" in first.verdict.reason
    again = start_with(tmp_path, answer)
    assert again.source.startswith("cache") and again.verdict.model == first.verdict.model
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == cpp_profiling.logger.name]
    assert [m for level, m in messages if "is dropped" in m] == [
        f"[CPP] a profiling run whose workers answered [nan, {device_ms(32, 0)!r}] is dropped: latency_ms nan is "
        "not a forward pass's time (outside [0.001, 1e+07] ms)"
    ]
    assert messages and not [m for level, m in messages if level >= logging.WARNING], messages  # not "ignoring"


def test_engine_core_hook_starts_cpp_once_the_executor_is_up():
    events = []

    class Scheduler:
        def run_profiling_chunk_init(self, executor):
            events.append(("profile", executor))

    class EngineCore:
        def __init__(self, executor):
            events.append(("init", executor))
            self.model_executor = executor
            self.scheduler = Scheduler()

    assert cpp_profiling.wrap_engine_core_init(EngineCore)
    assert not cpp_profiling.wrap_engine_core_init(EngineCore)  # idempotent: one profile per engine
    EngineCore("executor")
    assert events == [("init", "executor"), ("profile", "executor")]


def test_fingerprint_names_what_a_profile_depends_on_without_touching_the_device(tmp_path, monkeypatch):
    import torch

    class NoDevice:
        def __getattr__(self, name):
            raise AssertionError(f"the engine-core process must not touch the NPU (torch.npu.{name})")

    monkeypatch.setattr(torch, "npu", NoDevice(), raising=False)
    base = helpers.make_vllm_config(tmp_path, max_num_batched_tokens=512)
    fingerprint = deployment.fingerprint_for(base)
    assert fingerprint["model"] == str(tmp_path) and fingerprint["max_num_batched_tokens"] == 512
    assert fingerprint["pipeline_parallel_size"] == 1 and fingerprint["block_size"] == 16
    assert fingerprint["vllm_version"] and fingerprint["vllm_ascend_version"].startswith("0.23.0+")
    other_budget = deployment.fingerprint_for(helpers.make_vllm_config(tmp_path, max_num_batched_tokens=1024))
    files = {cpp_profile_store.cache_file("/c", fp) for fp in (fingerprint, other_budget)}
    assert len(files) == 2 and cpp_profile_store.cache_file("/c", fingerprint) == cpp_profile_store.cache_file(
        "/c", dict(fingerprint)
    )


def test_another_model_put_at_the_same_path_is_another_deployment(tmp_path):
    """The path alone does not pin the model (a new download, a moved symlink): its architecture, read from
    its configuration, is part of the fingerprint, and the same configuration gives the same one."""
    first = deployment.fingerprint_for(helpers.make_vllm_config(tmp_path, max_position_embeddings=16384))
    again = deployment.fingerprint_for(helpers.make_vllm_config(tmp_path, max_position_embeddings=16384))
    other = deployment.fingerprint_for(helpers.make_vllm_config(tmp_path, max_position_embeddings=32768))
    assert first["model"] == other["model"] == str(tmp_path) and first["architecture"]
    assert first == again
    assert cpp_profile_store.cache_file("/c", first) != cpp_profile_store.cache_file("/c", other)


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("kv cache dtype", lambda c: setattr(c.cache_config, "cache_dtype", "fp8")),
        ("decode context parallel", lambda c: setattr(c.parallel_config, "decode_context_parallel_size", 2)),
        ("prefill context parallel", lambda c: setattr(c.parallel_config, "prefill_context_parallel_size", 2)),
        ("eager or graph", lambda c: setattr(c.model_config, "enforce_eager", not c.model_config.enforce_eager)),
        ("another vllm-ascend setting", lambda c: c.additional_config.update(enable_shared_expert_dp=True)),
        ("dual stream on", lambda c: c.additional_config.update(dual_stream_config={"enabled": True})),
        ("a vllm-ascend variable", lambda c: os.environ.update(VLLM_ASCEND_ENABLE_FLASHCOMM1="1")),
    ],
)
def test_what_changes_a_forward_pass_is_another_deployment_and_cpp_settings_are_not(
    tmp_path, monkeypatch, what, change
):
    """These once mapped to the same profile file: a profile measured under one was adopted under another."""
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_FLASHCOMM1", raising=False)
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_FLASHCOMM1", "0")  # (restored after the test)
    config = helpers.make_vllm_config(tmp_path)
    config.additional_config = {"profiling_chunk_config": {"enabled": True}}
    base = deployment.fingerprint_for(config)
    config.additional_config["profiling_chunk_config"] = {"enabled": True, "smooth_factor": 0.5, "cache_dir": "/x"}
    assert deployment.fingerprint_for(config) == base  # CPP's own settings change no forward pass
    change(config)
    changed = deployment.fingerprint_for(config)
    assert changed != base, what
    assert cpp_profile_store.cache_file("/c", changed) != cpp_profile_store.cache_file("/c", base)


def test_cpp_settings_nested_in_a_section_are_left_out_too_and_the_sections_other_settings_are_not(tmp_path):
    """Upstream main reads CPP's section under additional_config.scheduler_config: a CPP setting changed
    there would profile again, and the user's config is not changed by the digest."""
    config = helpers.make_vllm_config(tmp_path)
    nested = {"profiling_chunk_config": {"enabled": True}, "enable_balance_scheduling": False}
    config.additional_config = {"scheduler_config": nested}
    base = deployment.fingerprint_for(config)
    nested["profiling_chunk_config"] = {"enabled": True, "smooth_factor": 0.5}
    assert deployment.fingerprint_for(config) == base
    assert config.additional_config["scheduler_config"]["profiling_chunk_config"]["smooth_factor"] == 0.5
    nested["enable_balance_scheduling"] = True
    assert deployment.fingerprint_for(config) != base
    # A section holding only CPP's, an empty one and none are one configuration: one profile, not three.
    config.additional_config = {"scheduler_config": {"profiling_chunk_config": {"enabled": True}}}
    alone = deployment.fingerprint_for(config)
    config.additional_config = {"scheduler_config": {}, "profiling_chunk_config": {"enabled": True}}
    assert deployment.fingerprint_for(config) == alone
    config.additional_config = {"profiling_chunk_config": {"enabled": True}}
    assert deployment.fingerprint_for(config) == alone


def test_another_profile_schema_is_another_file(tmp_path, monkeypatch):
    """Two builds of other schemas sharing a folder each refused the other's profile and wrote over it."""
    fingerprint = deployment.fingerprint_for(helpers.make_vllm_config(tmp_path))
    now = cpp_profile_store.cache_file("/c", fingerprint)
    monkeypatch.setattr(cpp_profile_store, "PROFILE_SCHEMA_VERSION", cpp_profile_store.PROFILE_SCHEMA_VERSION + 1)
    assert cpp_profile_store.cache_file("/c", fingerprint) != now


def test_an_additional_config_json_cannot_sort_still_has_a_fingerprint(tmp_path):
    config = helpers.make_vllm_config(tmp_path)
    config.additional_config = {"a": 1, 2: "b"}  # keys of mixed types: json.dumps(sort_keys=True) raises
    assert deployment.fingerprint_for(config) == deployment.fingerprint_for(config)
    config.additional_config = {"a": np.array([1, 2]), "b": {}}  # (the API takes any value; `!=` can raise)
    assert deployment.fingerprint_for(config) == deployment.fingerprint_for(config)
