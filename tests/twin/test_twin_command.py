"""cpp-twin's command line: clear errors before any worker starts, a non-zero exit for any failed or
invalid run, and how a comparison is summarised."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from twin_scripted import ScriptedDriver, timer_from_table
from vllm_ascend_patchset.twin import policies as pol
from vllm_ascend_patchset.twin.command import main, summarize_case
from vllm_ascend_patchset.twin.options import parse_tokens
from vllm_ascend_patchset.twin.pipeline import run_pipeline
from vllm_ascend_patchset.twin.report import format_table


@pytest.fixture
def no_workers(monkeypatch):
    """Fails the test if a policy subprocess would start: bad input must be refused before."""

    def run_cases(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(pol, "run_cases", run_cases)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusal (exit 2)
        return exc.code


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CSV_HEAD = "# measured\nchunk_tokens,history_tokens,latency_ms\n"
GOOD_ROWS = "".join(f"{c},{h},{1 + c / 100 + h / 1000}\n" for c in (256, 512, 1024) for h in (0, 4096))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "long:abc"], "--workload 'long:abc': token count 'abc'"),
        (["--workload", "long:inf"], "--workload 'long:inf': token count 'inf'"),
        (["--workload", "long:1.5"], "token count '1.5': give a whole number > 0"),
        (["--workload", "long:-4k"], "token count '-4k'"),
        (["--workload", "long:1e9"], "--workload long:1e9: a request of 1000000001 tokens"),
        (["--workload", "short:1k"], "use long:<tokens>"),
        (["--workload", "mixed", "--prompt-range", "64k-4k"], "--prompt-range '64k-4k': LOW must not exceed HIGH"),
        (["--workload", "mixed", "--output-range", "0-16"], "--output-range expects LOW-HIGH"),
        (["--workload", "mixed", "--prompt-range", "1k-4000k"], "--prompt-range/--output-range: a request of"),
        (["--stages", "abc"], "--stages 'abc': give whole numbers >= 1"),
        (["--stages", "0"], "--stages '0': give whole numbers >= 1"),
        (["--stages", "1,2"], "--stages 1,2: CPP (ours, upstream) needs pipeline parallelism, P >= 2"),
        (["--stages", "4", "--layers", "8,8"], "one positive layer count per stage"),
        (["--stages", "2", "--layers", "8,x"], "--layers '8,x': give whole numbers >= 1"),
        # bounds from what the twin can mean (each ran for minutes, or gave figures not to be trusted)
        (["--stages", "100000000000000000000"], "--stages 100000000000000000000: at most 64 pipeline stages"),
        (["--stages", "2,65"], "--stages 2,65: at most 64 pipeline stages (a real pipeline has a few dozen"),
        (["--noise", "1e308"], "--noise must be a finite number in [0, 1], got 1e+308 (a relative sigma"),
        (["--noise", "1.01"], "--noise must be a finite number in [0, 1], got 1.01"),
        (["--load", "1e-300"], "--load must be a finite number in [0.01, 100], got 1e-300 (a fraction of the"),
        (["--load", "0.5,101"], "--load must be a finite number in [0.01, 100], got 101.0"),
        (["--workload", "mixed", "--requests", "1000000"], "--requests must be in [1, 10000], got 1000000"),
        (
            ["--workload", "mixed", "--requests", "2000"],
            "--requests/--prompt-range: 2000 requests of ",
        ),
        (["--workload", "trace:t.jsonl@0:20000"], "COUNT 20000 is more than a run replays (10000 requests at most)"),
        (["--surface", "quadratic:1,1e300,0,0,0"], "the twin's largest batch (2097152 tokens after 2097152 of"),
        (["--surface", "quadratic:1,0,0,0,1e-2"], "takes 4.39805e+10 ms on it; a batch must take at most 1e+10 ms"),
        (["--chunk", "10"], "--chunk 10: a chunk budget must lie in [64, "),
        (["--chunk", "abc"], "argument --chunk: token count 'abc'"),
        (["--min-chunk", "-5"], "argument --min-chunk: token count '-5'"),
        (["--sweep", "4096,10"], "--sweep 10: a chunk budget must lie in [64, "),
        (["--sweep", "4096,x"], "--sweep item 'x'"),
        (["--noise", "-0.1"], "--noise must be a finite number in [0, 1], got -0.1"),
        (["--noise", "nan"], "--noise must be a finite number in [0, 1], got nan"),
        (["--load", "inf"], "--load must be a finite number in [0.01, 100], got inf"),
        (["--prefix-hit-share", "1.5"], "--prefix-hit-share must be a finite number in [0, 1]"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--requests", "0"], "--requests must be in [1, 10000], got 0"),
        (["--policies", ""], "--policies '': give at least one of fixed,tuned,upstream,ours"),
        (["--policies", " , "], "give at least one of fixed,tuned,upstream,ours"),
        (["--policies", "fixed,best"], "unknown ['best']"),
        (["--smooth-factor", "1.5", "--policies", "upstream"], "--smooth-factor must be in (0, 1]"),
        (["--smooth-factor", "nan", "--policies", "upstream"], "--smooth-factor must be in (0, 1]"),
        (["--tune", "--tune-base-chunks", "4096,32"], "--tune-base-chunks 32: a chunk budget must lie in"),
        (["--tune", "--tune-smooth-factors", "0.5,0"], "--tune-smooth-factors '0.5,0': give numbers in (0, 1]"),
        (["--surface", "missing.csv"], "no such file"),
        (["--surface", "quadratic:0,0,1,0,0"], "a 1-token chunk takes 0 ms on it"),
        (["--surface", "quadratic:5e-324,0,0,0,0"], "a 1-token chunk takes 4.94066e-324 ms on it; every batch"),
        (["--surface", "quadratic:1e-300,0,0,0,0"], "must take at least 0.001 ms (a microsecond)"),
        (["--surface", "quadratic:nan,0,0,0,0"], "must be finite and >= 0"),
        # ms bounds of a day at most (1e300 was taken, and handed to ours as its target_tpot_ms)
        (["--slo-ttft-ms", "1e300"], "--slo-ttft-ms must be a finite number in (0, 86400000], got 1e+300"),
        (["--slo-tpot-ms", "1e300"], "--slo-tpot-ms must be a finite number in (0, 86400000], got 1e+300"),
        (["--target-tpot-ms", "0"], "--target-tpot-ms must be a finite number in (0, 86400000], got 0.0"),
        (["--tune", "--target-tpot-ms", "50"], "--tune searches the base chunk and smooth factor alone: leave out"),
        (["--tune", "--min-chunk", "256"], "leave out --min-chunk"),
        (["--target-tpot-ms", "nan"], "--target-tpot-ms must be a finite number in (0, 86400000], got nan"),
        # token counts within the twin's model (each started the workers: min_chunk failed in ours after the
        # other policies had run, a reference of 1e12 tokens never finished)
        (["--min-chunk", "1e12"], "--min-chunk must be a finite number in [1, 2097152], got 1000000000000"),
        (["--output-cap", "1e12"], "--output-cap must be a finite number in [1, 2096896], got 1000000000000"),
        (["--slo-reference", "1e12"], "--slo-reference must be a finite number in [1, 2096896], got 1000000000000"),
        (["--stages", "4", "--layers", "1000000000000,1,1,1"], "--layers must be a finite number in [1, 1000], got"),
        (["--stages", "2", "--layers=-1,1"], "--layers '-1,1': give whole numbers >= 1"),
        # checked whatever the policies (ignored without a CPP policy, and '' fell back to the default surface)
        (["--smooth-factor", "5", "--policies", "fixed,tuned"], "--smooth-factor must be in (0, 1], got 5.0"),
        (["--surface", ""], "--surface '': give a .csv, a profile .json, 'synthetic', quadratic:"),
    ],
)
def test_bad_arguments_fail_before_any_worker_naming_the_flag_and_the_fix(argv, message, capsys, no_workers):
    assert _exit_code(["--surface", "synthetic", *argv] if "--surface" not in argv else argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        (CSV_HEAD + GOOD_ROWS + "2048,0,abc\n", "bad.csv:9: latency_ms 'abc' must be a number of milliseconds"),
        (CSV_HEAD + GOOD_ROWS + "2048,0,-3.5\n", "bad.csv:9: latency_ms '-3.5'"),
        (CSV_HEAD + GOOD_ROWS + "2048,0,nan\n", "bad.csv:9: latency_ms 'nan'"),
        (CSV_HEAD + GOOD_ROWS + "-2048,0,5\n", "bad.csv:9: chunk_tokens '-2048' must be a whole number in [1,"),
        (CSV_HEAD + GOOD_ROWS + "2048,-1,5\n", "bad.csv:9: history_tokens '-1' must be a whole number in [0,"),
        (CSV_HEAD + GOOD_ROWS + "2048.5,0,5\n", "bad.csv:9: chunk_tokens '2048.5'"),
        (CSV_HEAD + GOOD_ROWS + "2048,0\n", "bad.csv:9: 2 value(s), the header names 3"),
        (CSV_HEAD + "".join(f"{c},0,0\n" for c in (256, 512, 1024, 2048, 4096)), "bad.csv:3: latency_ms '0'"),
        (CSV_HEAD + "256,0,1\n", "two or more measured chunk sizes"),
        # csv's own refusals (a cell over its 128 KiB field limit) ended in a traceback
        pytest.param(
            CSV_HEAD + GOOD_ROWS + "2048,0," + "1" * 200_000 + "\n",
            "bad.csv:9: not a CSV row of numbers (field larger than field limit",
            id="a-cell-over-csv's-limit",
        ),
        pytest.param(
            "chunk_tokens,history_tokens," + "l" * 200_000 + "\n",
            "bad.csv:1: not a CSV row of numbers (field larger than field limit",
            id="a-header-cell-over-csv's-limit",
        ),
    ],
)
def test_a_bad_csv_surface_names_the_file_and_line(tmp_path, text, message, capsys, no_workers):
    spec = _file(tmp_path, "bad.csv", text)
    assert main(["--surface", spec]) == 2
    err = capsys.readouterr().err
    assert message in err or (message == "fewer" and "at least 5 measured points" in err and spec in err), err


@pytest.mark.parametrize(
    "samples, message",
    [
        ([[256, 0, 1.0]] * 4 + [[512, 0, -2.0]], "samples[4]: latency_ms -2.0"),
        ([[256, 0, 1.0]] * 4 + [[512, "x", 2.0]], "samples[4]: history_tokens 'x'"),
        ([[256, 0, 1.0]] * 4 + [[512, 0]], "samples[4] must be [chunk_tokens, history_tokens, latency_ms]"),
    ],
)
def test_a_bad_profile_sample_is_named(tmp_path, samples, message, capsys, no_workers):
    spec = _file(tmp_path, "profile.json", json.dumps({"samples": samples}))
    assert main(["--surface", spec]) == 2
    assert f"--surface {spec}: {message}" in capsys.readouterr().err


def test_profile_coefficients_beyond_any_batch_time_are_refused(tmp_path, capsys, no_workers):
    """Coefficients of 1e300 were accepted: every batch took inf ms, and the figures meant nothing."""
    coefficients = {"c0_ms": 1.0, "c1_ms": 1e300, "c2_ms": 0.0, "c3_ms": 0.0, "c4_ms": 0.0}
    spec = _file(tmp_path, "profile.json", json.dumps({"coefficients": coefficients}))
    assert main(["--surface", spec, "--policies", "fixed"]) == 2
    err = capsys.readouterr().err
    assert f"--surface {spec}: the twin's largest batch" in err and "a batch must take at most 1e+10 ms" in err


@pytest.mark.parametrize("option, folder", [("--json", False), ("--plot", True), ("--log-dir", True)])
def test_an_unwritable_output_is_refused_before_the_run_and_nothing_is_left(
    tmp_path, option, folder, capsys, no_workers
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    target = blocker / ("out" if folder else "out.json")
    assert main(["--surface", "synthetic", option, str(target)]) == 2
    assert f"{option} {target}: {blocker} is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


REFUSED_LATE = [
    ["--stages", "4", "--layers", "8,8"],
    ["--stages", "1"],
    ["--policies", "best"],
    ["--workload", "long:1e9"],
]


@pytest.mark.parametrize("option", ["--plot", "--log-dir"])
@pytest.mark.parametrize("refused", REFUSED_LATE)
def test_a_refused_run_makes_no_output_folder(tmp_path, option, refused, capsys, no_workers):
    """The folder check made --plot and --log-dir before the later checks refused the run."""
    target = tmp_path / "new" / "out"
    assert main(["--surface", "synthetic", option, str(target), *refused]) == 2
    assert "cpp-twin: error: " in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "the check made no folder"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_writable_json_path_is_not_left_behind_by_the_check(tmp_path, monkeypatch):
    target = tmp_path / "new" / "figures.json"
    monkeypatch.setattr(pol, "run_cases", lambda cases, log_dir: [[fake_result("fixed-8192", "fixed", 8192, 0.0)]])
    argv = ["--surface", "synthetic", "--policies", "fixed", "--workload", "long:1k", "--stages", "2"]
    target.parent.mkdir()
    assert main([*argv, "--json", str(target)]) == 1  # zero stage times: invalid figures, exit 1
    assert json.loads(target.read_text())[0]["workload"] == "long-1k"  # the figures are written all the same
    target.unlink()

    def worker_died(cases, log_dir):
        raise pol.WorkerFailed("twin worker for pristine failed (exit 1)")

    monkeypatch.setattr(pol, "run_cases", worker_died)
    assert main([*argv, "--json", str(target)]) == 2
    assert not target.exists(), "the writability check leaves no empty file behind"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the fake result's zero stage times
def test_a_refused_run_makes_no_folder_for_its_json_and_a_run_makes_them(tmp_path, monkeypatch, no_workers):
    target = tmp_path / "new" / "sub" / "figures.json"
    argv = ["--surface", "synthetic", "--json", str(target)]
    assert main([*argv, "--load", "0"]) == 2  # refused after the --json check
    assert not (tmp_path / "new").exists(), "the check made no folder"
    monkeypatch.setattr(pol, "run_cases", lambda cases, log_dir: [[fake_result("fixed-8192", "fixed", 8192, 0.0)]])
    assert main([*argv, "--policies", "fixed", "--workload", "long:1k", "--stages", "2"]) == 1
    assert json.loads(target.read_text())[0]["workload"] == "long-1k"


def test_token_counts_take_a_k_suffix():
    assert parse_tokens("128k") == 131072
    assert parse_tokens("4096") == 4096


def fake_result(name: str, kind: str, chunk_tokens: int, per_stage_ms: float) -> dict:
    """A policy's result as the worker returns it, from a scripted one-prompt run."""
    driver = ScriptedDriver([chunk_tokens] * 4)
    records = run_pipeline(driver, timer_from_table({chunk_tokens: (per_stage_ms, per_stage_ms)}), num_stages=2)
    return {
        "policy": {"name": name, "kind": kind, "max_num_batched_tokens": chunk_tokens},
        "batches": [r.to_json() for r in records],
        "requests": [driver.log.to_json()],
        "start_up": "",
    }


