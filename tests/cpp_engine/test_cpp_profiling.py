"""Start-up profiling pieces: the plan, the executor call shape, the engine-core hook."""

from __future__ import annotations

import helpers
from vllm_ascend.core import cpp_profile_store, cpp_profiling


def test_plan_follows_the_seed_sizes_with_repeats_and_history_runs():
    plan = cpp_profiling.profile_plan(
        base_chunk_size=8192, points=64, repeats=3, history_points=4, max_history_tokens=100_000, align=128
    )
    fresh = [chunk for chunk, history in plan if history == 0]
    sizes = list(dict.fromkeys(fresh))
    assert sizes[0] == 8192 and sizes[-1] == 128 and len(sizes) == 64
    assert all(later < earlier for earlier, later in zip(sizes, sizes[1:], strict=False))
    assert len(fresh) == 64 * 3
    with_history = [(c, h) for c, h in plan if h > 0]
    assert sorted({h for _, h in with_history}) == [24960, 49920, 74880, 99968]
    assert all(h % 128 == 0 and h <= 100_000 for _, h in with_history)
    assert {c for c, _ in with_history} == {4096, 1024}  # two sizes per history: c2*H and c4*C*H separable
    assert len(with_history) == 4 * 2 * 3
    one_pass = plan[: len(plan) // 3]
    assert plan == one_pass * 3 and len(set(one_pass)) == len(one_pass)  # passes, not repeats in a row


def test_plan_without_room_for_history_has_only_fresh_runs():
    plan = cpp_profiling.profile_plan(
        base_chunk_size=512, points=8, repeats=1, history_points=4, max_history_tokens=0, align=64
    )
    assert plan == [(512 - 64 * i, 0) for i in range(8)]


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
    fingerprint = cpp_profile_store.fingerprint_for(base)
    assert fingerprint["model"] == str(tmp_path) and fingerprint["max_num_batched_tokens"] == 512
    assert fingerprint["pipeline_parallel_size"] == 1 and fingerprint["block_size"] == 16
    assert fingerprint["vllm_version"] and fingerprint["vllm_ascend_version"].startswith("0.23.0+")
    other_budget = cpp_profile_store.fingerprint_for(helpers.make_vllm_config(tmp_path, max_num_batched_tokens=1024))
    files = {cpp_profile_store.cache_file("/c", fp) for fp in (fingerprint, other_budget)}
    assert len(files) == 2 and cpp_profile_store.cache_file("/c", fingerprint) == cpp_profile_store.cache_file(
        "/c", dict(fingerprint)
    )
