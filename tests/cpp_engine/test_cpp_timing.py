"""Worker side of CPP on CPU stand-ins: sampled step timing and the profile run's inputs."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import helpers  # noqa: F401  (imports vLLM with the NPU stubs set aside)
import numpy as np
import pytest
import torch
from vllm_ascend.worker import cpp_timing


class States(enum.Enum):
    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3


class Runner:
    def __init__(self):
        self.syncs = 0

    def _sync_device(self):
        self.syncs += 1


def test_unmarked_steps_add_no_device_synchronisation():
    runner = Runner()
    output = SimpleNamespace()
    for marked in (False, None):
        cpp_timing.start_step_timing(runner, SimpleNamespace(cpp_time_step=marked))
        cpp_timing.finish_step_timing(runner, output)
    cpp_timing.start_step_timing(runner, SimpleNamespace())  # an output from upstream's scheduler
    cpp_timing.finish_step_timing(runner, output)
    assert runner.syncs == 0 and not hasattr(output, "execution_time_ms")


def test_marked_step_waits_for_its_input_then_times_its_own_compute():
    runner = Runner()
    events = []
    tensors = SimpleNamespace(wait_for_comm=lambda: events.append(("input ready", runner.syncs)), tensors={})
    output = SimpleNamespace()
    cpp_timing.start_step_timing(runner, SimpleNamespace(cpp_time_step=True), tensors)
    cpp_timing.finish_step_timing(runner, output)
    assert events == [("input ready", 0)] and runner.syncs == 2
    assert output.execution_time_ms >= 0
    cpp_timing.finish_step_timing(runner, SimpleNamespace())  # a second finish without a start is a no-op
    assert runner.syncs == 2


class Clock:
    """time.perf_counter stand-in: each stage's work advances it by what the test says."""

    def __init__(self):
        self.now_s = 100.0

    def perf_counter(self):
        return self.now_s

    def work(self, ms):
        self.now_s += ms / 1000.0


def run_pipeline_step(monkeypatch, stage_ms, marked=True):
    """One step through len(stage_ms) PP stages with vLLM's IntermediateTensors; returns (output, runners, sent)."""
    from vllm.sequence import IntermediateTensors

    clock = Clock()
    monkeypatch.setattr(cpp_timing, "time", clock)
    scheduler_output = SimpleNamespace(cpp_time_step=marked)
    runners = [Runner() for _ in stage_ms]
    received, sent = None, []
    for rank, (runner, ms) in enumerate(zip(runners, stage_ms, strict=True)):
        cpp_timing.start_step_timing(runner, scheduler_output, received)
        if received is not None:
            assert set(received.tensors) == {"hidden_states"}  # the model never sees the carried time
        clock.work(ms)
        if rank < len(stage_ms) - 1:
            out = IntermediateTensors({"hidden_states": torch.zeros(4, 8)})
            cpp_timing.finish_stage_timing(runner, out)
            sent.append(dict(out.tensors))
            received = IntermediateTensors(dict(out.tensors))  # what the next stage's recv gives it
    output = SimpleNamespace()
    cpp_timing.finish_step_timing(runners[-1], output)
    return output, runners, sent


@pytest.mark.parametrize("stage_ms", [(30.0, 10.0), (10.0, 30.0), (5.0, 40.0, 20.0), (25.0,)])
def test_marked_step_reports_the_slowest_stage(monkeypatch, stage_ms):
    output, runners, sent = run_pipeline_step(monkeypatch, stage_ms)
    assert output.execution_time_ms == pytest.approx(max(stage_ms))
    assert all(r.syncs == 2 for r in runners)  # one before and one after its own compute
    running_max = [max(stage_ms[: i + 1]) for i in range(len(stage_ms) - 1)]
    carried = [float(t[cpp_timing.SLOWEST_STAGE_KEY][0]) for t in sent]
    assert carried == pytest.approx(running_max)
    assert all(t[cpp_timing.SLOWEST_STAGE_KEY].device.type == "cpu" for t in sent)


