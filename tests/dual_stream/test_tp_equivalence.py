"""Dual stream equals single stream at TP = 2 (two processes, gloo), KV caches too.

tp_worker.py runs vLLM's real Qwen3 layers through the patch set's model class, with a
CPU reference attention on a paged KV cache, over a mixed batch with cached history, an
all-fresh prefill batch and a decode-only batch, for every split strategy and CPU
backend; plus a batch whose split the length threshold refuses, a mutated schedule, a
fault in the split decision and one in cutting the metadata, and last a fault on one rank only.
"""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4  # fp32, relative to the output scale


def _runs(results, **match):
    return [run for result in results for run in result["runs"] if all(run[k] == v for k, v in match.items())]


def test_all_scenarios_ran_on_both_ranks(tp_runs):
    print("rank timings (s):", [(round(r["setup_s"], 1), round(r["total_s"], 1)) for r in tp_runs])
    assert [len(r["runs"]) for r in tp_runs] == [27, 27]
    assert not any(run["reference_took_dual"] for run in _runs(tp_runs))


@pytest.mark.parametrize("scenario", ["mixed_with_history", "all_fresh_prefill"])
@pytest.mark.parametrize("strategy", ["half_batch", "token_balanced"])
@pytest.mark.parametrize("backend", ["sequential", "gloo_async", "deferred"])
def test_dual_stream_output_and_kv_cache_equal_single_stream(tp_runs, scenario, strategy, backend):
    runs = _runs(tp_runs, scenario=scenario, strategy=strategy, backend=backend, mutated="", length_threshold=2)
    assert len(runs) == len(tp_runs)
    for run in runs:
        assert run["took_dual"], run["reason"]
        assert run["max_out_diff"] <= TOLERANCE * max(1.0, run["out_scale"]), run
        assert run["max_cache_diff"] <= TOLERANCE, run
        assert run["reduce_results_restored"]


def test_batches_the_gate_rejects_run_single_stream_and_equal(tp_runs):
    decode_only = _runs(tp_runs, scenario="decode_only", mutated="")
    refused = [run for run in _runs(tp_runs, length_threshold=40) if run["scenario"] != "decode_only"]
    assert decode_only and refused
    for run in decode_only:
        assert not run["took_dual"] and run["reason"] == "DecodeOnly batch"
    for run in refused:
        assert not run["took_dual"] and run["reason"] == "split refused by strategy"
    for run in decode_only + refused:
        assert run["max_out_diff"] == 0.0 and run["max_cache_diff"] == 0.0


@pytest.mark.parametrize("wait", ["wait_for_previous_layer", "wait_for_attention_reduce"])
def test_removing_a_wait_of_the_schedule_is_caught(tp_runs, wait):
    """With all-reduces run only when waited on, attention must wait for the previous layer's MLP
    all-reduce, and the MLP for its layer's attention all-reduce: drop either and the answer changes."""
    mutated = _runs(tp_runs, mutated=wait, scenario="mixed_with_history")
    assert len(mutated) == len(tp_runs)
    for run in mutated:
        assert run["took_dual"]
        assert run["max_out_diff"] > 100 * TOLERANCE * max(1.0, run["out_scale"]), run


@pytest.mark.parametrize(
    ("key", "warning"), [("fault", "deciding the split"), ("cut_fault", "cutting the batch in two")]
)
def test_a_fault_in_the_split_decision_or_cut_falls_back_on_every_rank_with_one_warning(tp_runs, key, warning):
    for result in tp_runs:
        fault = result[key]
        assert not fault["took_dual"] and not fault["still_on"] and not fault["took_dual_again"]
        assert fault["max_out_diff"] == 0.0 and fault["max_cache_diff"] == 0.0
        assert fault["max_out_diff_after"] == 0.0
        assert len(fault["warnings"]) == 1 and fault["warnings"][0].startswith(f"[DualStream] {warning}")
        assert "run single-stream" in fault["warnings"][0]


def test_a_fault_on_one_rank_after_collectives_propagates_and_the_job_ends(tp_runs):
    """Rank 0 faults after layer 0's all-reduces ran on both ranks. Falling back there would
    leave rank 0 in single-stream collectives while rank 1 waits in dual-stream ones (a hang
    until the communication timeout); instead the fault surfaces on rank 0, which ends, and
    rank 1's pending collective fails with it."""
    assert not any(r["timed_out"] for r in tp_runs), "a rank hung after a one-rank fault"
    faulting, peer = (r["one_rank_fault"] for r in tp_runs)
    assert faulting is not None, "rank 0 wrote no fault result:\n" + tp_runs[0]["stderr_tail"]
    assert faulting["raised"] == "RuntimeError: injected device fault on rank 0"
    assert faulting["all_reduce_calls"] == 5 and not faulting["returned"]
    assert faulting["warnings"] == [], "no fall back after collectives were issued"
    assert peer is not None and peer["raised"] and not peer["returned"] and peer["warnings"] == [], peer
    assert "injected" not in peer["raised"], "rank 1 fails on its collective, not with rank 0's fault"
    assert peer["all_reduce_calls"] >= 5, "rank 1 got past layer 0 before it failed"


def test_ascend_config_runs_the_dual_stream_validation(tp_runs):
    """Patch 0301: AscendConfig.__init__ validates dual_stream_config with upstream's real flags."""
    cases = tp_runs[0]["ascend_config"]
    assert "enabled=True" in cases["enabled"]["ok"] and "half_batch" in cases["enabled"]["ok"]
    assert "enabled=False" in cases["absent"]["ok"]
    assert "dual_stream_config.split_strategy='random': must be one of" in cases["bad_strategy"]["error"]
    assert "enable_flashcomm1" in cases["flashcomm1"]["error"]
    assert "enable_matmul_allreduce" in cases["matmul_allreduce"]["error"]
    assert "flashcomm2" in cases["flashcomm2"]["error"]
    assert "weight_prefetch_config.enabled" in cases["weight_prefetch"]["error"]
    for name in ("bad_strategy", "flashcomm1", "matmul_allreduce", "flashcomm2", "weight_prefetch"):
        assert cases[name]["error"].startswith("ValueError: "), cases[name]
