"""The TP = 2 run shared by the dual-stream tests: two gloo processes of tp_worker.py, once per session."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import conftest
import pytest

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tp_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("dual_stream_tp")
    model_dir = work / "tiny-qwen3"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CONFIG_JSON))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(conftest.ASSEMBLED), str(conftest.ROOT / "tests"), env.get("PYTHONPATH", "")]
    )
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        cmd = [sys.executable, "-m", "dual_stream.tp_worker", str(rank), str(WORLD), str(port), str(model_dir)]
        procs.append(
            subprocess.Popen([*cmd, str(work / f"rank{rank}.json")], env=env, cwd=work, stderr=subprocess.PIPE)
        )
    stderr, timed_out = [], []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for rank, proc in enumerate(procs):
            try:
                stderr.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[1])
            except subprocess.TimeoutExpired:  # a hung collective: recorded, the rank is killed below
                timed_out.append(rank)
                proc.kill()
                stderr.append(proc.communicate()[1])
    finally:
        for proc in procs:  # never leave a rank behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for rank in range(WORLD):
        path = work / f"rank{rank}.json"
        log = stderr[rank].decode(errors="replace")[-4000:]
        assert path.exists(), f"rank {rank} wrote no result:\n{log}"
        result = json.loads(path.read_text())
        assert not result["errors"], f"rank {rank} failed:\n" + "\n".join(result["errors"])
        fault = work / f"rank{rank}.json.fault.json"
        result["one_rank_fault"] = json.loads(fault.read_text()) if fault.exists() else None
        result["timed_out"] = rank in timed_out
        result["stderr_tail"] = log
        results.append(result)
    return results