def test_unmarked_step_sends_nothing_extra(monkeypatch):
    output, runners, sent = run_pipeline_step(monkeypatch, (30.0, 10.0), marked=False)
    assert not hasattr(output, "execution_time_ms")
    assert all(r.syncs == 0 for r in runners) and all(set(t) == {"hidden_states"} for t in sent)


def test_wait_for_input_comes_before_the_carried_time_is_read():
    from vllm.v1.worker.gpu_worker import AsyncIntermediateTensors

    events = []
    carried = {cpp_timing.SLOWEST_STAGE_KEY: torch.tensor([42.0], dtype=torch.float64)}
    tensors = AsyncIntermediateTensors(carried, comm_postprocess=[lambda: events.append("input ready")])
    runner = Runner()
    cpp_timing.start_step_timing(runner, SimpleNamespace(cpp_time_step=True), tensors)
    assert events == ["input ready"] and runner._cpp_earlier_stages_ms == 42.0
    assert cpp_timing.SLOWEST_STAGE_KEY not in tensors.tensors


class Table:
    def __init__(self, physical_block_size):
        self.physical_block_size = physical_block_size
        self.rows = {}

    def add_row(self, block_ids, row):
        self.rows[row] = list(block_ids)

    def clear_row(self, row):
        self.rows.pop(row, None)


def profile_runner():
    runner = Runner()
    runner.input_ids = SimpleNamespace(gpu=torch.zeros(1024, dtype=torch.int32))
    runner.positions = torch.zeros(1024, dtype=torch.int64)
    runner.model_config = SimpleNamespace(get_vocab_size=lambda: 32000)
    runner.kv_cache_config = SimpleNamespace(kv_cache_groups=[object(), object()])
    runner.input_batch = SimpleNamespace(
        num_computed_tokens_cpu=np.zeros(4, dtype=np.int32),
        num_prompt_tokens=np.zeros(4, dtype=np.int32),
        block_table=[Table(128), Table(64)],
    )
    runner.attn_state = States.DecodeOnly
    return runner


@pytest.fixture(autouse=True)
def cpu_attention_states(monkeypatch):
    monkeypatch.setattr(cpp_timing, "_attention_states", lambda: States)


def test_profile_run_is_a_prefill_with_varied_ids():
    runner = profile_runner()
    assert cpp_timing.prepare_profile_run(runner, 300) == 300
    assert runner.attn_state is States.PrefillNoCache
    ids = runner.input_ids.gpu[:300]
    assert len(torch.unique(ids)) > 250 and int(ids.min()) >= 1 and int(ids.max()) < 32000
    assert torch.equal(runner.positions[:300], torch.arange(300))


def test_profile_run_emulates_history():
    runner = profile_runner()
    runner._cpp_profile_history_tokens = 1000
    assert cpp_timing.prepare_profile_run(runner, 256) == 1256
    assert runner.attn_state is States.ChunkedPrefill
    assert torch.equal(runner.positions[:256], torch.arange(1000, 1256))
    assert runner.input_batch.num_computed_tokens_cpu[0] == 1000 and runner.input_batch.num_prompt_tokens[0] == 1256
    coarse, fine = runner.input_batch.block_table
    assert coarse.rows[0] == list(range(1, 11)) and fine.rows[0] == list(range(1, 21))  # 1256 tokens, no block 0
    cpp_timing.finish_profile_run(runner)
    assert coarse.rows == {} and fine.rows == {} and runner.input_batch.num_computed_tokens_cpu[0] == 0


