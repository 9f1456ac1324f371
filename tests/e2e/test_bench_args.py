"""``make bench-e2e``'s flags are checked before any server starts: a bad one exits 2 naming it.

A server takes a minute or more to start and profile, and a run clears the profile ours
saved before; ``--prompts abc`` or ``--out`` on a file used to end in a traceback, and
``--repeats 0``, ``--fixed 0`` or ``--mixed-rate -1`` started ``vllm serve`` and failed
a minute later.
"""

from __future__ import annotations

import pytest
from vllm_ascend_patchset.e2e import bench, trace_replay
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
