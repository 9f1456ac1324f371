"""The optimum of one prompt: a lower bound no chunking beats, reached within its tolerance, on any surface."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from vllm_ascend_patchset.twin.optimum import GRID_TOKENS, flow_shop_ms, optimum
from vllm_ascend_patchset.twin.stress import STRESS_SURFACES
from vllm_ascend_patchset.twin.surface import SYNTHETIC, GridSurface


def all_chunkings(units: int, max_units: int):
    """Every way to cut ``units`` grid units into chunks of at most ``max_units``."""
    for cuts in itertools.product([False, True], repeat=units - 1):
        edges = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), units]
        sizes = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        if max(sizes) <= max_units:
            yield edges


def brute_force_ms(surface, prompt_tokens: int, num_stages: int, max_units: int) -> float:
    units = math.ceil(prompt_tokens / GRID_TOKENS)
    best = math.inf
    for edges in all_chunkings(units, max_units):
        starts = [e * GRID_TOKENS for e in edges[:-1]]
        ends = [min(e * GRID_TOKENS, prompt_tokens) for e in edges[1:]]
        times = [surface.time_ms(b - a, a) for a, b in zip(starts, ends, strict=True)]
        best = min(best, flow_shop_ms(times, [1 / num_stages] * num_stages, in_flight=False))
    return best


def dipping_surface():
    """Measured medians that dip (noise): 192 tokens take less than 128 at every history."""
    points = []
    for history in (0, 256, 512):
        for chunk, ms in ((64, 10.0), (128, 20.0), (192, 15.0), (256, 40.0), (512, 90.0)):
            points.append((chunk, history, ms + history / 50))
    return GridSurface.from_points(points, name="dipping")


SURFACES = [SYNTHETIC, STRESS_SURFACES["tiles256"], STRESS_SURFACES["knee"], dipping_surface()]


@pytest.mark.parametrize("surface", SURFACES, ids=["synthetic", "tiles256", "knee", "dipping"])
@pytest.mark.parametrize("num_stages", [1, 2, 4])
@pytest.mark.parametrize("base_chunk_tokens", [192, 1024])
def test_no_chunking_beats_the_lower_bound_and_the_best_found_is_within_tolerance(
    surface, num_stages, base_chunk_tokens
):
    prompt_tokens = 11 * GRID_TOKENS - 20  # the last chunk is partial
    best = optimum(surface, prompt_tokens, num_stages, base_chunk_tokens=base_chunk_tokens)
    exhaustive = brute_force_ms(surface, prompt_tokens, num_stages, base_chunk_tokens // GRID_TOKENS)
    assert best.lower_ms <= exhaustive * (1 + 1e-9)
    assert best.best_ms == pytest.approx(exhaustive, rel=1e-4)
    assert max(best.chunks) <= base_chunk_tokens


def test_a_token_budget_binds_the_chunks_of_the_optimum():
    free = optimum(SYNTHETIC, 32_768, 2)
    capped = optimum(SYNTHETIC, 32_768, 2, base_chunk_tokens=2048)
    assert max(free.chunks) > 2048 >= max(capped.chunks)
    assert capped.lower_ms > free.lower_ms
    assert np.isfinite(capped.in_flight_ms) and capped.in_flight_ms >= capped.lower_ms
