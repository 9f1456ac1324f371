"""Dual stream inside pipeline stages: PP = 2 x TP = 2 (four gloo processes) equals single stream.

pp_worker.py runs the patch set's model class with vLLM's real Qwen3 layers of one stage
per rank: stage 0 embeds and hands hidden states and residual on, stage 1 cuts what it
receives, joins and normalises. Each stage is compared single- against dual-stream, from
the same KV cache, on a mixed batch with history, an all-fresh prefill and a decode-only
batch.
"""

from __future__ import annotations

import json

import pytest
from rank_processes import run_ranks

from dual_stream.conftest import CONFIG_JSON

WORLD = 4
TIMEOUT_S = 300
TOLERANCE = 1e-4  # fp32, relative to the output scale
SPLIT = ("mixed_with_history", "all_fresh_prefill")


@pytest.fixture(scope="module")
def pp_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("dual_stream_pp")
    model_dir = work / "tiny-qwen3"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**CONFIG_JSON, "num_hidden_layers": 4}))
    return run_ranks("dual_stream.pp_worker", WORLD, work, TIMEOUT_S, [str(model_dir)])


def _run(result, scenario):
    (run,) = [r for r in result["runs"] if r["scenario"] == scenario]
    return run


def test_four_ranks_two_stages_each_with_its_layers(pp_runs):
    print("rank timings (s):", [round(r["total_s"], 1) for r in pp_runs])
    assert [(r["stage"], r["tp_rank"]) for r in pp_runs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["layers"] for r in pp_runs] == [[0, 2], [0, 2], [2, 4], [2, 4]]
    assert all(r["dual_stream_on"] for r in pp_runs), "dual stream on through additional_config at PP = 2"
    assert not any(r["timed_out"] for r in pp_runs)


@pytest.mark.parametrize("scenario", SPLIT)
def test_first_stage_hands_on_the_same_hidden_states_and_residual(pp_runs, scenario):
    for result in pp_runs[:2]:
        run = _run(result, scenario)
        assert run["took_dual"] and not run["reference_took_dual"], run["reason"]
        assert run["max_hidden_diff"] <= TOLERANCE * max(1.0, run["scale"]), run
        assert run["max_residual_diff"] <= TOLERANCE * max(1.0, run["scale"]), run
        assert run["max_cache_diff"] <= TOLERANCE, run


@pytest.mark.parametrize("scenario", SPLIT)
def test_last_stage_splits_what_it_receives_and_equals_single_stream(pp_runs, scenario):
    for result in pp_runs[2:]:
        run = _run(result, scenario)
        assert run["took_dual"] and not run["reference_took_dual"], run["reason"]
        assert run["max_own_diff"] <= TOLERANCE * max(1.0, run["scale"]), run  # same input, this stage alone
        assert run["max_own_cache_diff"] <= TOLERANCE, run
        assert run["max_out_diff"] <= TOLERANCE * max(1.0, run["scale"]), run  # both stages dual
        assert run["max_cache_diff"] <= TOLERANCE, run


def test_decode_only_batches_stay_single_stream_on_every_stage(pp_runs):
    for result in pp_runs:
        run = _run(result, "decode_only")
        assert not run["took_dual"] and run["reason"] == "DecodeOnly batch" and run["point"] is None
        assert run["max_cache_diff"] == 0.0
        assert run.get("max_out_diff", run.get("max_hidden_diff")) == 0.0


@pytest.mark.parametrize("scenario", [*SPLIT, "decode_only"])
def test_the_decision_is_the_same_on_every_tp_rank_of_a_stage(pp_runs, scenario):
    for stage in (pp_runs[:2], pp_runs[2:]):
        decisions = [(_run(r, scenario)["reason"], _run(r, scenario)["point"]) for r in stage]
        assert decisions[0] == decisions[1], decisions
    if scenario in SPLIT:
        assert _run(pp_runs[0], scenario)["point"] is not None
