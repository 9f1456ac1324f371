"""The in-flight bound: never above the least makespan under the limit of P batches in flight, exact unmerged."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from vllm_ascend_patchset.twin.in_flight_bound import MERGE_SHARE, certified_at, in_flight_lower_ms
from vllm_ascend_patchset.twin.optimum import GRID_TOKENS, flow_shop_ms, grid_rows, optimum


class ArbitrarySurface:
    """Any positive time per (history, chunk) on the grid: no functional form, falls anywhere."""

    fixed_ms = 0.0

    def __init__(self, seed: int, units: int):
        rng = np.random.default_rng(seed)
        growth = np.arange(1, units + 1) ** rng.uniform(0.2, 1.2)
        self.ms = rng.uniform(1.0, 10.0, size=(units, units)) * growth[None, :]

    def time_ms(self, chunk_tokens, history_tokens):
        return float(self.ms[int(history_tokens) // GRID_TOKENS, -(-int(chunk_tokens) // GRID_TOKENS) - 1])

    def time_ms_many(self, chunk_tokens, history_tokens):
        return np.array([self.time_ms(c, history_tokens) for c in chunk_tokens])


def least_in_flight_ms(surface, tokens: int, max_units: int, stages: int) -> float:
    """Every chunking of ``tokens`` on the grid into chunks of at most ``max_units`` units, under the in-flight rule."""
    units, best = -(-tokens // GRID_TOKENS), math.inf
    for cuts in itertools.product([False, True], repeat=units - 1):
        edges = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), units]
        if max(b - a for a, b in zip(edges, edges[1:], strict=False)) <= max_units:
            starts = [a * GRID_TOKENS for a in edges[:-1]]
            ends = [min(b * GRID_TOKENS, tokens) for b in edges[1:]]
            times = [surface.time_ms(b - a, a) for a, b in zip(starts, ends, strict=True)]
            best = min(best, flow_shop_ms(times, [1 / stages] * stages, in_flight=True))
    return best


def grid_loss(times, stages: int) -> float:
    """The most the finest merging grid can lower the bound: a step per chunk."""
    return MERGE_SHARE * min(float(row.min()) for row in times) / stages * len(times)


# (seed, prompt tokens: some end in a part of a grid unit, largest chunk in units, stages)
CASES = [(seed, 11 * GRID_TOKENS - 17 * (seed % 2), [3, 5, 11][seed % 3], 2 + seed % 3) for seed in range(9)]


def problem(seed, tokens, max_units):
    surface = ArbitrarySurface(seed, -(-tokens // GRID_TOKENS))
    return surface, [row for row, _ in grid_rows(surface, tokens, max_units)]


@pytest.mark.parametrize(("seed", "tokens", "max_units", "stages"), CASES)
def test_exact_without_merging_and_never_above_the_least(seed, tokens, max_units, stages):
    surface, times = problem(seed, tokens, max_units)
    least = least_in_flight_ms(surface, tokens, max_units, stages)
    # One pass with nothing pruned and states merged only on the finest grid: the least, to that grid.
    exact = certified_at(times, stages, math.inf, max_states=10**6, max_passes=1)
    assert least - grid_loss(times, stages) <= exact <= least + 1e-9
    for max_states in (10**6, 3, 1):  # heavy merging loosens the bound, never lifts it
        for theta in (0.9 * least, least * (1 - 1e-9), 1.001 * least, 1.2 * least):
            found = certified_at(times, stages, theta, max_states=max_states, max_passes=4)
            assert found <= min(theta, least) + 1e-9
            if max_states == 10**6 and theta < least:
                assert found == theta  # unmerged, a threshold below the least is certified


@pytest.mark.parametrize(("seed", "tokens", "max_units", "stages"), CASES)
def test_bisection_between_the_flow_shop_bound_and_the_engine_schedule(seed, tokens, max_units, stages):
    surface, _ = problem(seed, tokens, max_units)
    least = least_in_flight_ms(surface, tokens, max_units, stages)
    base = max_units * GRID_TOKENS
    best = optimum(surface, tokens, stages, base_chunk_tokens=base)
    found = in_flight_lower_ms(surface, tokens, stages, best.lower_ms, best.in_flight_ms, base, max_states=10**6)
    assert best.lower_ms - 1e-9 <= found <= least + 1e-9
    times = [row for row, _ in grid_rows(surface, tokens, max_units)]
    assert found >= least / 1.002 - grid_loss(times, stages)  # tight to the bisection's tolerance when unmerged


def test_the_limit_lifts_the_bound_where_chunk_times_fall():
    """Some random surfaces lose time to the in-flight rule: there the bound rises above the flow-shop one."""
    lifted = 0
    for seed, tokens, max_units, stages in CASES:
        surface, _ = problem(seed, tokens, max_units)
        best = optimum(surface, tokens, stages, base_chunk_tokens=max_units * GRID_TOKENS)
        found = in_flight_lower_ms(surface, tokens, stages, best.lower_ms, best.in_flight_ms, max_units * GRID_TOKENS)
        lifted += found > best.lower_ms * 1.01
    assert lifted >= 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ms: ms.__setitem__((0, 0), math.inf), "chunk times must be finite and > 0"),
        (lambda ms: ms.__setitem__((1, 1), math.nan), "chunk times must be finite and > 0"),
        (lambda ms: ms.__setitem__((0, 0), 0.0), "chunk times must be finite and > 0"),
    ],
)
def test_a_time_no_bound_can_rest_on_is_refused(change, message):
    """A non-finite time once made every state look hopeless, so any threshold came out certified."""
    surface = ArbitrarySurface(0, 6)
    change(surface.ms)
    times = [row for row, _ in grid_rows(surface, 6 * GRID_TOKENS, 3)]
    with pytest.raises(ValueError, match=message):
        certified_at(times, 2, 1e9, max_states=100, max_passes=2)


def test_inputs_the_bisection_cannot_close_on_are_refused():
    surface = ArbitrarySurface(1, 6)
    tokens = 6 * GRID_TOKENS
    for lower, upper in ((0.0, 50.0), (10.0, math.inf), (60.0, 50.0), (math.nan, 50.0)):
        with pytest.raises(ValueError, match="need 0 < lower_ms <= upper_ms < inf"):
            in_flight_lower_ms(surface, tokens, 2, lower, upper)
    for stages, states, match in ((0, 10, "num_stages 0"), (129, 10, "num_stages 129"), (2, 0, "max_states 0")):
        with pytest.raises(ValueError, match=match):
            in_flight_lower_ms(surface, tokens, stages, 10.0, 50.0, max_states=states)
    with pytest.raises(ValueError, match="prompt_tokens 0"):
        in_flight_lower_ms(surface, 0, 2, 10.0, 50.0)
