"""Report helpers: interval overlap (bubbles) and the many-case summary table."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_ascend_patchset.twin.report import interval_union, overlap_ms
from vllm_ascend_patchset.twin.summary import load_cases, main, summary_table

intervals = st.lists(
    st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 20, allow_nan=False)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(intervals, intervals)
def test_overlap_is_the_length_of_the_intersection_point_by_point(first, second):
    """Against a brute force on a fine grid of the two unions."""
    a, b = interval_union(first), interval_union(second)
    cuts = sorted({x for iv in a + b for x in iv})
    expected = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:], strict=False):
        middle = (lo + hi) / 2
        if any(s <= middle <= e for s, e in a) and any(s <= middle <= e for s, e in b):
            expected += hi - lo
    assert overlap_ms(a, b) == pytest.approx(expected, abs=1e-9)


def row(
    name: str, ttft_s: float, p99_s: float, tpot_p99: float | None, goodput: float | None,
    e2e_s: tuple[float, float] | None = None,
) -> dict:  # fmt: skip
    e2e = {"e2e_mean_ms": 1000 * e2e_s[0], "e2e_p99_ms": 1000 * e2e_s[1]} if e2e_s else {}
    return {"name": name, "ttft_mean_ms": 1000 * ttft_s, "ttft_p99_ms": 1000 * p99_s, "tpot_p99_ms": tpot_p99,
            "goodput": goodput, **e2e}  # fmt: skip


CASES = [
    {
        "surface": "tests/data/cpu_surface.csv",
        "workload": "mooncake-s0-n32-load0.8",
        "stages": 4,
        "rows": [
            row("vllm-fixed-8192", 4.0, 8.0, 900.0, 0.25),
            row("tuned-fixed-256", 2.0, 5.0, 120.0, 0.5),
            row("upstream-cpp", 3.0, 6.0, 700.0, 0.375),
            row("ours", 1.0, 4.0, 80.0, 0.75),
        ],
    },
    {
        "surface": "tests/data/cpu_surface.csv",
        "workload": "mooncake-s32-n32-load0.5",
        "stages": 2,
        "rows": [row("tuned-fixed-1024", 2.0, 3.0, 100.0, 1.0), row("ours", 4.0, 5.0, 90.0, 0.5)],
    },
]


def test_summary_has_a_row_per_case_and_each_policy_s_figures(tmp_path):
    table = summary_table(CASES)
    lines = table.splitlines()
    assert lines[2] == (
        "| cpu_surface.csv | mooncake-s0-n32 | 0.8 | 4 | 256 | 4.00 / 8.00 | 900 | - | 25 | 2.00 / 5.00 | 120 | - | 50"
        " | 3.00 / 6.00 | 700 | - | 38 | 1.00 / 4.00 | 80 | - | 75 |"
    )
    assert lines[3].startswith("| cpu_surface.csv | mooncake-s32-n32 | 0.5 | 2 | 1024 | - | - | - | - | 2.00 / 3.00 |")
    # ours: TTFT 0.5x and 2x of tuned -> geometric mean 1; goodput (75 + 50) / 2.
    assert "cpu_surface.csv (2 cases): " in table and "ours: TTFT x1.000 of tuned, mean goodput 62.5%" in table
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(CASES))
    assert load_cases([path])[0]["workload"] == "mooncake-s0-n32-load0.8"


def test_summary_gives_end_to_end_latency_where_the_rows_have_it():
    """Each policy's E2E mean / P99 cell, and its geometric mean over tuned fixed's per surface
    (only where every case has it: a mean over some cases would not compare with the TTFT's)."""
    cases = [
        {**CASES[0], "rows": [row("tuned-fixed-256", 2.0, 5.0, 120.0, 0.5, (10.0, 30.0)),
                              row("ours", 1.0, 4.0, 80.0, 0.75, (5.0, 31.0))]},
        {**CASES[1], "rows": [row("tuned-fixed-1024", 2.0, 3.0, 100.0, 1.0, (8.0, 20.0)),
                              row("ours", 4.0, 5.0, 90.0, 0.5, (16.0, 40.0))]},
    ]  # fmt: skip
    table = summary_table(cases)
    assert "| 1.00 / 4.00 | 80 | 5.00 / 31.00 | 75 |" in table.splitlines()[2]
    # ours: E2E 0.5x and 2x of tuned -> geometric mean 1.
    assert "ours: TTFT x1.000, E2E x1.000 of tuned, mean goodput 62.5%" in table
    assert "E2E" not in summary_table(CASES).split("\n\n", 1)[1]


def test_summary_refuses_a_file_that_is_not_twin_json(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    assert main([str(path)]) == 2
    assert f"{path}: not a cpp-twin --json file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, says",
    [
        ("[1, 2]", "a case is not an object"),
        ('[{"foo": 1}]', "a case lacks its workload or stages"),
        ('[{"workload": "w", "stages": 2, "rows": []}]', "case 'w' has no rows"),
        ('[{"workload": "w", "stages": 2, "rows": [{"ttft_mean_ms": 1}]}]', "a row without a policy name"),
        (
            '[{"workload": "w", "stages": 2, "rows": [{"name": "ours", "ttft_mean_ms": 0, "ttft_p99_ms": 1}]}]',
            "ours: TTFT mean and P99 must be positive numbers",
        ),
    ],
)
def test_summary_names_the_file_and_what_is_wrong_without_a_traceback(tmp_path, capsys, content, says):
    path = tmp_path / "x.json"
    path.write_text(content)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a cpp-twin --json file (" in err and says in err and "Traceback" not in err


def test_summary_reads_past_no_binary_file_and_answers_help(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert main([str(path)]) == 2
    assert f"{path}: not a cpp-twin --json file" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "usage: python -m vllm_ascend_patchset.twin.summary" in capsys.readouterr().out
