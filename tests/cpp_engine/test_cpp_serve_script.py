"""scripts/bench/cpp_serve.py: arguments, the exact commands (dry run) and the table, without an NPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from vllm_ascend_patchset.paths import BENCH_DIR

SCRIPT = BENCH_DIR / "cpp_serve.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cpp_serve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = ["--model", "/models/Qwen3-32B", "--pp", "4", "--input-len", "65536"]


def test_dry_run_prints_the_exact_commands():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *BASE, "--tp", "2", "--cpp-cache-dir", "/tmp/cpp", "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    common = (
        "vllm serve /models/Qwen3-32B --host 127.0.0.1 --port 8000 --pipeline-parallel-size 4 "
        "--tensor-parallel-size 2 --enable-chunked-prefill --max-num-batched-tokens 8192 --max-model-len 65616 "
        "--no-enable-prefix-caching --additional-config "
    )
    bench = (
        "vllm bench serve --backend vllm --model /models/Qwen3-32B --host 127.0.0.1 --port 8000 "
        "--dataset-name random --random-input-len 65536 --random-output-len 16 --random-range-ratio 0 "
        "--num-prompts 32 --request-rate inf --seed 0 --ignore-eos --percentile-metrics ttft "
        "--metric-percentiles 50,99 --save-result --result-dir results/cpp_serve --result-filename "
    )
    assert out.splitlines() == [
        "# fixed",
        common + """'{"profiling_chunk_config": {"enabled": false}}'""",
        bench + "fixed-pp4-in65536.json",
        "# cpp",
        common + """'{"profiling_chunk_config": {"cache_dir": "/tmp/cpp", "enabled": true}}'""",
        bench + "cpp-pp4-in65536.json",
    ]


def test_runs_differ_only_in_the_cpp_switch(bench):
    args = bench.parse_args(
        [*BASE, "--cpp-config", '{"smooth_factor": 0.8}', "--serve-arg", "--gpu-memory-utilization 0.85"]
    )
    fixed, cpp = bench.serve_command(args, "fixed"), bench.serve_command(args, "cpp")
    differ = [i for i, (a, b) in enumerate(zip(fixed, cpp, strict=True)) if a != b]
    assert len(differ) == 1 and fixed[differ[0] - 1] == "--additional-config"
    assert json.loads(cpp[differ[0]]) == {"profiling_chunk_config": {"enabled": True, "smooth_factor": 0.8}}
    assert fixed[-2:] == ["--gpu-memory-utilization", "0.85"]
    assert bench.bench_command(args, "fixed")[:-1] == bench.bench_command(args, "cpp")[:-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "m", "--pp", "1", "--input-len", "1000"], "needs pipeline parallelism"),
        (["--model", "m", "--pp", "2", "--input-len", "0"], "must be a positive integer"),
        (["--model", "m", "--pp", "2"], "--input-len"),
        ([*BASE, "--cpp-config", "{smooth"], "--cpp-config is not JSON"),
        ([*BASE, "--cpp-config", '{"enabled": true}'], 'without "enabled"'),
        ([*BASE, "--request-rate", "-1"], "'inf' or a positive number"),
        ([*BASE, "--max-model-len", "1000"], "must hold --input-len + --output-len"),
        # each reached vllm serve or vllm bench serve, which refused it (or never finished) minutes later
        ([*BASE, "--port", "70000"], "--port must be in [1, 65535], got 70000"),
        ([*BASE, "--num-prompts", "1000000000000"], "--num-prompts must be in [1, 100000], got 1000000000000"),
        ([*BASE, "--output-len", "1000000000000"], "--output-len must be in [1, 33554432], got 1000000000000"),
        ([*BASE, "--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
        ([*BASE, "--ready-timeout-s", "1000000000000"], "--ready-timeout-s must be in [1, 86400]"),
        ([*BASE, "--request-rate", "1e-300"], "--request-rate 1e-300: 32 prompts arrive over 3.2e+301 s"),
        ([*BASE, "--pp", "1000000"], "--pipeline-parallel-size must be in [2, 64], got 1000000"),
        ([*BASE, "--tp", "1000000"], "--tensor-parallel-size must be in [1, 64], got 1000000"),
        ([*BASE, "--max-num-batched-tokens", "1000000000000"], "--max-num-batched-tokens must be in [1, 33554432]"),
        ([*BASE, "--max-model-len", "1000000000000"], "--max-model-len must be in [1, 33554432]"),
        # a traceback from shlex, even with --dry-run
        ([*BASE, "--dry-run", "--serve-arg", "'x"], """--serve-arg "'x": not words a shell could split (No closing"""),
    ],
)
def test_bad_arguments_are_refused(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_result_dir_that_cannot_be_made_is_refused_before_any_server(bench, capsys, tmp_path):
    """A file given as --result-dir ended in a traceback from mkdir, after the arguments were taken."""
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    for result_dir in (blocker, blocker / "below"):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*BASE, "--result-dir", str(result_dir)])
        assert exit_info.value.code == 2
        assert f"--result-dir {result_dir}: {blocker} is a file, not a folder" in capsys.readouterr().err
    assert blocker.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_table_shows_both_runs_and_the_ratio(bench, monkeypatch, capsys, tmp_path):
    results = {
        "fixed": {"mean_ttft_ms": 20000.0, "median_ttft_ms": 19000.0, "p99_ttft_ms": 30000.0},
        "cpp": {"mean_ttft_ms": 16000.0, "median_ttft_ms": 17100.0, "p99_ttft_ms": 24000.0},
    }
    ran = []
    monkeypatch.setattr(bench, "run_variant", lambda args, variant: ran.append(variant) or results[variant])
    assert bench.main([*BASE, "--result-dir", str(tmp_path / "results")]) == 0
    assert ran == ["fixed", "cpp"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].split()[-3:] == ["20000.0", "16000.0", "0.800"]
    assert lines[-2].split()[-3:] == ["19000.0", "17100.0", "0.900"]
    assert lines[-1].split()[-3:] == ["30000.0", "24000.0", "0.800"]


def test_a_cpp_config_the_server_refuses_stops_the_script_before_any_server(bench, capsys, monkeypatch, tmp_path):
    """A key the CPP server refuses was found only when that server started, after the whole fixed-chunk run,
    and ended in a traceback."""
    monkeypatch.setattr(bench, "run_variant", lambda args, variant: pytest.fail(f"the {variant} server started"))
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    refused = {
        ("--cpp-config", '{"smooth_factr": 0.5}'): "profiling_chunk_config.smooth_factr=0.5: not a known key",
        ("--cpp-config", '{"smooth_factor": 2}'): "profiling_chunk_config.smooth_factor=2:",
        ("--cpp-cache-dir", str(blocker / "cpp")): f"profiling_chunk_config.cache_dir={str(blocker / 'cpp')!r}",
    }
    for (flag, value), why in refused.items():
        with pytest.raises(SystemExit) as exit_info:
            bench.main([*BASE, flag, value, "--result-dir", str(tmp_path / "results")])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"error: {flag} {value}: the CPP server would refuse it at its start:\n{why}" in err, err
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
