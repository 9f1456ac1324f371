"""cpp-twin's command line: clear errors, and how a comparison is summarised."""

from __future__ import annotations

import pytest
from twin_scripted import ScriptedDriver, timer_from_table
from vllm_ascend_patchset.twin.command import main, parse_tokens, summarize_case
from vllm_ascend_patchset.twin.pipeline import run_pipeline
from vllm_ascend_patchset.twin.report import format_table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "long:abc"], "token count 'abc'"),
        (["--workload", "short:1k"], "use long:<tokens>"),
        (["--stages", "4", "--layers", "8,8"], "one positive layer count per stage"),
        (["--surface", "missing.csv"], "no such file"),
        (["--policies", "fixed,best"], "unknown ['best']"),
        (["--smooth-factor", "1.5", "--policies", "upstream"], "--smooth-factor must be in (0, 1]"),
    ],
)
def test_bad_arguments_fail_with_the_flag_and_the_fix(argv, message, capsys):
    assert main(["--surface", "synthetic", *argv] if "--surface" not in argv else argv) == 2
    assert message in capsys.readouterr().err


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
