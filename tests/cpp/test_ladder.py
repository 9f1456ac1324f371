"""The 1-1.5-2 ladder of chunk sizes is stated once (core/cpp_ladder.py): the profiled sizes and the fixed
chunks of the safety net's sweep are exactly its sizes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from vllm_ascend.core.cpp_chunk_check import fixed_sweep
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_ladder import ladder
from vllm_ascend.core.cpp_profile_plan import chunk_ladder

BASES = sorted({*range(1, 300), *range(300, 20_000, 97), 4096, 6144, 8192, 12288, 16384, 10**6, 10**7, 1 << 30})


def test_the_ladder_is_powers_of_two_from_32_and_one_and_a_half_of_them_from_96():
    assert ladder(32, 400) == [32, 64, 96, 128, 192, 256, 384]
    assert ladder(64, 64) == [64] and ladder(65, 95) == [] and ladder(1, 31) == [] and ladder(97.5, 128.0) == [128]
    assert ladder(33, 1 << 30) == sorted({*(1 << k for k in range(6, 31)), *(3 << k for k in range(5, 29))})


@pytest.mark.parametrize("high", [math.inf, math.nan, 1 << 62])
def test_an_unbounded_ladder_is_refused_not_walked_forever(high):
    with pytest.raises(ValueError, match="finite token count"):
        ladder(32, high)


def _split(rungs):
    return [c for c in rungs if c & (c - 1) == 0], [c for c in rungs if c & (c - 1)]


@pytest.mark.parametrize("points", [3, 8, 12, 17, 24, 40, 64])
def test_the_profiled_sizes_are_one_the_base_and_the_ladder_below_it(points):
    """Every profiled size but 1 and the base is on the ladder; with room for them all, the ladder's powers
    of two below the base and as many of its 1.5x sizes as fit, the largest kept."""
    for base in BASES:
        rungs = ladder(32, base - 1)
        sizes = chunk_ladder(base, points)
        assert set(sizes) <= {1, base, base // 4, base // 2, *rungs}, (base, points)
        powers, halves = _split(rungs)
        fixed = sorted({1, *powers, base})
        if len(fixed) < 3 or len(fixed) > points:
            continue  # a tiny budget: its quarters, or powers of two left out
        spare = points - len(fixed)
        assert sizes == sorted({*fixed, *(halves[-spare:] if spare else [])}), (base, points)


@pytest.mark.parametrize("granule, floor", [(1, 1), (1, 100), (64, 1), (96, 1), (128, 256)])
def test_the_fixed_sweep_is_the_ladder_from_64_below_the_cap_and_the_cap(granule, floor):
    for cap in [*BASES, 805_306_367, 805_306_368, 805_306_369, 1 << 31]:
        limits = ChunkLimits(cap, max_model_len=1 << 31, min_chunk_tokens=floor, granule_tokens=granule)
        floor_tokens = limits.floor_tokens
        swept = {cap, *ladder(64, min(cap - 1, 96 << 23))}  # (the sweep stops at 805M tokens, past any context)
        expected = sorted(c for c in swept if floor_tokens <= c <= cap and (granule <= 1 or c % granule == 0))
        assert fixed_sweep(SimpleNamespace(limits=limits)) == expected, (cap, granule, floor)
