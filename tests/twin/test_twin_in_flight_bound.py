"""The in-flight bound: never above the least makespan under the limit of P batches in flight, exact unmerged."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from vllm_ascend_patchset.twin.in_flight_bound import MERGE_MS, certified_at, in_flight_lower_ms
from vllm_ascend_patchset.twin.optimum import GRID_TOKENS, flow_shop_ms, grid_rows, optimum


class ArbitrarySurface:
    """Any positive time per (history, chunk) on the grid: no functional form, falls anywhere."""

    fixed_ms = 0.0

    def __init__(self, seed: int, units: int):
        rng = np.random.default_rng(seed)
        growth = np.arange(1, units + 1) ** rng.uniform(0.2, 1.2)
        self.ms = rng.uniform(1.0, 10.0, size=(units, units)) * growth[None, :]

    def time_ms(self, chunk_tokens, history_tokens):
        return float(self.ms[int(history_tokens) // GRID_TOKENS, int(chunk_tokens) // GRID_TOKENS - 1])

    def time_ms_many(self, chunk_tokens, history_tokens):
        return np.array([self.time_ms(c, history_tokens) for c in chunk_tokens])


def least_in_flight_ms(surface, units: int, max_units: int, stages: int) -> float:
    """Every chunking of ``units`` grid units into chunks of at most ``max_units``, under the in-flight rule."""
    best = math.inf
    for cuts in itertools.product([False, True], repeat=units - 1):
        edges = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), units]
        sizes = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        if max(sizes) <= max_units:
            times = [surface.time_ms(s * GRID_TOKENS, a * GRID_TOKENS) for s, a in zip(sizes, edges, strict=False)]
            best = min(best, flow_shop_ms(times, [1 / stages] * stages, in_flight=True))
    return best


CASES = [(seed, 11, [3, 5, 11][seed % 3], 2 + seed % 3) for seed in range(9)]


def problem(seed, units, max_units):
    surface = ArbitrarySurface(seed, units)
    return surface, [row for row, _ in grid_rows(surface, units * GRID_TOKENS, max_units)]


@pytest.mark.parametrize(("seed", "units", "max_units", "stages"), CASES)
def test_exact_without_merging_and_never_above_the_least(seed, units, max_units, stages):
    surface, times = problem(seed, units, max_units)
    least = least_in_flight_ms(surface, units, max_units, stages)
    # One pass with nothing pruned and states merged only on the finest grid: the least, to that grid.
    exact = certified_at(times, stages, math.inf, max_states=10**6, max_passes=1)
    assert least - MERGE_MS * units <= exact <= least + 1e-9
    for max_states in (10**6, 3, 1):  # heavy merging loosens the bound, never lifts it
        for theta in (0.9 * least, least * (1 - 1e-9), 1.001 * least, 1.2 * least):
            found = certified_at(times, stages, theta, max_states=max_states, max_passes=4)
            assert found <= min(theta, least) + 1e-9
            if max_states == 10**6 and theta < least:
                assert found == theta  # unmerged, a threshold below the least is certified


@pytest.mark.parametrize(("seed", "units", "max_units", "stages"), CASES)
def test_bisection_between_the_flow_shop_bound_and_the_engine_schedule(seed, units, max_units, stages):
    surface, _ = problem(seed, units, max_units)
    least = least_in_flight_ms(surface, units, max_units, stages)
    best = optimum(surface, units * GRID_TOKENS, stages, base_chunk_tokens=max_units * GRID_TOKENS)
    tokens, base = units * GRID_TOKENS, max_units * GRID_TOKENS
    found = in_flight_lower_ms(surface, tokens, stages, best.lower_ms, best.in_flight_ms, base, max_states=10**6)
    assert best.lower_ms - 1e-9 <= found <= least + 1e-9
    assert found >= least / 1.002 - MERGE_MS * units  # tight to the bisection's tolerance when unmerged


def test_the_limit_lifts_the_bound_where_chunk_times_fall():
    """Some random surfaces lose time to the in-flight rule: there the bound rises above the flow-shop one."""
    lifted = 0
    for seed, units, max_units, stages in CASES:
        surface, _ = problem(seed, units, max_units)
        best = optimum(surface, units * GRID_TOKENS, stages, base_chunk_tokens=max_units * GRID_TOKENS)
        found = in_flight_lower_ms(
            surface, units * GRID_TOKENS, stages, best.lower_ms, best.in_flight_ms, max_units * GRID_TOKENS
        )
        lifted += found > best.lower_ms * 1.01
    assert lifted >= 2
