"""The profiled grid of CPP's latency model made ordered: time never falls as the chunk or the history
grows, but at the odd points a profile kept (core/cpp_latency_model.py, core/cpp_acceptance.py).

Pure Python: no numpy, no vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["KEPT_WEIGHT", "falls_outside", "fill_deepest", "isotonic", "monotone_grid"]


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Non-decreasing least-squares fit to ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight_b, count_b = blocks.pop()
            previous = blocks[-1]
            total = previous[1] + weight_b
            previous[0] = (previous[0] * previous[1] + mean * weight_b) / total
            previous[1] = total
            previous[2] += count_b
    out: list[float] = []
    for mean, _, count in blocks:
        out += [mean] * int(count)
    return out


def fill_deepest(grid: list[list[float]], levels: Sequence[float]) -> list[list[float]]:
    """The grid [level][node] with its unmeasured (NaN) cells at the deepest level, the sizes too large to fit
    there (core/cpp_profile_plan.py): each grows over the deepest interval as it did over the one before,
    times what the largest size measured there grew by over the two (how time bends in history deep down,
    measured); its own interval's slope continued when that size did not grow before."""
    if len(levels) < 3 or all(t == t for t in grid[-1]):
        return grid
    measured = max(i for i, t in enumerate(grid[-1]) if t == t)
    before = grid[-2][measured] - grid[-3][measured]
    bend = (grid[-1][measured] - grid[-2][measured]) / before if before > 0 else 0.0
    bend = bend if bend > 0 else (levels[-1] - levels[-2]) / (levels[-2] - levels[-3])
    deepest = [b + bend * (b - a) if t != t else t for t, a, b in zip(grid[-1], grid[-3], grid[-2], strict=True)]
    return [*grid[:-1], deepest]


KEPT_WEIGHT = 1e-9  # an odd point's weight in the pooling around it: it moves no other point


def monotone_grid(
    grid: list[list[float]], weights: list[list[float]], kept: Iterable[tuple[int, int]] = (), restore: bool = True
) -> list[list[float]]:
    """The grid [level][node] made non-decreasing along both axes, each by isotonic regression,
    but for the ``kept`` cells (level, node), which keep their values (``restore=False``: which get the
    ordered grid's value there, as if they had not been measured).

    Rows, then columns, then rows again are pooled; a last running maximum down the
    levels guarantees both orders exactly (the maximum of two non-decreasing rows is
    non-decreasing). A kept cell takes part with a negligible weight, so the grid around
    it is ordered as if it were not there, and gets its own value back at the end.
    """
    kept = set(kept)
    if kept:
        weights = [[KEPT_WEIGHT if (j, i) in kept else w for i, w in enumerate(row)] for j, row in enumerate(weights)]
    rows = [isotonic(row, w) for row, w in zip(grid, weights, strict=True)]
    columns = [isotonic([row[i] for row in rows], [w[i] for w in weights]) for i in range(len(rows[0]))]
    rows = [[columns[i][j] for i in range(len(columns))] for j in range(len(rows))]
    rows = [isotonic(row, w) for row, w in zip(rows, weights, strict=True)]
    for j in range(1, len(rows)):
        rows[j] = [max(a, b) for a, b in zip(rows[j], rows[j - 1], strict=True)]
    for j, i in kept if restore else ():
        rows[j][i] = grid[j][i]
    return rows


def falls_outside(rows: Sequence[Sequence[float]], kept: set[tuple[int, int]]) -> bool:
    """Whether a time falls along a row or a column between two cells neither of which is kept."""
    for j, row in enumerate(rows):
        for i, value in enumerate(row):
            if i and value < row[i - 1] and not {(j, i), (j, i - 1)} & kept:
                return True
            if j and value < rows[j - 1][i] and not {(j, i), (j - 1, i)} & kept:
                return True
    return False