def test_worker_profile_clamps_times_and_cleans_up(monkeypatch):
    runner = profile_runner()
    runs = []

    def dummy_run(num_tokens, force_attention, profile_cpp):
        runs.append((num_tokens, runner._cpp_profile_history_tokens, force_attention, profile_cpp))
        cpp_timing.prepare_profile_run(runner, num_tokens)

    runner._dummy_run = dummy_run
    worker = SimpleNamespace(
        model_runner=runner,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=512),
        model_config=SimpleNamespace(max_model_len=4096),
    )
    monkeypatch.setattr(torch, "npu", SimpleNamespace(synchronize=lambda: None), raising=False)
    latency_ms = cpp_timing.profile_prefill_latency(worker, 900, 5000)
    assert latency_ms >= 0
    assert runs == [(512, 4096 - 512, True, True)]
    assert runner._cpp_profile_history_tokens == 0 and runner.input_batch.block_table[0].rows == {}


def _calls_in(tree_path, class_name, function_name):
    import ast

    module = ast.parse(tree_path.read_text())
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    (function,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == function_name]
    names = {ast.unparse(n.func) for n in ast.walk(function) if isinstance(n, ast.Call)}
    return function, names


def test_worker_and_model_runner_call_the_hooks():
    """The 0202 patch in the assembled tree (these modules need an NPU to import)."""
    from pathlib import Path

    import vllm_ascend

    worker_dir = Path(vllm_ascend.__file__).parent / "worker"
    runner = worker_dir / "model_runner_v1.py"
    execute_calls = _calls_in(runner, "NPUModelRunner", "execute_model")[1]
    assert {"cpp_timing.start_step_timing", "cpp_timing.finish_stage_timing"} <= execute_calls
    assert "cpp_timing.finish_step_timing" in _calls_in(runner, "NPUModelRunner", "sample_tokens")[1]
    assert "cpp_timing.prepare_profile_run" in _calls_in(runner, "NPUModelRunner", "_dummy_run")[1]
    assert "need_timing" not in runner.read_text()  # no per-step synchronisation flag left
    function, names = _calls_in(worker_dir / "worker.py", "NPUWorker", "profile_prefill_latency")
    assert [a.arg for a in function.args.args] == ["self", "num_tokens", "history_tokens"]
    assert "profile_prefill_latency" in names


@pytest.mark.parametrize("kernel_block_size", [64, 32])
def test_profile_batch_covers_history_in_vllm_block_tables(kernel_block_size):
    """vLLM's own BlockTable (the CPU runner's): add_row counts KV-manager blocks, the kernel may split them."""
    from vllm.v1.worker.block_table import BlockTable

    table = BlockTable(
        block_size=64,
        max_num_reqs=2,
        max_num_blocks_per_req=64,
        max_num_batched_tokens=512,
        pin_memory=False,
        device=torch.device("cpu"),
        kernel_block_size=kernel_block_size,
        cp_kv_cache_interleave_size=1,
    )
    runner = profile_runner()
    runner.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
    runner.input_batch.block_table = [table]
    runner._cpp_profile_history_tokens = 1000
    assert cpp_timing.prepare_profile_batch(runner, 280) == 1280
    kernel_blocks = 1280 // kernel_block_size
    assert table.num_blocks_per_row[0] == kernel_blocks  # exactly the 1280 tokens, no more
    assert int(table.block_table.np[0, :kernel_blocks].min()) > 0  # the null block is never read
    assert runner.attn_state is States.DecodeOnly  # only the NPU entry sets an attention state


def test_profile_with_another_backends_dummy_run():
    """The CPU engine's path: the caller's dummy run, the runner's own device synchronisation."""
    runner = profile_runner()
    seen = []

    def dummy_run(run_runner, num_tokens):
        seen.append((num_tokens, cpp_timing.prepare_profile_batch(run_runner, num_tokens), run_runner.syncs))

    worker = SimpleNamespace(
        model_runner=runner,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=512),
        model_config=SimpleNamespace(max_model_len=4096),
    )
    assert cpp_timing.profile_prefill_latency(worker, 256, 1000, dummy_run=dummy_run) >= 0
    assert seen == [(256, 1256, 1)] and runner.syncs == 2
    assert runner.input_batch.block_table[0].rows == {} and runner._cpp_profile_history_tokens == 0
