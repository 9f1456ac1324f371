"""Real data: a latency surface t(C, H) measured on a CPU by scripts/measure_cpu_surface.py.

The model built from the H = 0 samples plus two history levels must predict the other
history levels within 15% MAPE, and at least 3x better than upstream v0.23.0's own
start-up model on the same points: its ``ChunkSizePredictor.fit`` on the H = 0 samples,
a chunk costing ``get_time`` = f(H + C) - f(H) (or that plus the constant, whichever
is better). Upstream's module is loaded from the pristine pinned tree, as
scripts/bench/predictor.py does.
"""

from __future__ import annotations

import csv
import importlib.util
import statistics
from collections import defaultdict

import numpy as np
import pytest
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_samples import group_points
from vllm_ascend_patchset.paths import BENCH_DIR, DATA_DIR

SURFACES = sorted(DATA_DIR.glob("cpu_surface*.csv"))


def read_surface(path):
    with path.open() as handle:
        return [
            (int(r["chunk_tokens"]), int(r["history_tokens"]), float(r["latency_ms"])) for r in csv.DictReader(handle)
        ]


def medians(samples):
    groups = defaultdict(list)
    for chunk, history, latency_ms in samples:
        groups[(chunk, history)].append(latency_ms)
    return {key: statistics.median(values) for key, values in groups.items()}


def mape(predict, points):
    return float(np.mean([abs(predict(c, h) - ms) / ms for (c, h), ms in points.items()]))


@pytest.fixture(scope="module")
def upstream():
    """Upstream v0.23.0's vllm_ascend/core/profiling_chunk_predictor.py, under another module name."""
    spec = importlib.util.spec_from_file_location("bench_predictor", BENCH_DIR / "predictor.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.load_upstream()


def upstream_start_up_predictions(upstream, samples):
    """Upstream's start-up fit on the H = 0 samples, and the two ways to read a chunk's time from it."""
    predictor = upstream.ChunkSizePredictor()
    assert predictor.fit([c for c, h, _ in samples if h == 0], [ms for _, h, ms in samples if h == 0])
    return {
        "get_time": predictor.get_time,
        "get_time+c": lambda chunk, history: predictor.get_time(chunk, history) + predictor.constant_coeff_c,
    }


def grid_levels(samples):
    """History levels at which every chunk size measured at every level was measured."""
    points = medians(samples)
    histories = sorted({h for _, h in points})
    chunks = [c for c in sorted({c for c, _ in points}) if all((c, h) in points for h in histories)]
    return histories, chunks


@pytest.mark.parametrize("path", SURFACES, ids=lambda p: p.name)
def test_each_measured_surface_has_repeats_and_a_visible_attention_term(path):
    samples = read_surface(path)
    points = medians(samples)
    histories, chunks = grid_levels(samples)
    assert histories[0] == 0 and len(histories) >= 4 and len(chunks) >= 6
    assert len(samples) >= 3 * len(points)
    # At the longest history a chunk costs several times what it costs without history.
    assert points[(chunks[-1], histories[-1])] > 2 * points[(chunks[-1], 0)]


@pytest.mark.parametrize("path", SURFACES, ids=lambda p: p.name)
@pytest.mark.full_tier("upstream's predictor imports vLLM's logger")
def test_the_model_predicts_held_out_histories_within_15_percent_and_3x_better_than_upstream(upstream, path):
    samples = read_surface(path)
    histories, chunks = grid_levels(samples)
    kept_levels = {0, histories[len(histories) // 2], histories[-1]}
    kept = [s for s in samples if s[1] in kept_levels and s[0] in chunks]
    held_out = {key: ms for key, ms in medians(samples).items() if key[1] not in kept_levels and key[0] in chunks}
    assert len(held_out) >= 10
    points, scatter = group_points(kept)
    model = LatencyModel.from_points(points, scatter)
    ours = mape(model.time_ms, held_out)
    theirs = min(mape(predict, held_out) for predict in upstream_start_up_predictions(upstream, samples).values())
    assert ours <= 0.15, f"our MAPE {ours:.1%} on held-out points"
    assert ours * 3 <= theirs, f"ours {ours:.1%} vs upstream start-up {theirs:.1%}"


@pytest.mark.parametrize("path", SURFACES, ids=lambda p: p.name)
def test_each_measured_surface_is_accepted_as_a_profile(path):
    samples = read_surface(path)
    histories, chunks = grid_levels(samples)
    grid = [s for s in samples if s[0] in chunks]
    verdict = judge(grid, ChunkLimits(max(chunks), histories[-1] + max(chunks)), 4,
                    max_history_tokens=histories[-1], last_round=True)  # fmt: skip
    assert verdict.model is not None, verdict.reason
