"""The runs of CPP's start-up profile (core/cpp_profiling.py measures them): a grid and a tile probe.

The grid, where the decisions are made: chunk sizes of the 1-1.5-2 ladder (1, 32, 64,
96, 128, 192, 256, ... up to the base chunk, ``max_num_batched_tokens``), so a device's
bends, knees and tile steps between 32 tokens and the base chunk are measured at sizes
that sit on tile boundaries, and C = 1 measures what a decode costs; every size at
every history length (0 and ``history_points`` lengths evenly up to the deepest history
the scheduler will see). That deepest history is the base chunk's (the context less the
base chunk) but every smaller size runs deeper: the prompt's last base chunk of tokens,
a quarter of a 32k prompt at base 8192 and its dearest steps, would be read from the
levels above. So the deepest level lies half a base chunk deeper, where the sizes up to
half the base chunk still fit, and the larger sizes, which do not, are not measured there
(the latency model gives them what that interval adds to the sizes measured there,
core/cpp_grid.py ``fill_deepest``), when the level above still fits the base chunk
(``history_levels_for``; with one level, little history, or a token budget so small that
fewer than three sizes fit there, the deepest stays the base chunk's). The tile probe: pairs
of sizes S and S + 1 without history at the first boundary of each candidate tile (64 to 512
tokens), ``PROBE_REPEATS`` times each a pass (core/cpp_acceptance.py tells whether time steps
there).

Pure Python: no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_ascend.core.cpp_acceptance import TILE_CANDIDATES
from vllm_ascend.core.cpp_ladder import SMALLEST_LADDER_CHUNK, ladder
from vllm_ascend.core.cpp_latency_model import MIN_NODES

__all__ = [
    "PROBE_REPEATS",
    "SMALLEST_LADDER_CHUNK",
    "chunk_ladder",
    "history_levels",
    "history_levels_for",
    "profile_plan",
    "tile_probe",
]

PROBE_REPEATS = 3  # runs of each tile probe point per pass: a step is told from noise by the medians' error


def chunk_ladder(base_chunk_tokens: int, points: int) -> list[int]:
    """Profiled chunk sizes: 1, then 32, 64, 96, 128, 192, ... (powers of two and 1.5x them), then the base.

    At most ``points`` sizes: the 1.5x sizes are left out from the smallest up when
    there are more.
    """
    base = max(1, int(base_chunk_tokens))
    below = ladder(SMALLEST_LADDER_CHUNK, base - 1)
    powers = [size for size in below if size & (size - 1) == 0]
    middles = [size for size in below if size & (size - 1)]  # the 1.5x sizes
    fixed = sorted({1, *powers, base})
    if len(fixed) < 3:  # a tiny token budget: its quarters, so the model still has a shape
        fixed = sorted({1, max(1, base // 4), max(1, base // 2), base})
    spare = max(0, points - len(fixed))
    kept = middles[len(middles) - spare :] if spare < len(middles) else middles
    sizes = sorted({*fixed, *kept})
    while len(sizes) > max(points, 3):  # a tiny budget: keep 1, the base and evenly spread powers
        sizes.pop(len(sizes) // 2)
    return sizes


def history_levels(max_history_tokens: int, count: int, align: int = 1) -> list[int]:
    """0 and ``count`` history lengths evenly up to ``max_history_tokens`` (rounded down to ``align``)."""
    levels = [0]
    for index in range(1, count + 1):
        history = int(max_history_tokens * index / count) // align * align
        if history > levels[-1]:
            levels.append(history)
    return levels


def history_levels_for(
    base_chunk_tokens: int, max_history_tokens: int, count: int, align: int = 1, sizes: Sequence[int] | None = None
) -> list[int]:
    """The profile's history levels for a base chunk whose deepest history is ``max_history_tokens``: the
    deepest half a base chunk deeper when the level above it still fits the base chunk and the deeper level
    holds ``MIN_NODES`` of the profiled ``sizes`` (up to half the base chunk; default: the ladder's), enough to
    form a row of the model (module docstring)."""
    context = max_history_tokens + base_chunk_tokens
    deeper = history_levels(max_history_tokens + base_chunk_tokens // 2, count, align)
    sizes = chunk_ladder(base_chunk_tokens, 64) if sizes is None else sizes
    fit = sum(1 for size in sizes if 2 * size <= base_chunk_tokens)  # as the acceptance counts them
    if max_history_tokens > 0 and len(deeper) >= 3 and deeper[-2] + base_chunk_tokens <= context and fit >= MIN_NODES:
        return deeper
    return history_levels(max_history_tokens, count, align)


def tile_probe(base_chunk_tokens: int) -> list[tuple[int, int]]:
    """Pairs (S, S + 1) without history at each candidate tile's first boundary, S = the tile
    (core/cpp_acceptance.py): one token past the smallest chunk a tile holds costs a whole
    tile more, the largest step relative to the chunk's time there is on that device."""
    return [run for tile in TILE_CANDIDATES if tile + 1 <= base_chunk_tokens for run in ((tile, 0), (tile + 1, 0))]


def profile_plan(
    *,
    base_chunk_tokens: int,
    points: int,
    repeats: int,
    history_points: int,
    max_history_tokens: int,
    align: int = 1,
) -> list[tuple[int, int]]:
    """One round's (chunk_tokens, history_tokens) runs in measurement order: ``repeats`` passes over the grid
    and the tile probe, each probe point ``PROBE_REPEATS`` times a pass (its S counting the grid's run)."""
    context = max_history_tokens + base_chunk_tokens
    sizes = chunk_ladder(base_chunk_tokens, points)
    grid = [
        (chunk, history)
        for history in history_levels_for(base_chunk_tokens, max_history_tokens, history_points, align, sizes)
        for chunk in sizes
        if chunk + history <= context
    ]
    probe = []
    for run in tile_probe(base_chunk_tokens) * PROBE_REPEATS:  # S and S + 1 alternate: drift falls on both
        if run in grid and probe.count(run) + 1 >= PROBE_REPEATS:
            continue
        probe.append(run)
    return (grid + probe) * repeats
