"""The twin's sweeps and stress surfaces use CPP's 1-1.5-2 ladder of chunk sizes (core/cpp_ladder.py)."""

from __future__ import annotations

import importlib.util
import sys

from vllm_ascend.core.cpp_ladder import ladder as overlay_ladder
from vllm_ascend_patchset.paths import BENCH_DIR
from vllm_ascend_patchset.twin import policies, slo, stress
from vllm_ascend_patchset.twin.ladder import ladder


def test_the_twin_reads_the_ladder_the_overlay_states():
    for low, high in ((1, 1 << 30), (32, 400), (64, 98_305), (100, 100), (97.5, 200.0)):
        assert ladder(low, high) == overlay_ladder(low, high)


def test_the_slo_sweep_and_the_goodput_grid_are_the_ladder_from_64():
    assert policies.SLO_SWEEP_TOKENS == tuple(ladder(64, 32768))
    assert slo.GRID_TOKENS == tuple(ladder(64, 131072))
    assert policies.SLO_SWEEP_TOKENS[:5] == (64, 96, 128, 192, 256)


def test_an_odd_point_spreads_to_the_ladder_sizes_either_side():
    rungs = ladder(32, 98304)
    sizes = {*range(1, 1200), *(c + d for c in rungs for d in (-1, 0, 1)), 96.5, 767.9, 98304.5, 10**6, 0.5}
    for size in sorted(sizes):
        below = max((c for c in rungs if c < size), default=size / 2)
        above = min((c for c in rungs if c > size), default=size * 2)
        assert stress._ladder_neighbours(size) == (below, above), size


def test_the_mixed_traffic_bench_sweeps_the_ladder_from_128():
    sys.path.insert(0, str(BENCH_DIR))  # cpp_mixed imports cpp_surfaces as its folder's module
    try:
        spec = importlib.util.spec_from_file_location("cpp_mixed", BENCH_DIR / "cpp_mixed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    assert module.SWEEP == ",".join(map(str, ladder(128, 8192)))
    assert module.SWEEP.startswith("128,192,256,384,512,768,") and module.SWEEP.endswith(",6144,8192")