def test_summary_picks_the_fastest_fixed_chunk_as_tuned_and_orders_the_rows():
    results = [
        fake_result("fixed-100", "fixed", 100, 3.0),
        fake_result("fixed-200", "fixed", 200, 2.0),
        fake_result("fixed-300", "fixed", 300, 4.0),
        fake_result("upstream-cpp", "upstream", 250, 2.5),
        {"policy": {"name": "ours", "kind": "ours", "max_num_batched_tokens": 300}, "error": "RuntimeError: boom"},
    ]
    rows, tuned, upstream, notes = summarize_case(results, 2, 300, {"fixed", "tuned", "upstream", "ours"})
    assert [r.name for r in rows] == ["vllm-fixed-300", "tuned-fixed-200", "upstream-cpp"]
    assert tuned.ttft_mean_ms == 10.0  # 4 chunks + 1 drain, 2 ms per stage
    assert notes == ["ours: FAILED RuntimeError: boom"]
    table = format_table("case", rows, tuned, upstream, show_tpot=False)
    assert "vllm-fixed-300" in table and "2.000" in table  # 20 ms / 10 ms against tuned


def test_plot_writes_a_gantt_row_per_policy_and_the_chunk_chart(tmp_path):
    from vllm_ascend_patchset.twin.plot import plot_case
    from vllm_ascend_patchset.twin.policies import Setup
    from vllm_ascend_patchset.twin.workloads import long_prompt

    results = [fake_result("fixed-200", "fixed", 200, 2.0), fake_result("upstream-cpp", "upstream", 250, 2.5)]
    rows, *_ = summarize_case(results, 2, 200, {"fixed", "upstream"})
    paths = plot_case(tmp_path, Setup("synthetic", 2, long_prompt(800)), results, rows, 200)
    assert [p.name for p in paths] == ["gantt-long-800-p2.png", "chunks-long-800-p2.png"]
    import matplotlib.image

    gantt = matplotlib.image.imread(paths[0])
    assert gantt.shape[0] > 200 and gantt.shape[1] > 600  # two policies x two stages, readable size


