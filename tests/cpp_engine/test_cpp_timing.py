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
    tensors = SimpleNamespace(wait_for_comm=lambda: events.append(("input ready", runner.syncs)))
    output = SimpleNamespace()
    cpp_timing.start_step_timing(runner, SimpleNamespace(cpp_time_step=True), tensors)
    cpp_timing.finish_step_timing(runner, output)
    assert events == [("input ready", 0)] and runner.syncs == 2
    assert output.execution_time_ms >= 0
    cpp_timing.finish_step_timing(runner, SimpleNamespace())  # a second finish without a start is a no-op
    assert runner.syncs == 2


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
    assert "cpp_timing.start_step_timing" in _calls_in(runner, "NPUModelRunner", "execute_model")[1]
    assert "cpp_timing.finish_step_timing" in _calls_in(runner, "NPUModelRunner", "sample_tokens")[1]
    assert "cpp_timing.prepare_profile_run" in _calls_in(runner, "NPUModelRunner", "_dummy_run")[1]
    assert "need_timing" not in runner.read_text()  # no per-step synchronisation flag left
    function, names = _calls_in(worker_dir / "worker.py", "NPUWorker", "profile_prefill_latency")
    assert [a.arg for a in function.args.args] == ["self", "num_tokens", "history_tokens"]
    assert "profile_prefill_latency" in names
