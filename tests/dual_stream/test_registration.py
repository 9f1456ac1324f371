"""Qwen3 dense resolves to the dual-stream class, which with the feature off is vLLM's model.

Both run in the TP = 2 worker (tp_worker.py), where vLLM's registry and models import:
vllm-ascend's ``register_model`` (patch 0300) maps ``Qwen3ForCausalLM`` to our subclass,
and our class with ``dual_stream_config`` off computes bit for bit what vLLM's
``Qwen3ForCausalLM`` computes with the same weights, KV cache writes included.
"""

from __future__ import annotations


def test_qwen3_dense_resolves_to_the_dual_stream_class(tp_runs):
    """After vllm-ascend's register_model, vLLM's registry loads our subclass for Qwen3ForCausalLM."""
    assert tp_runs[0]["registered"] == {
        "module": "vllm_ascend.models.qwen3",
        "class": "DualStreamQwen3ForCausalLM",
        "loaded": "vllm_ascend.models.qwen3.DualStreamQwen3ForCausalLM",
    }


def test_with_the_feature_off_the_forward_is_vllms(tp_runs):
    for result in tp_runs:
        feature_off = result["feature_off"]
        assert feature_off["same_parameters"] and feature_off["num_parameters"] > 0, "same weights to load"
        assert {case["scenario"] for case in feature_off["cases"]} == {
            "mixed_with_history",
            "all_fresh_prefill",
            "decode_only",
        }
        for case in feature_off["cases"]:
            assert not case["took_dual"], case
            assert case["equal"] and case["caches_equal"], case
