"""Real data: a latency surface t(C, H) measured on a CPU by scripts/measure_cpu_surface.py.

Fitting the H = 0 samples plus one or two history levels must predict the other
history levels within 15% MAPE, and at least 3x better than upstream v0.23.0's start-up
model (f(l) = a*l^2 + b*l + c by least squares on the H = 0 samples, a chunk costing
f(H + C) - f(H)) on the same points.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from vllm_ascend.core.profiling_chunk_predictor import ChunkSizePredictor, LatencyModel

SURFACE = Path(__file__).resolve().parents[1] / "data" / "cpu_surface.csv"


def read_surface():
    with SURFACE.open() as handle:
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


def upstream_start_up_predictions(samples):
    """Upstream's start-up model: plain least squares of a*l^2 + b*l + c on the H = 0 samples."""
    lengths = np.array([c for c, h, _ in samples if h == 0], dtype=float)
    latency_ms = np.array([ms for _, h, ms in samples if h == 0])
    a, b, c = np.linalg.lstsq(np.column_stack([lengths**2, lengths, np.ones_like(lengths)]), latency_ms, rcond=None)[0]

    def f(length):
        return a * length**2 + b * length + c

    return {
        "f(H+C)-f(H)": lambda chunk, history: f(history + chunk) - f(history),
        "f(H+C)-f(H)+c": lambda chunk, history: f(history + chunk) - f(history) + c,
    }


def test_the_surface_has_repeats_and_a_visible_attention_term():
    samples = read_surface()
    points = medians(samples)
    histories = sorted({h for _, h in points})
    assert histories[0] == 0 and histories[-1] >= 32768 and len(histories) >= 4
    assert max(c for c, _ in points) >= 4096
    assert len(samples) >= 3 * len(points)
    # At the longest history a chunk costs several times what it costs without history.
    assert points[(2048, histories[-1])] > 3 * points[(2048, 0)]


@pytest.mark.parametrize("fit_histories", [(4096, 32768), (8192, 32768), (16384,)], ids=str)
def test_fit_predicts_held_out_histories_within_15_percent_and_3x_better_than_upstream(fit_histories):
    samples = read_surface()
    fit_levels = {0, *fit_histories}
    fit_samples = [s for s in samples if s[1] in fit_levels]
    held_out = {key: ms for key, ms in medians(samples).items() if key[1] not in fit_levels}
    assert len(held_out) >= 14

    model = LatencyModel.fit(*zip(*fit_samples, strict=True))
    ours = mape(model.time_ms, held_out)
    upstream = min(mape(predict, held_out) for predict in upstream_start_up_predictions(samples).values())
    assert ours <= 0.15, f"our MAPE {ours:.1%} on held-out points"
    assert ours * 3 <= upstream, f"ours {ours:.1%} vs upstream start-up {upstream:.1%}"


def test_start_up_profile_alone_gives_a_safe_predictor_on_the_surface():
    samples = read_surface()
    start_up = LatencyModel.fit(*zip(*[s for s in samples if s[1] == 0], strict=True))
    predictor = ChunkSizePredictor(
        start_up, base_chunk_size=4096, page_size=128, max_model_len=65_536, max_num_scheduled_tokens=4096
    )
    chunks = [predictor.next_chunk(h, 60_000) for h in (0, 8192, 32768)]
    assert chunks[0] == 4096 and chunks == sorted(chunks, reverse=True) and chunks[-1] < 4096
