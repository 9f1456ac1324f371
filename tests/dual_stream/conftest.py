"""The TP = 2 run shared by the dual-stream tests: two gloo processes of tp_worker.py, once per session."""

from __future__ import annotations

import json

import pytest
from rank_processes import run_ranks

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


@pytest.fixture(scope="session")
def tp_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("dual_stream_tp")
    model_dir = work / "tiny-qwen3"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CONFIG_JSON))
    results = run_ranks("dual_stream.tp_worker", WORLD, work, TIMEOUT_S, [str(model_dir)])
    for rank, result in enumerate(results):
        fault = work / f"rank{rank}.json.fault.json"
        result["one_rank_fault"] = json.loads(fault.read_text()) if fault.exists() else None
    return results
