"""A trace replayed through the real schedulers: shared block ids are prefix-cache hits, and --json carries
the serving figures. One invocation of the command, its cases run in the session's wave of workers (twin_wave.py)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import twin_wave
from vllm_ascend_patchset.twin import policies as pol
from vllm_ascend_patchset.twin.command import main
from vllm_ascend_patchset.twin.engine import BLOCK_TOKENS
from vllm_ascend_patchset.twin.report import figures_from_result
from vllm_ascend_patchset.twin.slo import Slo
from vllm_ascend_patchset.twin.traces import read_trace

pytestmark = pytest.mark.full_tier("the twin's policy workers import vLLM and the assembled tree")
A = list(range(100, 108))
# (timestamp ms, prompt tokens, output tokens, block ids): 512-token blocks.
TRACE = [
    (0, 3000, 4, A[:6]),  # its last block holds 440 tokens
    (100, 2500, 3, [200, 201, 202, 203, 204]),
    (200, 3600, 5, A[:6] + [300, 301]),  # shares 2560 + 440 tokens with the first: 23 cache blocks
    (300, 1000, 2, [200, 201]),  # its whole prompt is in the second's, all but its last cache block hits
    (400, 700, 2, [400, 401]),  # nothing shared
    (500, 2600, 3, A[:2] + [500, 501, 502, 503]),  # two blocks shared
]
EXPECTED_HITS = [0, 0, 2944, 896, 0, 1024]


def _replay_argv(folder: Path) -> list[str]:
    """The command line replaying the hand-made trace, written into ``folder``."""
    trace = folder / "hand.jsonl"
    lines = [{"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids} for t, n, o, ids in TRACE]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # A load of 0.05: each request arrives after the ones before it finished, so every hit is in the cache.
    argv = ["--surface", "synthetic", "--stages", "2", "--workload", f"trace:{trace}@0:{len(TRACE)}"]
    return argv + ["--load", "0.05", "--policies", "fixed,upstream,ours", "--json", str(folder / "out.json")]


FOLDER = Path(tempfile.mkdtemp(prefix="twin-trace-replay-"))  # the trace must exist when the cases are built
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
twin_wave.add_command("trace-replay", main, _replay_argv(FOLDER))


@pytest.fixture(scope="module")
def replay():
    code = twin_wave.run_command("trace-replay", main, _replay_argv(FOLDER))
    trace = FOLDER / "hand.jsonl"
    return code, trace, twin_wave.results("trace-replay")[0], json.loads((FOLDER / "out.json").read_text())


def test_the_expected_hits_are_the_hand_computed_ones(replay):
    from vllm_ascend_patchset.twin.traces import cached_prefix_tokens

    _, trace, _, _ = replay
    assert cached_prefix_tokens(read_trace(Path(trace), len(TRACE)), BLOCK_TOKENS) == EXPECTED_HITS


def test_shared_block_ids_are_prefix_cache_hits_in_every_scheduler(replay):
    code, _, results, _ = replay
    assert code == 0
    assert len(results) == (3 if pol.ours_available() else 2)
    for result in results:
        assert "error" not in result, result.get("error")
        cached = {log["req_id"]: log["cached_tokens"] for log in result["requests"]}
        assert [cached[f"t{i:05d}"] for i in range(len(TRACE))] == EXPECTED_HITS, result["policy"]["name"]
        assert figures_from_result(result, 2).problems == ()


def test_json_carries_ttft_tpot_itl_and_goodput_of_every_policy(replay):
    _, _, results, dump = replay
    (case,) = dump
    assert case["workload"] == f"hand-s0-n{len(TRACE)}-load0.05" and case["stages"] == 2
    slo = Slo(**case["slo"])
    assert slo.ttft_ms > 0 and slo.tpot_ms > 0 and "TTFT 5x" in slo.basis
    assert "4864 of them expected prefix hits" in case["notes"][0]
    rows = {row["name"]: row for row in case["rows"]}
    assert {"vllm-fixed-8192", "upstream-cpp"} <= set(rows)
    for result in results:
        figures = figures_from_result(result, 2)
        name = "vllm-fixed-8192" if result["policy"]["kind"] == "fixed" else result["policy"]["name"]
        row = rows[name]
        for key in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms", "itl_p99_ms",
                    "e2e_mean_ms", "e2e_p99_ms"):  # fmt: skip
            assert row[key] == pytest.approx(getattr(figures, key)) and row[key] > 0
        assert row["goodput"] == pytest.approx(figures.goodput(slo))
        # Alone on the pipeline, every request is served well within the default bounds.
        assert row["goodput"] == 1.0