def _fake_run(per_stage_ms_by_name: dict[str, float | None]):
    """run_cases stand-in: each policy's scripted result (None: the policy failed in its worker)."""

    def run_cases(cases, log_dir=None):
        out = []
        for _, policies in cases:
            results = []
            for p in policies:
                ms = per_stage_ms_by_name[p.name]
                if ms is None:
                    results.append({"policy": p.to_json(), "error": "ValidationError: boom"})
                else:
                    results.append(fake_result(p.name, p.kind, p.max_num_batched_tokens, ms))
            out.append(results)
        return out

    return run_cases


ARGS = ["--surface", "synthetic", "--policies", "fixed,upstream", "--workload", "long:1k", "--stages", "2"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the invalid figures
@pytest.mark.parametrize(
    "outcome, problem",
    [
        ({"fixed-8192": None, "upstream-cpp": None}, "fixed-8192: failed"),
        ({"fixed-8192": 2.0, "upstream-cpp": None}, "upstream-cpp: failed"),
        ({"fixed-8192": 2.0, "upstream-cpp": math.nan}, "upstream-cpp: prefill tok/s is nan"),
        ({"fixed-8192": 0.0, "upstream-cpp": 2.0}, "fixed-8192: TTFT mean is 0.0"),
        ({"fixed-8192": math.inf, "upstream-cpp": 2.0}, "fixed-8192: TTFT mean is inf"),
    ],
)
def test_any_failed_policy_or_invalid_figure_exits_non_zero_and_says_which(monkeypatch, capsys, outcome, problem):
    monkeypatch.setattr(pol, "run_cases", _fake_run(outcome))
    assert main(ARGS) == 1
    err = capsys.readouterr().err
    assert "these figures are not to be trusted" in err and f"long-1k P=2: {problem}" in err


def test_an_incomplete_run_exits_non_zero(monkeypatch, capsys):
    def run_cases(cases, log_dir=None):
        result = fake_result("fixed-8192", "fixed", 8192, 2.0)
        result["requests"][0]["scheduled_tokens"] -= 1
        return [[result]]

    monkeypatch.setattr(pol, "run_cases", run_cases)
    assert main([*ARGS[:3], "fixed", *ARGS[4:]]) == 1
    assert "fixed-8192: incomplete: r: cached 0 + scheduled" in capsys.readouterr().err


def test_a_sound_comparison_exits_zero(monkeypatch, capsys):
    monkeypatch.setattr(pol, "run_cases", _fake_run({"fixed-8192": 2.0, "upstream-cpp": 1.5}))
    assert main(ARGS) == 0
    assert capsys.readouterr().err == ""


def test_tune_exits_non_zero_when_a_setting_failed(monkeypatch, capsys):
    def run_cases(cases, log_dir=None):
        return [
            [
                {"policy": p.to_json(), "error": "boom"}
                if "smooth0.5" in p.name
                else fake_result(p.name, p.kind, p.max_num_batched_tokens, 2.0)
                for p in policies
            ]
            for _, policies in cases
        ]

    monkeypatch.setattr(pol, "run_cases", run_cases)
    argv = ["--surface", "synthetic", "--tune", "--policies", "upstream", "--workload", "long:1k", "--stages", "2"]
    assert main([*argv, "--tune-base-chunks", "4096", "--tune-smooth-factors", "0.5,1"]) == 1
    assert "1 setting(s) failed or ran incomplete: upstream-base4096-smooth0.5" in capsys.readouterr().err


def test_a_json_path_that_is_not_a_file_is_refused_before_any_worker(capsys, no_workers):
    assert main(["--surface", "synthetic", "--json", "/dev/full"]) == 2
    assert "--json /dev/full: not a regular file" in capsys.readouterr().err


def test_the_json_is_written_whole_or_not_at_all_and_a_failure_keeps_the_tables(tmp_path, monkeypatch, capsys):
    from vllm_ascend_patchset.twin import command

    target = tmp_path / "figures.json"
    target.write_text("previous figures")
    monkeypatch.setattr(command.json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    assert not command._write_json(target, [{"a": 1}])
    assert target.read_text() == "previous figures" and [p.name for p in tmp_path.iterdir()] == ["figures.json"]
    assert "could not write (No space left)" in capsys.readouterr().err
    monkeypatch.undo()
    assert command._write_json(target, [{"a": 1}]) and json.loads(target.read_text()) == [{"a": 1}]


def test_ours_gets_the_target_tpot_ms_given_else_the_tpot_bound_goodput_is_judged_by():
    from vllm_ascend_patchset.twin.command import build_parser, cpp_options

    parser = build_parser()
    assert "target_tpot_ms" not in cpp_options(parser.parse_args([]))
    assert cpp_options(parser.parse_args(["--slo-tpot-ms", "80"]))["target_tpot_ms"] == 80.0
    both = parser.parse_args(["--slo-tpot-ms", "80", "--target-tpot-ms", "1e6"])
    assert cpp_options(both)["target_tpot_ms"] == 1e6  # TTFT first, goodput still judged at 80 ms
