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
import sys
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


@pytest.fixture(scope="module")
def measure():
    spec = importlib.util.spec_from_file_location("measure_cpu_surface", BENCH_DIR.parent / "measure_cpu_surface.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.mark.parametrize(
    "argv, says",
    [
        # --repeats 0 wrote an empty surface over the committed one; the others built the model and its KV
        # caches first, then failed in torch or ran out of memory
        (["--repeats", "0"], "--repeats must be in [1, 1000], got 0"),
        (["--repeats", "1000000000000"], "--repeats must be in [1, 1000]"),
        (["--histories", "2048", "1000000000000"], "--histories must be in [1, 262144], got 1000000000000"),
        (["--chunks", "0"], "--chunks must be in [1, 262144], got 0"),
        (["--startup-chunks", "-256"], "--startup-chunks must be in [1, 262144], got -256"),
        (["--threads", "0"], "--threads must be in [1, "),
        (["--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
        (["--num-layers", "0"], "--num-layers must be in [1, 128], got 0"),
        (["--hidden-size", "1000000000000"], "--hidden-size must be in [1, 16384]"),
        (["--num-heads", "3", "--num-kv-heads", "2"], "--num-kv-heads 2 must divide --num-heads 3"),
        (["--clock", "thread", "--threads", "2"], "--clock thread measures one thread"),
    ],
)
def test_measure_refuses_bad_input_before_building_the_model(measure, monkeypatch, capsys, tmp_path, argv, says):
    def build(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(measure, "TinyQwen3", build)
    out = tmp_path / "surface.csv"
    with pytest.raises(SystemExit) as exit_info:
        measure.main(["--out", str(out), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not out.exists()


def test_measure_refuses_an_out_it_cannot_write_before_measuring(measure, monkeypatch, capsys, tmp_path):
    """A file standing where --out's folder goes failed in mkdir after every point was measured."""
    monkeypatch.setattr(measure, "TinyQwen3", lambda *args: pytest.fail("the model was built"))
    blocker = tmp_path / "a-file"
    blocker.write_text("kept")
    for out in (blocker / "surface.csv", tmp_path):
        with pytest.raises(SystemExit):
            measure.main(["--out", str(out)])
        assert f"--out {out}: " in capsys.readouterr().err
    assert blocker.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_measure_defaults_pass_the_checks(measure, monkeypatch, tmp_path):
    class Reached(Exception):
        """The checks passed: the model would be built here."""

    def build(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(measure, "TinyQwen3", build)
    with pytest.raises(Reached):
        measure.main(["--out", str(tmp_path / "new" / "surface.csv")])
    assert not any(tmp_path.iterdir())
