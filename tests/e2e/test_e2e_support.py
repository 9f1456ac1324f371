"""The end-to-end CPU engine's support code, without the engine: commands, client parsing,
the CPU worker's step-timing hooks over the product's cpp_timing, the tiny model, the report.

The engine itself runs in ``make e2e`` / ``make bench-e2e`` (docs/e2e.md); these tests need
only the test environment.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from cpp_engine import helpers  # noqa: F401  (imports vLLM with the NPU stubs set aside)
from vllm.sequence import IntermediateTensors
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm_ascend_patchset.e2e import bench, model, servers, smoke
from vllm_ascend_patchset.e2e import worker as cpu_worker


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_servers_bind_loopback_at_pp2_and_only_cpp_gets_the_cpp_scheduler(tmp_path):
    ours = servers.serve_command(servers.ours(2048), tmp_path, 1234, tmp_path / "p")
    fixed = servers.serve_command(servers.fixed(512), tmp_path, 1235, tmp_path / "p")
    for command in (ours, fixed):
        assert _flag(command, "--host") == "127.0.0.1" and _flag(command, "--pipeline-parallel-size") == "2"
        assert "--enable-chunked-prefill" in command
    assert _flag(fixed, "--max-num-batched-tokens") == "512" and "--scheduler-cls" not in fixed
    assert _flag(fixed, "--cpp") == "none"
    assert _flag(fixed, "--worker-extension-cls") == servers.WORKER_EXTENSION  # its clock runs on marked steps only
    assert _flag(ours, "--scheduler-cls") == servers.OURS_SCHEDULER
    assert _flag(ours, "--worker-extension-cls") == servers.WORKER_EXTENSION
    config = json.loads(_flag(ours, "--additional-config"))["profiling_chunk_config"]
    assert config == {"enabled": True, **servers.OURS_PROFILE, "cache_dir": str(tmp_path / "p")}
    smoke = servers.serve_command(servers.ours(2048, profile_points=16), tmp_path, 1237, tmp_path / "p")
    smoke_config = json.loads(_flag(smoke, "--additional-config"))["profiling_chunk_config"]
    assert smoke_config == {**config, "profile_points": 16}
    upstream = servers.serve_command(servers.upstream(2048), tmp_path, 1236, tmp_path / "p")
    assert _flag(upstream, "--cpp") == "upstream" and _flag(upstream, "--scheduler-cls") == servers.UPSTREAM_SCHEDULER
    assert "cache_dir" not in _flag(upstream, "--additional-config")


def test_prompts_are_unique_per_request_and_repeatable():
    a, b = servers.prompt_ids(4096, 0, 8192), servers.prompt_ids(4096, 1, 8192)
    assert a == servers.prompt_ids(4096, 0, 8192) and a != b and a[:64] != b[:64]
    assert min(a + b) >= 3 and max(a + b) < 8192  # no special tokens


@pytest.mark.parametrize(
    ("line", "source"),
    [
        ("[CPP] latency model t = ..., c = (1, 2) ms; target 9 ms; from profiled (48 runs after 2 warm-up), saved to X",
         "profiled (48 runs after 2 warm-up), saved to X"),
        ("(EngineCore pid=1) INFO [CPP] latency model t = ...; from cache /p/cpp-profile-ab.json",
         "cache /p/cpp-profile-ab.json"),
        ("[ProfilingChunk] start-up profile rejected (fit error too large)", None),
        ("[ProfilingChunk] Profiling completed successfully", servers.UPSTREAM_PROFILED),
        ("[CPP] latency model from profiled (120 runs after 2 warm-up), saved to /c/p.json: accepted: 8 chunk sizes",
         "profiled (120 runs after 2 warm-up), saved to /c/p.json"),
        ("(EngineCore pid=3) INFO [CPP] latency model from cache /c/p.json: accepted: 8 chunk sizes 1..512",
         "cache /c/p.json"),
    ],
)  # fmt: skip
def test_profile_source_is_read_from_the_engine_log(line, source):
    assert servers.profile_source(f"noise\n{line}\nmore") == source


class FakeRunner:
    """A model runner of one PP stage: its step costs ``cost_ms`` on the stand-in clock."""

    def __init__(self, clock, cost_ms, last):
        self.clock, self.cost_ms, self.last, self.syncs = clock, cost_ms, last, 0

    def _sync_device(self):
        self.syncs += 1

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        self.seen = sorted(intermediate_tensors.tensors) if intermediate_tensors is not None else []
        self.clock.now_s += self.cost_ms / 1000.0
        return None if self.last else IntermediateTensors({"hidden_states": torch.zeros(2, 4)})

    def sample_tokens(self, grammar_output):
        return ModelRunnerOutput(req_ids=[], req_id_to_index={}) if self.last else None


@pytest.fixture
def hooked(monkeypatch):
    class Clock:
        now_s = 0.0

        def perf_counter(self):
            return self.now_s

    clock = Clock()
    monkeypatch.setattr(cpu_worker.cpp_timing, "time", clock)

    class Runner(FakeRunner):
        pass

    assert cpu_worker.install_step_timing(Runner) and not cpu_worker.install_step_timing(Runner)
    return clock, Runner


@pytest.mark.parametrize(("costs", "marked"), [((30.0, 10.0), True), ((10.0, 30.0), True), ((30.0, 10.0), False)])
def test_cpu_hooks_report_the_slowest_stage_on_marked_steps(hooked, costs, marked):
    clock, Runner = hooked
    first, last = Runner(clock, costs[0], False), Runner(clock, costs[1], True)
    step = SimpleNamespace(cpp_time_step=marked)
    sent = first.execute_model(step)
    first.sample_tokens(None)
    assert last.execute_model(step, IntermediateTensors(dict(sent.tensors))) is None
    assert last.seen == ["hidden_states"]
    output = last.sample_tokens(None)
    assert getattr(output, "execution_time_ms", None) == (pytest.approx(max(costs)) if marked else None)
    assert (first.syncs, last.syncs) == ((2, 2) if marked else (0, 0))


def test_cpu_hooks_time_asynchronous_outputs_when_the_step_ends(hooked):
    clock, Runner = hooked

    class AsyncOutput(AsyncModelRunnerOutput):
        def get_output(self):
            clock.now_s += 5.0  # waiting for the copy is not the step's compute
            return ModelRunnerOutput(req_ids=[], req_id_to_index={})

    class AsyncRunner(FakeRunner):
        def sample_tokens(self, grammar_output):
            return AsyncOutput()

    cpu_worker.install_step_timing(AsyncRunner)
    runner = AsyncRunner(clock, 20.0, True)
    runner.execute_model(SimpleNamespace(cpp_time_step=True))
    assert runner.sample_tokens(None).get_output().execution_time_ms == pytest.approx(20.0)


def test_cpu_profile_run_is_one_request_of_the_chunk_with_its_history():
    calls = []

    class Table:
        block_size, blocks_per_kv_block = 16, 1

        def add_row(self, block_ids, row):
            calls.append(("blocks", len(block_ids), row))

    runner = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=16),
        input_ids=SimpleNamespace(gpu=torch.zeros(512, dtype=torch.int32)),
        positions=torch.zeros(512, dtype=torch.int64),
        model_config=SimpleNamespace(get_vocab_size=lambda: 8192),
        kv_cache_config=SimpleNamespace(kv_cache_groups=[object()]),
        input_batch=SimpleNamespace(num_computed_tokens_cpu=[0], num_prompt_tokens=[0], block_table=[Table()]),
        _cpp_profile_history_tokens=1000,
    )

    def dummy_run(num_tokens, force_attention, profile_seq_lens):
        calls.append(("run", num_tokens, force_attention, profile_seq_lens, runner.scheduler_config.max_num_seqs))

    runner._dummy_run = dummy_run
    cpu_worker.cpu_profile_dummy_run(runner, 256)
    assert calls == [("blocks", 79, 0), ("run", 256, True, 1256, 1)]  # 1256 tokens in 16-token blocks
    assert runner.scheduler_config.max_num_seqs == 16


def test_tiny_model_is_written_once_and_its_tokenizer_maps_words_to_ids(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    config = dict(model.TINY_QWEN3, num_hidden_layers=2, vocab_size=64, hidden_size=32, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    path = model.write_tiny_qwen3(tmp_path / "m", config=config, seed=1)
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert model.write_tiny_qwen3(tmp_path / "m", config=config, seed=1) == path
    assert weights.stat().st_mtime_ns == stamp  # same spec: nothing rewritten
    assert AutoConfig.from_pretrained(path).model_type == "qwen3"
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer("w5 w63").input_ids == [5, 63]
    from safetensors.torch import load_file

    tensors = load_file(str(weights))
    assert tensors["model.layers.1.self_attn.q_proj.weight"].shape == (32, 32)
    model.write_tiny_qwen3(tmp_path / "m", config=config, seed=2)
    assert not torch.equal(load_file(str(weights))["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])


def _record(name, kind, ttfts, tokens=16384):
    return {"policy": name, "kind": kind, "runs": {tokens: [{"ttft_s": t, "tpot_s": 0.01} for t in ttfts]}}


def test_report_flags_twin_errors_and_rankings(capsys):
    records = [_record("fixed-512", "fixed", [2.0, 2.2, 2.1]), _record("ours", "ours", [1.8, 1.9, 1.9])]
    twin = {"fixed-512": {16384: 2.15}, "ours": {16384: 1.85}}
    assert bench.report(records, [16384], twin) == []
    out = capsys.readouterr().out
    assert "best fixed chunk: fixed-512" in out and "ranking twin: ours < fixed-512" in out
    twin = {"fixed-512": {16384: 1.5}, "ours": {16384: 1.85}}  # off by 29%, and the order flips
    problems = bench.report(records, [16384], twin)
    assert any("fixed-512: twin/real 0.714" in p for p in problems) and any("ranks" in p for p in problems)


def test_uneven_stage_check_reads_the_scheduler_and_worker_lines():
    """The log formats of the scheduler's timed-step line and the worker extension's profiling line."""
    scheduler_format = "[CPP] batch of %d requests, %d tokens: predicted %.2f ms, measured %.2f ms"
    worker_format = "[CPP e2e] start-up profiling run: %d tokens after %d, %.1f ms (rank %d)"
    scheduler_line = scheduler_format % (1, 2048, 812.5, 790.25)  # noqa: UP031 (the loggers' own %-formats)
    worker_line = worker_format % (2048, 0, 401.5, 1)  # noqa: UP031
    assert smoke.TIMED_STEP_RE.findall(f"x {scheduler_line} y") == [("2048", "812.50", "790.25")]
    assert smoke.PROFILE_RUN_RE.findall(worker_line) == [("2048", "0", "401.5", "1")]


_INIT_LINE = "(Worker pid=7) INFO parallel_state.py world_size=4 rank=0 distributed_init_method=tcp://127.0.0.1:45457"
_SEGMENTS = ["45457-tp:0-[0-1]-cpushm_0", "45457-pp:0-[0-2]-cpushm_1"]


@pytest.mark.parametrize(
    ("log", "entries", "leftover_names", "noted"),
    [
        # vLLM signalled its workers after its grace: the server's segments are a note, and removed
        (f"{_INIT_LINE}\nExecutor: {servers.WORKERS_SIGNALLED}; sending SIGTERM", _SEGMENTS, [], True),
        # the workers exited on their own and still left segments: a leftover (removed too)
        (_INIT_LINE, _SEGMENTS, _SEGMENTS, False),
        # another server's segments, or another name, are never the server's: kept and reported
        (f"{_INIT_LINE}\n{servers.WORKERS_SIGNALLED}", ["51000-tp:0-[0-1]-cpushm_0", "psm_x"], None, False),
    ],
)
def test_a_stopped_servers_shm_segments_are_removed_and_only_vllms_grace_makes_them_a_note(
    log, entries, leftover_names, noted
):
    removed = []
    leftovers, note = servers.shm_after_stop(entries, log, removed.extend)
    own = [e for e in entries if e.startswith("45457-")]
    assert removed == own
    assert bool(note) == noted
    if leftover_names is None:  # not the server's: left in place and named
        assert leftovers == [f"/dev/shm entries left: {entries}"]
    elif leftover_names:
        assert len(leftovers) == 1 and all(name in leftovers[0] for name in leftover_names)
    else:
        assert leftovers == []
