"""``make bench-e2e``'s flags, and those of the e2e run's other commands, are checked before any server
starts: a bad one exits 2 naming it.

A server takes a minute or more to start and profile, and a run clears the profile ours
saved before; ``--prompts abc`` or ``--out`` on a file used to end in a traceback, and
``--repeats 0``, ``--fixed 0`` or ``--mixed-rate -1`` started ``vllm serve`` and failed
a minute later.
"""

from __future__ import annotations

import pytest
from vllm_ascend_patchset.e2e import bench, ds_bench, ds_smoke, smoke, trace_replay
from vllm_ascend_patchset.e2e import run as e2e_run
from vllm_ascend_patchset.paths import DATA_DIR


@pytest.fixture
def no_server(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(bench, "serve_policy", started)
    monkeypatch.setattr(trace_replay, "serve_replay", started)


def _args(tmp_path, *argv: str):
    return e2e_run.build_parser().parse_args(["bench", "--out", str(tmp_path / "out"), *argv])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--prompts", "abc"], "--prompts 'abc': give prompt lengths in tokens"),
        (["--prompts", "1024,0"], "--prompts '1024,0': give prompt lengths"),
        (["--prompts", "33790"], "whole numbers in [1, 33784]"),  # with the 8 output tokens, over max_model_len
        (["--prompts", ","], "--prompts ','"),
        (["--repeats", "0"], "--repeats must be in [1, 1000] (prompts per length and policy), got 0"),
        (["--fixed", "0"], "--fixed '0': give chunk budgets"),
        (["--fixed", "512,x"], "--fixed '512,x'"),
        (["--chunk", "10"], "--chunk must be in [64, 33792]"),
        (["--output-tokens", "0"], "--output-tokens must be in [1, 33791]"),
        (["--policies", "fixed,best"], "--policies 'fixed,best': unknown ['best']; choose from fixed,upstream,ours"),
        (["--policies", " , "], "none given"),
        (["--mixed-rate", "-1"], "--mixed-rate must be > 0"),
        (["--mixed-rate", "nan"], "--mixed-rate must be > 0"),
        (["--mixed-prompts", "0"], "--mixed-prompts must be in [1, 1000]"),
        (["--mixed-input-len", "30000"], "'vllm bench serve' draws lengths up to 1.5x these, 45048 tokens"),
        (["--twin-python", "/nonexistent/python"], "--twin-python /nonexistent/python: not an executable file"),
        # counts of runs at most 1000 (10**12 started the servers), and arrivals that fit 'vllm bench serve's time
        (["--repeats", "1000000000000"], "--repeats must be in [1, 1000] (prompts per length and policy)"),
        (["--mixed-prompts", "1000000000000"], "--mixed-prompts must be in [1, 1000] (requests of 'vllm bench"),
        (["--mixed-rate", "1e-300"], "--mixed-rate 1e-300: 8 requests at 1e-300 a second arrive over 8e+300 s"),
        (["--mixed-prompts", "1000", "--mixed-rate", "0.5"], "--mixed-rate 0.5: 1000 requests at 0.5 a second"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(tmp_path, argv, says, capsys, no_server):
    with pytest.raises(bench.ArgumentError) as error:
        bench.check_args(_args(tmp_path, *argv))
    assert says in str(error.value)
    assert e2e_run.main(["bench", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench: error: ") and says in err and "Traceback" not in err
    assert not any(tmp_path.iterdir()), "nothing is written before the checks"


@pytest.mark.parametrize("trace", [False, True])
def test_an_out_folder_that_cannot_be_made_is_refused_and_nothing_is_written(tmp_path, trace, capsys, no_server):
    afile = tmp_path / "a-file"
    afile.write_text("not a folder\n")
    mode = ["--trace", f"{DATA_DIR / 'traces' / 'mooncake.jsonl'}@0:4"] if trace else []
    for out in (afile, afile / "below"):
        with pytest.raises(bench.ArgumentError, match=f"--out {out}: {afile} is a file, not a folder"):
            bench.check_args(e2e_run.build_parser().parse_args(["bench", "--out", str(out), *mode]))
        assert e2e_run.main(["bench", "--out", str(out), *mode]) == 2
        assert f"--out {out}: {afile} is a file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and afile.read_text() == "not a folder\n"


def test_the_defaults_and_good_values_pass(tmp_path):
    bench.check_args(_args(tmp_path))
    bench.check_args(_args(tmp_path, "--mixed-rate", "inf", "--fixed", "64,33792", "--prompts", "33784"))
    bench.check_args(_args(tmp_path, "--repeats", "1000", "--mixed-prompts", "1000", "--mixed-rate", "1"))
    assert not (tmp_path / "out").exists(), "checking makes no folder"


@pytest.fixture
def no_command_run(monkeypatch):
    """Fails the test if a smoke, the uneven check or ds-bench would start its servers."""

    def started(*args, **kwargs):
        raise AssertionError("a server was started")

    for module, name in ((smoke, "smoke"), (smoke, "uneven_stages"), (ds_smoke, "smoke"), (ds_bench, "run")):
        monkeypatch.setattr(module, name, started)


@pytest.mark.parametrize(
    "argv, says",
    [
        # each of these started vLLM, which failed a minute later or ran for hours
        (["smoke", "--chunk", "0"], "--chunk must be in [16, 33792]"),
        (["smoke", "--chunk", "1000000000000"], "--chunk must be in [16, 33792]"),
        (["smoke", "--prompt-tokens", "0"], "--prompt-tokens must be in [1, 39936]"),
        (["smoke", "--prompt-tokens", "1000000000000"], "--prompt-tokens must be in [1, 39936]"),
        (["uneven", "--prompt-tokens", "-1"], "--prompt-tokens must be in [1, 33788]"),
        (["uneven", "--chunk", "10"], "--chunk must be in [16, 33792]"),
        (["uneven", "--layers", "x"], "--layers 'x': give layers per stage, whole numbers in [1, 3]"),
        (["uneven", "--layers", "0,4"], "--layers '0,4': give layers per stage"),
        (["uneven", "--layers", "1000000000000,1"], "--layers '1000000000000,1': give layers per stage"),
        (["uneven", "--layers", "1,1,2"], "--layers 1,1,2: one count per stage (2 stages) adding up to the model's 4"),
        (["uneven", "--layers", "1,1"], "--layers 1,1: one count per stage (2 stages) adding up to the model's 4"),
        (["ds-smoke", "--cases", " , "], "--cases ' , ': none given; choose from tp2, pp2-tp2"),
        (["ds-bench", "--repeats", "0"], "--repeats must be in [1, 1000]"),
        (["ds-bench", "--repeats", "1000000000000"], "--repeats must be in [1, 1000]"),
        (["ds-bench", "--prompts", "0"], "--prompts must be an even number in [2, 16]"),
        (["ds-bench", "--prompts", "3"], "--prompts must be an even number in [2, 16]"),
        (["ds-bench", "--prompt-tokens", "0"], "--prompt-tokens must be in [1, 40896]"),
        (["ds-bench", "--prompt-tokens", "50000"], "--prompt-tokens must be in [1, 40896]"),
        (["ds-bench", "--prompts", "2", "--prompt-tokens", "7"], "--prompts 2 x --prompt-tokens 7: the batch's 14"),
        (["ds-bench", "--alpha-us", "nan"], "--alpha-us must be a number in [0, 10000] (us"),
        (["ds-bench", "--beta-gbps", "0"], "--beta-gbps must be a number in [0.01, 10000] (GB/s"),
        (["ds-bench", "--beta-gbps", "inf"], "--beta-gbps must be a number in [0.01, 10000]"),
    ],
)
def test_every_commands_bad_flag_is_refused_before_its_servers(tmp_path, argv, says, capsys, no_command_run):
    assert e2e_run.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{argv[0]}: error: ") and says in err and "Traceback" not in err, err


def test_every_commands_defaults_pass_the_checks(monkeypatch):
    ran = []
    for module, name in ((smoke, "smoke"), (smoke, "uneven_stages"), (ds_smoke, "smoke"), (ds_bench, "run")):
        monkeypatch.setattr(module, name, lambda *args, name=name: ran.append(name) or 0)
    for command in ("smoke", "uneven", "ds-smoke", "ds-bench"):
        assert e2e_run.main([command]) == 0
    assert e2e_run.main(["ds-bench", "--prompts", "16", "--alpha-us", "0", "--bare"]) == 0
    assert ran == ["smoke", "uneven_stages", "smoke", "run", "run"]
