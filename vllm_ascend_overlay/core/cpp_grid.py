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


def fill_deepest(
    grid: list[list[float]], nodes: Sequence[int], kept: Iterable[tuple[int, int]] = ()
) -> list[list[float]]:
    """The grid [level][node] with its unmeasured (NaN) cells at the deepest level, the sizes too large to fit
    there (core/cpp_profile_plan.py): the time at the level above plus what the deepest interval adds, a line
    in the chunk size fitted (least squares) to what it adds to the sizes measured there from a sixteenth of
    the largest, but the ``kept`` (odd) cells; never less than nothing.

    History adds per step (the cache read) and per token of the chunk (attention to the cached tokens): a
    line in C, exact for t = f(C) + u(H) + C x g(H) whatever f, u and g are; fitted over many sizes, so one
    size's noise does not carry over (a flat surface's growth over an interval is within its noise)."""
    if len(grid) < 2 or all(t == t for t in grid[-1]):
        return grid
    kept = set(kept)
    deep = len(grid) - 1
    measured = [i for i, t in enumerate(grid[-1]) if t == t and not {(deep, i), (deep - 1, i)} & kept]
    upper = [i for i in measured if 16 * nodes[i] >= nodes[measured[-1]]] if measured else []
    xs, ys = [float(nodes[i]) for i in upper], [grid[-1][i] - grid[-2][i] for i in upper]
    slope, intercept = 0.0, 0.0
    if len(xs) >= 2:
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mean_x) ** 2 for x in xs
        )
        intercept = mean_y - slope * mean_x
    elif xs:
        slope = ys[0] / xs[0]
    deepest = [
        b + max(0.0, intercept + slope * c) if t != t else t for t, b, c in zip(grid[-1], grid[-2], nodes, strict=True)
    ]
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
