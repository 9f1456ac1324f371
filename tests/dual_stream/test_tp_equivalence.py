"""Dual stream equals single stream at TP = 2 (two processes, gloo), KV caches too.

tp_worker.py runs vLLM's real Qwen3 layers through the patch set's model class, with a
CPU reference attention on a paged KV cache, over a mixed batch with cached history, an
all-fresh prefill batch and a decode-only batch, for every split strategy and CPU
backend; plus a batch whose split the length threshold refuses, and a mutated schedule.
"""

from __future__ import annotations

import json

import pytest
from rank_processes import run_ranks

TOLERANCE = 1e-4  # fp32, relative to the output scale
WORLD = 2
TIMEOUT_S = 240

CONFIG_JSON = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("dual_stream_tp")
    model_dir = work / "tiny-qwen3"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CONFIG_JSON))
    return run_ranks("dual_stream.tp_worker", WORLD, work, TIMEOUT_S, [str(model_dir)])


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
    assert len(runs) == WORLD
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
    assert len(mutated) == WORLD
    for run in mutated:
        assert run["took_dual"]
        assert run["max_out_diff"] > 100 * TOLERANCE * max(1.0, run["out_scale"]), run


def test_a_runtime_fault_falls_back_to_single_stream_with_one_warning(tp_runs):
    for result in tp_runs:
        fault = result["fault"]
        assert fault["failing_backend_calls"] == 5, "the fault must hit after layer 0's all-reduces ran"
        assert not fault["took_dual"] and not fault["still_on"] and not fault["took_dual_again"]
        assert fault["max_out_diff"] == 0.0 and fault["max_cache_diff"] == 0.0
        assert fault["max_out_diff_after"] == 0.0
        assert len(fault["warnings"]) == 1 and "run single-stream" in fault["warnings"][0]


def test_ascend_config_runs_the_dual_stream_validation(tp_runs):
    """Patch 0301: AscendConfig.__init__ validates dual_stream_config with upstream's real flags."""
    cases = tp_runs[0]["ascend_config"]
    assert "enabled=True" in cases["enabled"]["ok"] and "half_batch" in cases["enabled"]["ok"]
    assert "enabled=False" in cases["absent"]["ok"]
    assert "dual_stream_config.split_strategy 'random'" in cases["bad_strategy"]["error"]
    assert "enable_flashcomm1" in cases["flashcomm1"]["error"]
    assert "enable_matmul_allreduce" in cases["matmul_allreduce"]["error"]
    assert "flashcomm2" in cases["flashcomm2"]["error"]
    assert "weight_prefetch_config.enabled" in cases["weight_prefetch"]["error"]
    for name in ("bad_strategy", "flashcomm1", "matmul_allreduce", "flashcomm2", "weight_prefetch"):
        assert cases[name]["error"].startswith("ValueError: "), cases[name]


def test_qwen3_dense_resolves_to_the_dual_stream_class(tp_runs):
    """Patch 0300: after vllm-ascend's register_model, vLLM's registry loads our subclass."""
    assert tp_runs[0]["registered"] == {
        "module": "vllm_ascend.models.qwen3",
        "class": "DualStreamQwen3ForCausalLM",
        "loaded": "vllm_ascend.models.qwen3.DualStreamQwen3ForCausalLM",
    }
