"""scripts/bench/dual_stream_ttft.py: arguments, commands and the table, without an NPU."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys

import conftest
import pytest

SCRIPT = conftest.ROOT / "scripts" / "bench" / "dual_stream_ttft.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("dual_stream_ttft", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _flag(command, name):
    return command[command.index(name) + 1]


def test_defaults_are_the_reference_setting(bench):
    args = bench.parse_args(["--model", "/m/Qwen3-8B"])
    assert (args.tp, args.input_len, args.num_prompts, args.request_rate) == (2, 2600, 400, "inf")


def test_serve_commands_differ_only_in_the_dual_stream_config(bench):
    args = bench.parse_args(["--model", "/m/Qwen3-8B", "--split-strategy", "half_batch", "--length-threshold", "256",
                             "--serve-arg", "--max-num-batched-tokens 8192"])  # fmt: skip
    single, dual = (bench.serve_command(args, v) for v in bench.VARIANTS)
    assert single[:3] == ["vllm", "serve", "/m/Qwen3-8B"] and _flag(single, "--tensor-parallel-size") == "2"
    assert "--enforce-eager" in single and "--enforce-eager" in dual  # else dual stream splits nothing
    assert json.loads(_flag(single, "--additional-config")) == {"dual_stream_config": {"enabled": False}}
    assert json.loads(_flag(dual, "--additional-config")) == {
        "dual_stream_config": {"enabled": True, "split_strategy": "half_batch", "length_threshold": 256}
    }
    assert single[-2:] == dual[-2:] == ["--max-num-batched-tokens", "8192"]
    strip = [i for i, part in enumerate(single) if part == "--additional-config"][0] + 1
    assert single[:strip] == dual[:strip] and single[strip + 1 :] == dual[strip + 1 :]


def test_bench_command_drives_the_reference_load_and_saves_where_it_reads(bench, tmp_path):
    args = bench.parse_args(["--model", "m", "--result-dir", str(tmp_path), "--port", "8123"])
    for variant in bench.VARIANTS:
        command = bench.bench_command(args, variant)
        assert command[:3] == ["vllm", "bench", "serve"]
        assert _flag(command, "--random-input-len") == "2600" and _flag(command, "--num-prompts") == "400"
        assert _flag(command, "--dataset-name") == "random" and _flag(command, "--port") == "8123"
        assert _flag(command, "--percentile-metrics") == "ttft,tpot"
        assert _flag(command, "--metric-percentiles") == "50,99"
        assert "--save-result" in command
        path = tmp_path / _flag(command, "--result-filename")
        assert path == bench.result_path(args, variant) and _flag(command, "--result-dir") == str(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "m", "--tp", "1"], "--tensor-parallel-size must be >= 2"),
        (["--model", "m", "--num-prompts", "0"], "must be >= 1"),
        (["--model", "m", "--request-rate", "fast"], "--request-rate must be 'inf' or a number > 0"),
        (["--model", "m", "--split-strategy", "random"], "invalid choice"),
        (["--model", "m", "--balance-threshold", "0"], "must be > 0"),
        ([], "--model"),
        # each reached vllm serve or vllm bench serve, which refused it (or never finished) minutes later
        (["--model", "m", "--tp", "1000000"], "--tensor-parallel-size must be in [2, 64], got 1000000"),
        (["--model", "m", "--port", "70000"], "--port must be in [1, 65535], got 70000"),
        (["--model", "m", "--input-len", "1000000000000"], "--input-len must be in [1, 33554432]"),
        (["--model", "m", "--num-prompts", "1000000000000"], "--num-prompts must be in [1, 100000]"),
        (["--model", "m", "--request-rate", "nan"], "--request-rate must be 'inf' or a number > 0"),
        (["--model", "m", "--request-rate", "0.001"], "--request-rate 0.001: 400 prompts arrive over 400000 s"),
        (["--model", "m", "--balance-threshold", "inf"], "--balance-threshold must be a finite number > 0"),
        (["--model", "m", "--length-threshold", "1000000000000"], "--length-threshold must be in [1, 33554432]"),
        # a traceback from shlex, even with --dry-run
        (
            ["--model", "m", "--dry-run", "--serve-arg", "--served-model-name 'x"],
            """--serve-arg "--served-model-name 'x": not words a shell could split (No closing quotation)""",
        ),
    ],
)
def test_bad_arguments_are_refused(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_dry_run_prints_four_commands_and_runs_nothing(bench, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("dry run started a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    assert bench.main(["--model", "/m/Qwen3-32B", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "# single stream" and lines[3] == "# dual stream"
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert [c[1] for c in commands] == ["serve", "bench", "serve", "bench"]
    assert '"enabled":true' in lines[4] and '"enabled":false' in lines[1]


def test_the_table_shows_the_change_in_percent(bench):
    # the reference TTFT figures (ms): single 4318.88 / 3844.99 / 8084.73, dual 4046.86 / 3587.15 / 7526.99
    single = dict(mean_ttft_ms=4318.88, median_ttft_ms=3844.99, p99_ttft_ms=8084.73, mean_tpot_ms=50.0,
                  median_tpot_ms=48.0, p99_tpot_ms=80.0)  # fmt: skip
    dual = dict(mean_ttft_ms=4046.86, median_ttft_ms=3587.15, p99_ttft_ms=7526.99, mean_tpot_ms=51.0,
                median_tpot_ms=48.0, p99_tpot_ms=84.0)  # fmt: skip
    table = bench.comparison_table(single, dual).splitlines()
    assert table[0].split() == ["metric", "single", "stream", "dual", "stream", "change"]
    assert table[1].split()[-3:] == ["4318.88", "4046.86", "-6.30%"]
    assert table[2].split()[-1] == "-6.71%" and table[3].split()[-1] == "-6.90%"
    assert table[4].split()[-1] == "+2.00%" and table[6].split()[-1] == "+5.00%"


def _refused_before_any_server(bench, monkeypatch, capsys, tmp_path, argv):
    monkeypatch.setattr(bench, "run_variant", lambda args, variant: pytest.fail(f"the {variant.label} server started"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", "m", "--result-dir", str(tmp_path / "results"), *argv])
    assert exit_info.value.code == 2 and not (tmp_path / "results").exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.full_tier("the script checks the budget with the dual-stream config module, which imports vLLM")
def test_a_length_threshold_above_half_the_budget_stops_the_script_before_any_server(
    bench, monkeypatch, capsys, tmp_path
):
    """The dual-stream server refused it at its start, after the whole single-stream run."""
    for budget in (["--serve-arg", "--max-num-batched-tokens 4096"], ["--serve-arg=--max-num-batched-tokens=4096"]):
        err = _refused_before_any_server(bench, monkeypatch, capsys, tmp_path, ["--length-threshold", "2049", *budget])
        assert "error: --length-threshold 2049 and --serve-arg '--max-num-batched-tokens 4096': the dual-stream " in err
        assert "server refuses it: must be <= 2048, half of --max-num-batched-tokens (4096" in err
    args = bench.parse_args(["--model", "m", "--length-threshold", "2048", "--serve-arg", "--max-num-batched-tokens 4k",
                             "--serve-arg", "--max-num-batched-tokens 4096"])  # fmt: skip
    assert bench.serve_budget(args) == 4096  # the last one given is vLLM's
    assert "--length-threshold 2048" not in capsys.readouterr().err
    bench.parse_args(["--model", "m", "--length-threshold", "1025"])  # vLLM's default budget: not known here
    assert "warning: --length-threshold 1025 is above half of 2048" in capsys.readouterr().err


@pytest.mark.full_tier("the script checks the section with the dual-stream config module, which imports vLLM")
def test_a_budget_too_small_for_the_measured_gate_stops_the_script_before_any_server(
    bench, monkeypatch, capsys, tmp_path
):
    err = _refused_before_any_server(bench, monkeypatch, capsys, tmp_path, ["--serve-arg=--max-num-batched-tokens 200"])
    assert "error: without --length-threshold and --serve-arg '--max-num-batched-tokens 200': the dual-stream" in err
    assert "Set length_threshold to at most 100 or raise --max-num-batched-tokens to at least 256" in err
    args = bench.parse_args(["--model", "m", "--length-threshold", "100", "--serve-arg=--max-num-batched-tokens 200"])
    assert args.length_threshold == 100 and capsys.readouterr().err == ""
