"""Start-up profiling pieces: the plan, the executor call shape, the engine-core hook."""

from __future__ import annotations

import helpers
import pytest
from vllm_ascend import deployment
from vllm_ascend.core import cpp_profile_store, cpp_profiling


def test_plan_is_the_ladder_at_every_history_with_the_tile_probe_in_passes():
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=8192, points=24, repeats=2, history_points=4, max_history_tokens=100_000, align=128
    )
    ladder = [1, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    histories = [0, 24960, 49920, 74880, 99968]
    one_pass = plan[: len(plan) // 2]
    assert plan == one_pass * 2  # passes, not repeats in a row
    grid = [(c, h) for h in histories for c in ladder]
    assert one_pass[: len(grid)] == grid and len(set(grid)) == len(grid)  # every size at every history
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


def test_plan_without_room_for_history_has_only_fresh_runs():
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=512, points=24, repeats=1, history_points=4, max_history_tokens=0, align=64
    )
    assert {h for _, h in plan} == {0}
    assert [c for c, _ in plan][:9] == [1, 32, 64, 96, 128, 192, 256, 384, 512]


def test_measure_asks_every_worker_and_keeps_the_slowest():
    calls = []

    class Executor:
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None):
            calls.append((method, args, timeout, unique_reply_rank))
            return [3.0, 5.5, 4.0, None]

    measure = cpp_profiling.measure_with_executor(Executor(), timeout_s=12.0)
    assert measure(256, 1024) == 5.5
    assert calls == [("profile_prefill_latency", (256, 1024), 12.0, None)]


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
