"""scripts/bench/cpp_sched_overhead.py: its baseline replays CPP's very batches, so the split it prints holds.

The script times upstream's loop making the batches CPP made (a replay) to tell what CPP's
decisions cost from what vLLM's loop costs for their batches. That split is only true if
the replay makes the same batch as CPP in every step, passing over the waiting prompts CPP
passed over (bursts of prompts of several sizes make CPP pass over long ones to reach
shorter ones) and stopping where CPP stopped.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from vllm_ascend_patchset.paths import BENCH_DIR

pytestmark = pytest.mark.full_tier("the bench runs vLLM's scheduler from the assembled tree")

SCRIPT = BENCH_DIR / "cpp_sched_overhead.py"
PER_STEP = re.compile(r"^(.+?):\s+([\d.]+) us per step", re.MULTILINE)


def test_replay_makes_cpps_batches_in_every_step(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--steps", "60", "--decodes", "8", "--every", "3", "--burst", "3", "--device-ms", "0", "--parts"]
    args += ["--repeats", "1", "--json", str(out)]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "60 steps" in run.stdout and "no prompts arriving" in run.stdout
    assert "differed" not in run.stdout, run.stdout
    timings = dict(PER_STEP.findall(run.stdout))
    assert set(timings) == {
        "fixed chunks, vLLM's loop",
        "upstream's loop, identity hooks",
        "CPP, upstream's loop",
        "upstream's loop, CPP's batches",
    }, run.stdout
    assert all(float(us) > 0 for us in timings.values())
    first = run.stdout.split("CPP's own pieces", 1)[1].split("decoding requests", 1)[0]
    pieces = dict(re.findall(r"^  +(\S.*?\S) +([\d.]+)$", first, re.MULTILINE))
    assert len(pieces) == 8 and all(float(us) > 0 for us in pieces.values()), run.stdout  # every timer ran
    rows = json.loads(out.read_text())["rows"]
    assert [(r["decodes"], r["arrivals"], r["decode_only"]) for r in rows] == [(8, True, False), (8, False, True)]
    table = run.stdout.rsplit("steps with a set change", 1)[1].split("\n")[1:3]  # the closing table's two rows
    for row, line in zip(rows, table, strict=True):
        printed = line.split()
        assert printed[:2] == [str(row["decodes"]), "yes" if row["arrivals"] else "no"], line
        assert float(printed[2]) == pytest.approx(row["added_us_per_step"], abs=0.051)  # the JSON is the table
        assert float(printed[3]) == pytest.approx(row["vs_same_batch"], abs=5e-4) and row["vs_same_batch"] > 0
        assert float(printed[4]) == pytest.approx(row["vs_identity"], abs=5e-4) and row["vs_identity"] > 0
    assert rows[0]["set_changed_share"] > 0 and rows[1]["set_changed_share"] == 0  # arrivals change the set


@pytest.mark.parametrize(
    "args, message",
    [
        (["--decodes", "32,x"], "--decodes"),
        (["--arrivals", "maybe"], "--arrivals"),
        (["--repeats", "0"], "--repeats"),
        (["--json", "/nonexistent-folder/rows.json"], "--json"),
    ],
)
def test_bad_input_is_named_and_exits_2_before_any_run(args, message):
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr
    assert "decoding requests" not in run.stdout


@pytest.fixture(scope="module")
def bench_module():
    spec = importlib.util.spec_from_file_location("cpp_sched_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        # each was taken, and ran for days (or until memory ran out), or failed with a traceback mid-run
        (["--repeats", "1000000000000"], "--repeats must be in [1, 1000] ("),
        (["--steps", "1000000000000"], "--steps must be in [1, 10000] ("),
        (["--burst", "1000000000000"], "--burst must be in [1, 64] ("),
        (["--every", "1000000000000"], "--every must be in [1, 10000] ("),
        (["--block", "1000000000000"], "--block must be in [1, 10000] ("),
        (["--stages", "1000000000000"], "--stages must be in [2, 64] ("),
        (["--in-flight", "0"], "--in-flight must be in [1, 4] (batches in flight: at most one a stage), got 0"),
        (["--in-flight", "-3"], "--in-flight must be in [1, 4]"),
        (["--in-flight", "9"], "--in-flight must be in [1, 4]"),
        (["--device-ms", "nan"], "--device-ms must be a number of ms in [0, 1000] ("),
        (["--device-ms", "-1"], "--device-ms must be a number of ms in [0, 1000] ("),
        (["--device-ms", "1e300"], "--device-ms must be a number of ms in [0, 1000] ("),
        (["--decodes", "32,1000000000000"], "--decodes must be in [1, 2048] ("),
    ],
)
def test_out_of_range_input_is_named_and_exits_2_before_any_run(bench_module, monkeypatch, capsys, args, message):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    with pytest.raises(SystemExit) as exit_info:
        bench_module.parse_args()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and ", got " in err and "Traceback" not in err, err


def test_the_defaults_and_the_bounds_themselves_are_taken(bench_module, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    assert bench_module.parse_args().in_flight == 4  # one a stage
    bounds = ["--repeats", "1000", "--steps", "10000", "--burst", "64", "--every", "10000", "--block", "10000"]
    bounds += ["--stages", "64", "--in-flight", "64", "--device-ms", "0", "--decodes", "1,2048"]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *bounds])
    assert bench_module.parse_args().decodes == [1, 2048]
