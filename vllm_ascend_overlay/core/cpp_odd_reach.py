"""How far an odd point of a CPP profile reaches in history: measured between the profile's levels.

The profile measures every size at a few history lengths (levels), and the latency model
reads a size linearly in history between two of them. An odd point (a size a kernel or
tiling favours at some histories, or one it does not; core/cpp_falls.py) is measured at
its level only: read linearly, its departure from the trend of its row reaches all the
way to the next level, and on a device where it is narrower than the levels' spacing the
plan then runs that size where it is not fast (or avoids it where it is not slow).

So after the rounds, each odd point that departs from its row's trend (the line in log C
and log t through the nearest sizes either side that are not odd, by more than
``ODD_MIN_FALL``) is measured at the middle of the interval towards each neighbouring
level, ``repeats`` times (``reach_runs``; within the runs the profile has left after its
rounds, core/cpp_profiling.py, nearest the shallowest odd point first). Not in the last
interval: beyond the deepest level the model continues that interval's slope, which a
point between its levels would bend. The model keeps each such run's median as a ratio
over its levels' line there (``reach``), a level between the two that holds the measured
size at that ratio and every other size on the line (``with_reach`` rows): so an odd point
fades where it was measured to, and a correction of the table (core/cpp_calibration.py)
moves it with its levels.

Pure Python: no numpy, no vLLM.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from vllm_ascend.core.cpp_falls import ODD_MIN_FALL
from vllm_ascend.core.cpp_samples import Point

__all__ = ["reach_of", "reach_runs", "with_reach"]


def _departs(row: Sequence[float], log_nodes: Sequence[float], odd_nodes: set[int], i: int) -> bool:
    """Whether an odd point's time departs from the trend of its row (see the module docstring)."""
    below = next((k for k in range(i - 1, -1, -1) if k not in odd_nodes), None)
    above = next((k for k in range(i + 1, len(row)) if k not in odd_nodes), None)
    if below is None or above is None:
        return False
    weight = (log_nodes[i] - log_nodes[below]) / (log_nodes[above] - log_nodes[below])
    trend = math.exp(math.log(row[below]) + weight * (math.log(row[above]) - math.log(row[below])))
    return abs(math.log(row[i] / trend)) > ODD_MIN_FALL


def reach_runs(model, repeats: int, budget: int) -> list[tuple[int, int]]:
    """(chunk_tokens, history_tokens) runs between levels around the odd points that depart from their rows'
    trend, ``repeats`` each, within ``budget`` (see the module docstring)."""
    nodes, levels = model.chunk_tokens, model.history_tokens
    log_nodes = [math.log(c) for c in nodes]
    odd = {(levels.index(h), nodes.index(c)) for c, h in model.odd_points}
    wanted: list[tuple[int, int]] = []
    for j, i in sorted(odd):
        if i == 0 or not _departs(model.step_ms[j], log_nodes, {k for level, k in odd if level == j}, i):
            continue
        for other in (j - 1, j + 1):
            if 0 <= other < len(levels) - 1 and max(j, other) < len(levels) - 1:
                run = (nodes[i], (levels[j] + levels[other]) // 2)
                if run[1] not in levels and run not in wanted:
                    wanted.append(run)
    runs = []
    for run in wanted:
        if len(runs) + repeats > budget:
            break
        runs += [run] * repeats
    return runs


def _line_ms(model, chunk: int, history: int) -> float:
    """The model's reading of a profiled size between two levels: their line."""
    levels = model.history_tokens
    j = bisect.bisect_right(levels, history) - 1
    i = model.chunk_tokens.index(chunk)
    low, high = model.step_ms[j][i], model.step_ms[j + 1][i]
    return low + (history - levels[j]) / (levels[j + 1] - levels[j]) * (high - low)


def reach_of(model, points: Sequence[Point]) -> tuple[tuple[int, int, float], ...]:
    """The points measured between levels (profiled sizes but the smallest, inside the levels' range) as
    (chunk_tokens, history_tokens, median over the levels' line there): ``LatencyModel.reach``."""
    nodes, levels = model.chunk_tokens, model.history_tokens
    return tuple(
        (p.chunk_tokens, p.history_tokens, p.median_ms / _line_ms(model, p.chunk_tokens, p.history_tokens))
        for p in sorted(points, key=lambda p: (p.chunk_tokens, p.history_tokens))
        if p.chunk_tokens in nodes[1:] and 0 < p.history_tokens < levels[-1] and p.history_tokens not in levels
    )


def with_reach(
    levels: Sequence[float], rows: Sequence[Sequence[float]], kept: set[tuple[int, int]], nodes: Sequence[int],
    reach: Sequence[tuple[int, int, float]],
) -> tuple[list[float], list[list[float]], set[tuple[int, int]]]:  # fmt: skip
    """The levels, rows and odd cells (level, node) the model reads: a level at each history of ``reach``, every
    size on its levels' line there and the measured sizes at their ratio over it (odd cells, since they may
    fall below a neighbour)."""
    out_levels, out_rows, out_kept = list(levels), [list(row) for row in rows], set(kept)
    for history in sorted({h for _, h, _ in reach}):
        j = bisect.bisect_right(out_levels, history) - 1
        weight = (history - out_levels[j]) / (out_levels[j + 1] - out_levels[j])
        row = [a + weight * (b - a) for a, b in zip(out_rows[j], out_rows[j + 1], strict=True)]
        out_kept = {(level + (level > j), i) for level, i in out_kept}
        for chunk, at, ratio in reach:
            if at == history:
                i = nodes.index(chunk)
                row[i] *= ratio
                out_kept.add((j + 1, i))
        out_levels.insert(j + 1, float(history))
        out_rows.insert(j + 1, row)
    return out_levels, out_rows, out_kept
