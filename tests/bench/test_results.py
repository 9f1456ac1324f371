"""scripts/bench/results.py and scripts/bench/doc_images.py: the results page is what the saved outputs render,
a run is saved with its command, date and commit, bad input is refused before anything is written; the
dual-stream timeline follows the schedule's order.

That docs/results.md is the render of docs/results/*.json, and that the README and docs quote it, is checked
by tests/test_doc_numbers.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from vllm_ascend_patchset import results_tables
from vllm_ascend_patchset.paths import BENCH_DIR


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


results = _load("results")
doc_images = _load("doc_images")


@pytest.fixture
def page(tmp_path, monkeypatch):
    """A results page of one source (``echo``: prints a line) in a folder of its own."""
    source = results.Source("echo", ("echo served one line",), results_tables.render_recorded)
    monkeypatch.setattr(results, "SOURCES", (source,))
    monkeypatch.setattr(results, "BY_NAME", {"echo": source})
    path = tmp_path / "results.md"
    path.write_text(f"# Results\n\nprose above\n\n{results.begin('echo')}\nstale\n{results.end('echo')}\nprose below\n")
    monkeypatch.setattr(results, "PAGES", (path,))
    monkeypatch.setattr(results, "ROOT", tmp_path)
    saved = tmp_path / "saved"
    saved.mkdir()
    return path, saved


def test_a_run_is_saved_with_its_command_date_and_commit_and_the_page_rewritten_between_its_markers(page, monkeypatch):
    path, saved = page
    monkeypatch.setattr(results, "_git", lambda *args: "" if args[0] == "status" else "abc1234")
    assert results.main(["--run", "echo", "--from-json", str(saved)]) == 0
    record = json.loads((saved / "echo.json").read_text())
    assert record["commands"] == ["echo served one line"] and record["commit"] == "abc1234"
    assert record["output"] == {"stdout": "served one line\n"} and not record["dirty"] and not record["recorded"]
    text = path.read_text()
    assert "stale" not in text and "prose above" in text and text.endswith(f"{results.end('echo')}\nprose below\n")
    assert "```\nserved one line\n```" in text and f"Measured {record['date']}, commit abc1234" in text
    assert results.main(["--check", "--from-json", str(saved)]) == 0
    path.write_text(text.replace("served one line\n```", "served two lines\n```"))
    assert results.main(["--check", "--from-json", str(saved)]) == 1


def test_a_failed_bench_saves_nothing_and_leaves_the_page(page, monkeypatch, capsys):
    path, saved = page
    failing = results.Source("echo", ("exit 3",), results_tables.render_recorded)
    monkeypatch.setattr(results, "BY_NAME", {"echo": failing})
    before = path.read_text()
    assert results.main(["--run", "echo", "--from-json", str(saved)]) == 1
    assert "echo: exit 3 exited 3; nothing saved" in capsys.readouterr().err
    assert not (saved / "echo.json").exists() and path.read_text() == before


@pytest.mark.parametrize(
    "argv, saved_text, expected",
    [
        (["--run", "nope,echo"], None, "--run nope: no such source; the sources are echo"),
        ([], None, "echo.json: missing; run: python scripts/bench/results.py --run echo"),
        ([], "{not json", "echo.json: not a saved output of echo"),
        ([], '{"name": "other"}', "echo.json: not a saved output of echo (its name is not this source's)"),
        ([], '{"name": "echo", "commands": [], "date": "d", "commit": "c", "host": "h", "output": {}}',
         "echo.json: not a saved output of echo (tables)"),
    ],
    ids=["unknown source", "missing", "not JSON", "another source's", "no table"],
)  # fmt: skip
def test_bad_input_exits_2_naming_it_and_writes_nothing(page, capsys, argv, saved_text, expected):
    path, saved = page
    if saved_text is not None:
        (saved / "echo.json").write_text(saved_text)
    before = path.read_text()
    assert results.main([*argv, "--from-json", str(saved)]) == 2
    assert expected in capsys.readouterr().err
    assert path.read_text() == before


def test_a_page_without_a_sources_markers_is_refused_before_any_bench_runs(page, monkeypatch, capsys):
    path, saved = page
    path.write_text("# Results\n")
    monkeypatch.setattr(results, "run", lambda source: pytest.fail("a bench ran"))
    assert results.main(["--run", "echo", "--from-json", str(saved)]) == 2
    assert "needs one pair of markers for echo" in capsys.readouterr().err
    assert path.read_text() == "# Results\n" and not (saved / "echo.json").exists()


def _case(workload: str, ours: dict, tuned: dict) -> dict:
    def row(name, figures):
        return {"name": name, "ttft_p99_ms": 1.0, **figures}

    base = {"ttft_mean_ms": 100.0, "e2e_mean_ms": 100.0, "tpot_p99_ms": 10.0, "goodput": 0.5}
    return {
        "surface": "synthetic",
        "workload": workload,
        "stages": 2,
        "rows": [row("tuned-fixed-256", tuned), row("upstream-cpp", base), row("ours", ours)],
    }


def test_the_trace_summary_is_the_geometric_mean_and_the_tail_count_over_the_cases():
    saved = {
        "output": [
            _case("a", {"ttft_mean_ms": 50.0, "e2e_mean_ms": 80.0, "tpot_p99_ms": 12.0, "goodput": 0.75},
                  {"ttft_mean_ms": 100.0, "e2e_mean_ms": 100.0, "tpot_p99_ms": 10.0, "goodput": 0.5}),
            _case("b", {"ttft_mean_ms": 200.0, "e2e_mean_ms": 50.0, "tpot_p99_ms": 11.0, "goodput": 1.0},
                  {"ttft_mean_ms": 100.0, "e2e_mean_ms": 100.0, "tpot_p99_ms": 10.0, "goodput": 0.25}),
        ]
    }  # fmt: skip
    s = results_tables.trace_summary(saved)
    assert s["cases"] == 2 and s["ttft"] == pytest.approx(1.0) and s["e2e"] == pytest.approx(math.sqrt(0.4))
    assert s["goodput"] == pytest.approx(87.5) and s["tuned_goodput"] == pytest.approx(37.5)
    assert s["tpot_tail_cases"] == 1 and s["tpot_worst"] == pytest.approx(1.2)
    lines = results_tables.render_serving(saved)
    assert lines[-1].startswith("synthetic, 2 cases: ours' mean TTFT 1.000 of tuned fixed's and mean E2E 0.632")
    assert len([line for line in lines if line.startswith("| a | 2 | 256 | 0.500 | 1.20 | 0.800 | 75 / 50 |")]) == 1


def test_the_dual_stream_timeline_runs_each_compute_after_its_own_micro_batchs_reduce():
    spans = doc_images.dual_stream(layers=3)
    compute = [(kind, mb, start, end) for stream, kind, mb, start, end in spans if stream == "compute"]
    reduces = [(mb, start, end) for stream, _kind, mb, start, end in spans if stream == "comm"]
    assert [(k, mb) for k, mb, *_ in compute] == [("attn", 0), ("attn", 1), ("mlp", 0), ("mlp", 1)] * 3
    assert all(a[2] >= b[1] for a, b in zip(reduces[1:], reduces, strict=False))  # one comm stream, in issue order
    for index, (_kind, mb, start, _end) in enumerate(compute):
        if index >= 2:  # waits for the reduce of the half-layer before, its own micro-batch's
            assert start >= reduces[index - 2][2] and reduces[index - 2][0] == mb
        assert reduces[index][1] >= compute[index][3]  # a reduce starts once its compute is issued
    single = doc_images.single_stream(layers=3)
    assert max(s[4] for s in spans) < max(s[4] for s in single)
    assert sum(e - s for *_x, s, e in single) == pytest.approx(sum(e - s for *_x, s, e in spans))


def test_doc_images_refuses_an_output_folder_it_cannot_write(tmp_path, capsys):
    missing = Path(tmp_path / "nowhere")
    assert doc_images.main(["--out", str(missing), "--only", "timeline"]) == 2
    assert f"--out {missing}: not a folder you can write" in capsys.readouterr().err
    assert not missing.exists()


def test_the_mixed_bench_s_closing_lines_become_one_row_a_surface_and_one_column_a_base():
    stdout = (
        "surface base seed tuned TTFT\nsynthetic 2048 0 fixed-256 0.9\n\n"
        "per surface and base: TTFT ours/tuned mean and max; TPOT P99 ours/tuned max; mean goodput % ours, tuned\n"
        "synthetic                           2048  0.983  1.009  1.12   80.0  70.0\n"
        "synthetic                           4096  0.979  1.011  0.97   60.0  70.0\n"
        "stress:knee                         2048  0.948  0.986  1.23   70.0  70.0\n"
    )
    lines = results_tables.render_mixed({"output": {"stdout": stdout}})
    assert lines[0] == "| surface | base 2048: TTFT mean, max / TPOT P99 max | 4096 |"
    assert lines[2:4] == [
        "| synthetic | 0.983, 1.009 / 1.12 | 0.979, 1.011 / 0.97 |",
        "| stress:knee | 0.948, 0.986 / 1.23 | - |",
    ]
    assert lines[-1] == "Over all 3 cells ours' goodput averages 70.0% against the tuned chunk's 70.0%."


def test_the_gate_bench_s_rows_are_summed_up_to_the_worst_case_of_each_surface():
    stdout = (
        "surface                          base   prompt  P  ours/optimum  /engine-opt  /best-fixed  /upstream\n"
        "synthetic                         2048   32768  2        1.0010       0.9990      0.9950     0.8000\n"
        "synthetic                         4096  131072  4        1.0050       1.0020      0.9900     0.9000\n"
        "stress:waves                      2048   32768  2        1.0120       1.0100      1.0020     0.7000\n"
        "0 case(s) miss ours <= 1.03x the optimum (or the engine's) and <= 1.01x fixed\n"
    )
    lines = results_tables.render_gate({"output": {"stdout": stdout}})
    assert lines[2:4] == [
        "| synthetic | 2 | 1.0050 | 1.0020 | 0.9950 | 0.9000 |",
        "| stress:waves | 1 | 1.0120 | 1.0100 | 1.0020 | 0.7000 |",
    ]
    assert lines[-1] == "`0 case(s) miss ours <= 1.03x the optimum (or the engine's) and <= 1.01x fixed`"


def test_a_source_on_the_second_page_is_rendered_there_and_one_on_both_pages_is_refused(page, monkeypatch, capsys):
    path, saved = page
    other = path.with_name("engine.md")
    other.write_text(path.read_text().replace("# Results", "# Engine"))
    path.write_text("# Results\n\nno markers here\n")
    monkeypatch.setattr(results, "PAGES", (path, other))
    monkeypatch.setattr(results, "_git", lambda *args: "" if args[0] == "status" else "abc1234")
    assert results.main(["--run", "echo", "--from-json", str(saved)]) == 0
    assert path.read_text() == "# Results\n\nno markers here\n" and "served one line" in other.read_text()
    path.write_text(other.read_text())
    assert results.main(["--from-json", str(saved)]) == 2
    assert "results.md or engine.md: needs one pair of markers for echo" in capsys.readouterr().err
