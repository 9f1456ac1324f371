"""scripts/bench/cpp_pace.py, cpp_mixed.py, cpp_surfaces.py and predictor.py: bad input is refused naming the
flag, before the twin's workers start or the predictors load (each run takes minutes to hours; a typo used to end
in a traceback, or a run that failed late or never ended)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from vllm_ascend_patchset.paths import BENCH_DIR
from vllm_ascend_patchset.twin import policies as pol

MOONCAKE = "tests/data/traces/mooncake.jsonl"


def _script(name: str):
    sys.path.insert(0, str(BENCH_DIR))  # cpp_mixed imports cpp_surfaces as its folder's module
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


@pytest.fixture
def no_workers(monkeypatch):
    def run_cases(*args, **kwargs):
        raise AssertionError("the twin's workers were started")

    monkeypatch.setattr(pol, "run_cases", run_cases)


@pytest.mark.parametrize(
    "script, argv, says",
    [
        ("cpp_pace", ["--stages", "abc"], "--stages 'abc': give whole numbers >= 1"),
        ("cpp_pace", ["--stages", "1"], "--stages 1: ours needs pipeline parallelism, P >= 2"),
        ("cpp_pace", ["--bases", "0"], "--bases item '0': give a whole number > 0"),
        ("cpp_pace", ["--bases", "10"], "--bases 10: a chunk budget must lie in [64, "),
        ("cpp_pace", ["--seeds", "-1"], "--seeds '-1': give whole numbers >= 0"),
        ("cpp_pace", ["--workloads", "bogus"], "--workloads item 'bogus': give mixed or trace:PATH@START:COUNT"),
        ("cpp_pace", ["--workloads", "trace:nowhere.jsonl@0:4"], "nowhere.jsonl: no such file"),
        ("cpp_pace", ["--workloads", f"trace:{MOONCAKE}@0:4", "--loads", "nan"], "--loads must be a finite number"),
        ("cpp_pace", ["--targets", "fast"], "--targets item 'fast': give none, slo or a number K in (0, 1000]"),
        ("cpp_pace", ["--targets", "nan"], "--targets item 'nan': give none, slo or a number K in (0, 1000]"),
        ("cpp_pace", ["--targets", "0"], "--targets item '0'"),
        ("cpp_pace", ["--surfaces", "missing.csv"], "no such file"),
        ("cpp_pace", ["--json", "/proc/rows.json"], "--json /proc/rows.json: cannot write there"),
        ("cpp_mixed", ["--stages", "1"], "--stages 1: ours needs pipeline parallelism, P >= 2"),
        ("cpp_mixed", ["--stages", "1000000"], "--stages 1000000: at most 64 pipeline stages"),
        ("cpp_mixed", ["--bases", "x"], "--bases item 'x'"),
        ("cpp_mixed", ["--seeds", "a"], "--seeds 'a': give whole numbers >= 0"),
        ("cpp_mixed", ["--sweep", "0"], "--sweep item '0'"),
        ("cpp_mixed", ["--surfaces", "nowhere"], "nowhere"),
        ("cpp_mixed", ["--target-tpot-ms", "0"], "--target-tpot-ms must be a finite number in (0, 86400000], got 0"),
        ("cpp_mixed", ["--target-tpot-ms", "1e300"], "--target-tpot-ms must be a finite number in (0, 86400000]"),
        ("cpp_surfaces", ["--stages", "0"], "--stages '0': give whole numbers >= 1"),
        ("cpp_surfaces", ["--stages", "1"], "--stages 1: ours needs pipeline parallelism, P >= 2"),
        ("cpp_surfaces", ["--bases", "1e12"], "--bases 1000000000000: a chunk budget must lie in [64, "),
        ("cpp_surfaces", ["--prompts", "abc"], "--prompts item 'abc': give a whole number > 0"),
        ("cpp_surfaces", ["--prompts", "1e12"], "--prompts must be a finite number in [1, 2096896]"),
        ("cpp_surfaces", ["--surfaces", "missing.csv"], "no such file"),
    ],
)
def test_bad_input_is_refused_naming_the_flag_before_any_worker(script, argv, says, monkeypatch, capsys, no_workers):
    module = _script(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "script, argv",
    [
        ("cpp_pace", []),
        ("cpp_pace", ["--workloads", f"trace:{MOONCAKE}@0:32,trace:{MOONCAKE}@32:32", "--loads", "0.8"]),
        ("cpp_pace", ["--targets", "none,0.5,1000,slo", "--stages", "2,4,8", "--seeds", "0"]),
        ("cpp_mixed", ["--bases", "2048,4096,8192"]),
        ("cpp_surfaces", ["--gate"]),
    ],
)
def test_the_defaults_and_the_results_pages_commands_pass_the_checks(script, argv, tmp_path, monkeypatch):
    class Reached(Exception):
        """The checks passed: the run would start here."""

    def run_cases(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(pol, "run_cases", run_cases)
    module = _script(script)
    with pytest.raises(Reached):
        module.main([*argv, *(["--json", str(tmp_path / "rows.json")] if script == "cpp_pace" else [])])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--csv", "/nonexistent.csv"], "--csv /nonexistent.csv: not a file"),
        (["--base-chunk", "0"], "--base-chunk 0: a chunk budget must lie in [64, "),
        (["--stages", "0"], "--stages must be a finite number in [2, 64], got 0"),
        (["--smooth-factor", "nan"], "--smooth-factor must be a finite number in (0, 1], got nan"),
        (["--min-chunk", "-1"], "--min-chunk must be a finite number in [1, 4096], got -1"),
        (["--page-size", "0"], "--page-size must be a finite number in [1, 4096], got 0"),
        (["--prompt-tokens", "32768", "1000000000000"], "--prompt-tokens must be a finite number in [1, 2096896]"),
        (["--fit-histories", "-5"], "--fit-histories must be a finite number in [0, 2097152], got -5"),
        (["--measure-prompt", "1000000000"], "--measure-prompt must be a finite number in [0, 131072], got"),
    ],
)
def test_predictor_refuses_bad_input_before_loading_anything(argv, says, monkeypatch, capsys):
    """Each ended in a traceback, divided by zero or ran for days (a 10**12-token prompt's chunkings)."""
    module = _script("predictor")

    def load(*args, **kwargs):
        raise AssertionError("the predictors were loaded")

    monkeypatch.setattr(module, "load_ours", load)
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_predictor_defaults_pass_the_checks(monkeypatch):
    module = _script("predictor")

    class Reached(Exception):
        """The checks passed: the predictors would be loaded here."""

    def load(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(module, "load_ours", load)
    with pytest.raises(Reached):
        module.main([])
