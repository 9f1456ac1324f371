"""The latency model of dynamic chunked pipeline parallelism (CPP): the measured step time.

``t(C, H)`` is the time of a step that runs one request's chunk of C new tokens after H
tokens of history (the slowest pipeline stage's time). The model is the profiled table
itself, on a grid of chunk sizes (nodes) by history lengths (levels): each point the
median of its repeats, made non-decreasing in C and in H by isotonic regression (a fall
within the noise is averaged away, not believed), except at *odd points*: a fall that
repeated (core/cpp_acceptance.py says when) is a fact about the device, a size that hits a
better kernel or a worse one, and its points keep their medians. Between the measured points:

- in C, linear in log C and log t: exact for any power law t ~ C^k, so a fixed cost
  (k = 0), linear work (k = 1) and attention among the chunk's own tokens (k = 2) are
  followed between nodes, and so is whatever mix a device has, without a functional
  form; bends (a cache that overflows, a kernel switch, a knee) are kept where measured;
- in H, linear between levels: history enters a step through reading and attending to
  H cached tokens, linear in H at a fixed chunk.

A step (``steps``): where the profile shows time jumping between two sizes far beyond the
growth on either side (a wave of tiles more on the device's cores, a kernel switch), a
chunk past the lower size costs the upper size's time, not a share of the jump: nothing
between the two was measured, and the jump may come right after the lower one. Beside an
odd point the same reading holds the other way: a size between it and a neighbouring size
costs the dearer of the two (nothing measured says the odd point's speed reaches past it),
and the chunk for a time is the largest that fits, so a fast larger size is taken over a
slower smaller one (it dominates it: a prompt with the tokens can always take it). How far
an odd point reaches in history is measured between levels (core/cpp_odd_reach.py).

Beyond the table: below the smallest chunk, its first segment's law with the exponent
clamped to [0, 1]; above the largest chunk, the last segment's law with the exponent at
least 1 (never cheaper per token than measured); beyond the deepest level, the last two
levels' slope per size, never below 0 and made non-decreasing in C. The sizes too large to
fit the deepest level (core/cpp_profile_plan.py) take there what it adds to those measured.

A step of several requests costs the step's fixed cost once plus each request's own
cost: ``batch_time_ms = fixed_ms + sum_i request_ms(C_i, H_i)`` with ``request_ms =
time_ms - fixed_ms``. ``fixed_ms`` is the time of an empty step: the smallest chunk
without history, extrapolated linearly to C = 0 (the profile's C = 1: one token alone).
Each question has a scalar form (for the per-step budget) and a vectorised one (for the
planner) that compute the same numbers (``time_ms``/``time_ms_many``, ``chunk_for_time``/
``chunk_for_time_many``: the largest chunk whose step fits a time). No vLLM, torch or I/O.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from vllm_ascend.core.cpp_grid import KEPT_WEIGHT, falls_outside, fill_deepest, monotone_grid
from vllm_ascend.core.cpp_odd_reach import with_reach
from vllm_ascend.core.cpp_samples import FitError, Point

__all__ = ["FitError", "LatencyModel", "batch_features", "monotone_grid"]

MIN_NODES = 3  # chunk sizes a level needs for the interpolation to follow a bend


def batch_features(pairs: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """A step's (chunk_tokens, history_tokens) pairs as a hashable record (online calibration's row)."""
    return tuple((int(chunk), int(history)) for chunk, history in pairs)


def _index_within(index: np.ndarray, highest: int) -> np.ndarray:
    """Indices held to [0, highest] (np.clip's checks cost more than the clip on small arrays)."""
    return np.minimum(np.maximum(index, 0), highest)


@dataclass(frozen=True)
class LatencyModel:
    """The measured step time t(C, H) on a grid (see the module docstring)."""

    chunk_tokens: tuple[int, ...]  # nodes, increasing, >= 1
    history_tokens: tuple[int, ...]  # levels, increasing, the first is 0
    step_ms: tuple[tuple[float, ...], ...]  # [level][node], non-decreasing along both
    fixed_ms: float  # an empty step's time
    scatter: float = 0.0  # relative scatter between repeats of one profiled point
    num_points: int = 0
    steps: tuple[int, ...] = ()  # segments i (nodes[i] to nodes[i + 1]) whose time steps right after nodes[i]
    # (chunk_tokens, history_tokens) of grid points whose time stands though a neighbour falls below it
    odd_points: tuple[tuple[int, int], ...] = ()
    # (chunk_tokens, history_tokens, time over the levels' line there) of sizes measured between levels
    reach: tuple[tuple[int, int, float], ...] = ()
    _scalar: tuple = field(init=False, repr=False, compare=False)
    _vector: tuple = field(init=False, repr=False, compare=False)
    _step_mask: np.ndarray | None = field(init=False, repr=False, compare=False)
    _odd_mask: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes, levels, rows = self.chunk_tokens, self.history_tokens, self.step_ms
        if len(nodes) < 2 or list(nodes) != sorted(set(nodes)) or nodes[0] < 1:
            raise FitError(f"chunk sizes must be >= 2 increasing whole numbers >= 1, got {list(nodes)[:8]}")
        if not levels or list(levels) != sorted(set(levels)) or levels[0] != 0:
            raise FitError(f"history levels must be increasing and start at 0, got {list(levels)[:8]}")
        if len(rows) != len(levels) or any(len(row) != len(nodes) for row in rows):
            raise FitError("step_ms must hold one time per (history level, chunk size)")
        if not all(math.isfinite(t) and t > 0 for row in rows for t in row):
            raise FitError("step times must be finite and > 0")
        cells = {(c, h): (j, i) for j, h in enumerate(levels) for i, c in enumerate(nodes)}
        if list(self.odd_points) != sorted(set(self.odd_points)) or not set(self.odd_points) <= set(cells):
            raise FitError(f"odd points must be sorted grid points (chunk, history), got {list(self.odd_points)[:4]}")
        kept = {cells[point] for point in self.odd_points}
        if falls_outside(rows, kept):
            raise FitError("step times must not fall with chunk size or history (use LatencyModel.from_points)")
        if not (math.isfinite(self.fixed_ms) and 0 <= self.fixed_ms <= rows[0][0]):
            raise FitError(f"fixed_ms {self.fixed_ms!r} must be in [0, the smallest step's time]")
        if list(self.steps) != sorted(set(self.steps)) or any(not 0 <= i < len(nodes) - 1 for i in self.steps):
            raise FitError(f"steps must be increasing segment indices below {len(nodes) - 1}, got {list(self.steps)}")
        mask = np.zeros(len(nodes) - 1, dtype=bool)
        mask[list(self.steps)] = True
        object.__setattr__(self, "_step_mask", mask if self.steps else None)
        if any(c not in nodes or not 0 < h < levels[-1] or h in levels or not r > 0 for c, h, r in self.reach):
            raise FitError(f"reach must be profiled sizes between levels, got {list(self.reach)[:4]}")
        odd = np.zeros((len(levels), len(nodes)), dtype=bool)
        odd[tuple(np.array(sorted(kept), dtype=int).reshape(-1, 2).T)] = True
        if len(levels) == 1:  # one level: no history dependence; a copy makes the blend uniform
            levels, rows, kept = (0, max(1, nodes[-1])), (rows[0], rows[0]), kept | {(1, i) for _, i in kept}
        # Beyond the deepest level: a virtual level one spacing further holds each size's last slope, never
        # below 0 and non-decreasing in C. Nothing says an odd point lasts past the deepest level: it fades.
        trend = np.array(monotone_grid([list(r) for r in rows], [[1.0] * len(nodes)] * len(rows), kept, False))
        steps = np.maximum.accumulate(np.maximum(trend[-1] - trend[-2], 0.0))
        beyond = tuple((np.where(odd[-1], trend[-1], np.maximum(rows[-1], trend[-1])) + steps).tolist())
        rows = (*rows, beyond)
        levels = (*levels, 2 * levels[-1] - levels[-2])
        log_nodes = [math.log(c) for c in nodes]
        levels, rows, kept = with_reach(levels, rows, kept, nodes, self.reach)  # (levels between levels)
        odd = np.zeros((len(levels), len(nodes)), dtype=bool)
        odd[tuple(np.array(sorted(kept), dtype=int).reshape(-1, 2).T)] = True
        object.__setattr__(self, "_odd_mask", odd[:, :-1] | odd[:, 1:] if kept else None)  # [level][segment]
        scalar_rows = [list(r) for r in rows]
        object.__setattr__(self, "_scalar", (list(map(float, nodes)), log_nodes, list(map(float, levels)), scalar_rows))
        vector = (np.array(nodes, dtype=np.float64), np.array(log_nodes), np.array(levels, dtype=np.float64))
        object.__setattr__(self, "_vector", (*vector, np.array(rows, dtype=np.float64)))

    @classmethod
    def from_points(
        cls, points: Sequence[Point], scatter: float = 0.0, odd: Iterable[tuple[int, int]] = ()
    ) -> LatencyModel:
        """The model of profiled points that form a grid (every size at every level, but the sizes over half the
        largest at the deepest); the ``odd`` points ((chunk, history) on the grid) keep their medians."""
        nodes = sorted({p.chunk_tokens for p in points})
        levels = sorted({p.history_tokens for p in points})
        by_key = {(p.chunk_tokens, p.history_tokens): p for p in points}
        missing = [(c, h) for h in levels for c in nodes if (c, h) not in by_key]
        unfit = len(levels) >= 3 and all(h == levels[-1] and 2 * c > nodes[-1] for c, h in missing)  # fill_deepest
        if missing and not unfit:
            raise FitError(
                f"the profile is not a grid: {len(missing)} of {len(nodes) * len(levels)} (chunk, history) points "
                f"missing, e.g. {missing[0]}"
            )
        if len(nodes) < MIN_NODES:
            raise FitError(f"only {len(nodes)} chunk sizes profiled; the model needs >= {MIN_NODES}")
        if levels[0] != 0:
            raise FitError("the profile has no chunk without history (history_tokens = 0)")
        grid = [[by_key[(c, h)].median_ms if (c, h) in by_key else math.nan for c in nodes] for h in levels]
        weights = [[float(by_key[(c, h)].repeats) if (c, h) in by_key else KEPT_WEIGHT for c in nodes] for h in levels]
        odd = sorted({(int(c), int(h)) for c, h in odd if (c, h) in by_key})
        cells = [(levels.index(h), nodes.index(c)) for c, h in odd]
        rows = monotone_grid(fill_deepest(grid, nodes, cells), weights, cells)
        first, second = rows[0][0], rows[0][1]
        slope = (second - first) / (nodes[1] - nodes[0])
        fixed_ms = min(first, max(0.0, first - nodes[0] * slope))
        return cls(
            tuple(nodes),
            tuple(levels),
            tuple(tuple(row) for row in rows),
            fixed_ms,
            scatter=float(scatter),
            num_points=len(points),
            odd_points=tuple(odd),
        )

    # ---------------------------------------------------------------- scalar questions
    def _level(self, history_tokens: float) -> tuple[list[float], list[float], float, int]:
        """The two rows around a history, the weight of the second (> 1 only beyond the last), the first's index."""
        _, _, levels, rows = self._scalar
        # Beyond the last measured level the pair is that level and the virtual one after it.
        j = min(max(bisect.bisect_right(levels, history_tokens) - 1, 0), len(levels) - 2)
        weight = max(0.0, (history_tokens - levels[j]) / (levels[j + 1] - levels[j]))
        return rows[j], rows[j + 1], weight, j

    def _beside_odd(self, level: int, segment: int) -> bool:
        """Whether a segment of the rows blended from ``level`` and the next has an odd point at an end."""
        mask = self._odd_mask
        return mask is not None and bool(mask[level, segment] or mask[level + 1, segment])

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        """Time of a step that runs only this chunk."""
        nodes, log_nodes, _, _ = self._scalar
        low, high, weight, j = self._level(history_tokens)
        last = len(nodes) - 1
        i = min(max(bisect.bisect_right(nodes, chunk_tokens) - 1, 0), last - 1)
        a = low[i] + weight * (high[i] - low[i])
        b = low[i + 1] + weight * (high[i + 1] - low[i + 1])
        if nodes[i] < chunk_tokens < nodes[i + 1] and self._beside_odd(j, i):
            return max(a, b)  # beside an odd point: the dearer end
        if self.steps and nodes[i] < chunk_tokens <= nodes[i + 1] and i in self.steps:
            return b  # past a step: the upper size's time
        exponent = math.log(b / a) / (log_nodes[i + 1] - log_nodes[i])
        if chunk_tokens < nodes[0]:
            exponent = min(exponent, 1.0)
        elif chunk_tokens > nodes[last]:
            a, i, exponent = b, last, max(exponent, 1.0)
        if chunk_tokens <= 0:
            return a * (0.0 if exponent > 0 else 1.0)
        return a * math.exp(exponent * (math.log(chunk_tokens) - log_nodes[i]))

    def chunk_for_time(self, history_tokens: float, time_ms: float, up_to: float = math.inf) -> float:
        """The largest real C >= 0, at most ``up_to``, with time_ms(C, H) <= time_ms (0 when not even the
        smallest fits)."""
        nodes, log_nodes, _, _ = self._scalar
        low, high, weight, j = self._level(history_tokens)
        last = len(nodes) - 1
        if self.odd_points:  # rows may fall: the largest node that fits, below up_to
            if up_to < math.inf and self.time_ms(up_to, history_tokens) <= time_ms:
                return up_to
            fitting = (
                k for k in range(last, -1, -1) if nodes[k] < up_to and low[k] + weight * (high[k] - low[k]) <= time_ms
            )
            k = next(fitting, -1)
        else:
            lo_k, hi_k = -1, last + 1  # largest k with blended value <= time_ms, by bisection
            while hi_k - lo_k > 1:
                middle = (lo_k + hi_k) // 2
                if low[middle] + weight * (high[middle] - low[middle]) <= time_ms:
                    lo_k = middle
                else:
                    hi_k = middle
            k = lo_k
        if 0 <= k < last and (k in self.steps or self._beside_odd(j, k)):
            return min(nodes[k], up_to)  # anything larger pays the step, or the dearer end beside an odd point
        i = min(max(k, 0), last - 1)
        a = low[i] + weight * (high[i] - low[i])
        b = low[i + 1] + weight * (high[i + 1] - low[i + 1])
        exponent = math.log(b / a) / (log_nodes[i + 1] - log_nodes[i])
        if k < 0:
            exponent = min(exponent, 1.0)
            if exponent <= 0 or not time_ms > 0:
                return 0.0
        elif k == last:
            a, i, exponent = b, last, max(exponent, 1.0)
        return min(math.exp(log_nodes[i] + (math.log(time_ms) - math.log(a)) / exponent), up_to)

    def request_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        """One request's own cost in a step: its step time without the fixed cost."""
        return max(0.0, self.time_ms(chunk_tokens, history_tokens) - self.fixed_ms)

    def chunk_for_request_ms(self, history_tokens: float, budget_ms: float, up_to: float = math.inf) -> float:
        """The largest real C, at most ``up_to``, with request_ms(C, H) <= budget_ms."""
        return self.chunk_for_time(history_tokens, self.fixed_ms + budget_ms, up_to)

    def batch_time_ms(self, pairs: Iterable[tuple[int, int]]) -> float:
        """The fixed cost once plus each (chunk_tokens, history_tokens) pair's own cost; [] costs fixed_ms."""
        return self.fixed_ms + sum(self.request_ms(c, h) for c, h in pairs)

    def decode_ms(self, history_tokens: float) -> float:
        """One decode token's own cost (a 1-token chunk) at this history."""
        return self.request_ms(1.0, history_tokens)

    # ---------------------------------------------------------------- vectorised questions
    def _rows_at(self, history_tokens: np.ndarray) -> np.ndarray:
        _, _, levels, rows = self._vector
        j = _index_within(np.searchsorted(levels, history_tokens, side="right") - 1, len(levels) - 2)
        weight = np.maximum(0.0, (history_tokens - levels[j]) / (levels[j + 1] - levels[j]))
        return rows[j] + weight[..., None] * (rows[j + 1] - rows[j])

    def time_ms_many(self, chunk_tokens: np.ndarray, history_tokens: np.ndarray) -> np.ndarray:
        """``time_ms`` of arrays (broadcast together; the level and the node looked up on each array as given,
        before broadcasting: a planner's histories do not vary with its targets, so they are looked up once)."""
        nodes, log_nodes, levels, rows = self._vector
        chunks = np.asarray(chunk_tokens, dtype=np.float64)
        histories = np.asarray(history_tokens, dtype=np.float64)
        j = _index_within(np.searchsorted(levels, histories, side="right") - 1, len(levels) - 2)
        weight = (histories - levels[j]) / (levels[j + 1] - levels[j])
        last = len(nodes) - 1
        i = _index_within(np.searchsorted(nodes, chunks, side="right") - 1, last - 1)
        flat, width = rows.ravel(), len(nodes)  # one flat index, its neighbours by offsets
        corner = j * width + i
        a = flat.take(corner)
        a += weight * (flat.take(corner + width) - a)
        b = flat.take(corner + 1)
        b += weight * (flat.take(corner + (width + 1)) - b)
        exponent = np.log(b / a) / (log_nodes[i + 1] - log_nodes[i])
        base_ms, base_log = a, log_nodes[i]
        if chunks.size and (chunks.min() < nodes[0] or chunks.max() > nodes[last]):
            below, above = chunks < nodes[0], chunks > nodes[last]
            exponent = np.where(below, np.minimum(exponent, 1.0), np.where(above, np.maximum(exponent, 1.0), exponent))
            base_ms = np.where(above, b, a)
            base_log = np.where(above, log_nodes[last], base_log)
        with np.errstate(divide="ignore"):
            times = base_ms * np.exp(exponent * (np.log(np.maximum(chunks, 0.0)) - base_log))
        if self._step_mask is not None:
            times = np.where(self._step_mask[i] & (chunks > nodes[i]) & (chunks <= nodes[i + 1]), b, times)
        if self._odd_mask is not None:
            beside = self._odd_mask[j, i] | self._odd_mask[j + 1, i]
            times = np.where(beside & (chunks > nodes[i]) & (chunks < nodes[i + 1]), np.maximum(a, b), times)
        return times

    def chunk_for_time_many(
        self, history_tokens: np.ndarray, time_ms: np.ndarray, up_to: np.ndarray | None = None
    ) -> np.ndarray:
        """``chunk_for_time`` of arrays (broadcast together; the rows are blended once per history)."""
        nodes, log_nodes, levels, _ = self._vector
        histories = np.asarray(history_tokens, dtype=np.float64)
        times = np.asarray(time_ms, dtype=np.float64)
        rows = self._rows_at(histories)
        last = len(nodes) - 1
        if self._odd_mask is None:
            k = np.count_nonzero(rows <= times[..., None], axis=-1) - 1
        else:  # rows may fall: the largest node that fits (below up_to)
            fits = rows <= times[..., None]
            if up_to is not None:
                fits = fits & (nodes < np.asarray(up_to, dtype=np.float64)[..., None])
            k = np.where(fits.any(axis=-1), last - np.argmax(fits[..., ::-1], axis=-1), -1)
        i = _index_within(k, last - 1)
        # Each element's row of the blended table, by a flat index (rows are blended per history only).
        row_starts = np.arange(0, rows.size, len(nodes)).reshape(histories.shape)
        corner = row_starts + i
        flat = rows.ravel()
        a, b = flat.take(corner), flat.take(corner + 1)
        exponent = np.log(b / a) / (log_nodes[i + 1] - log_nodes[i])
        below, above = k < 0, k == last
        exponent = np.where(below, np.minimum(exponent, 1.0), np.where(above, np.maximum(exponent, 1.0), exponent))
        base_ms = np.where(above, b, a)
        base_log = np.where(above, log_nodes[last], log_nodes[i])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            chunks = np.exp(base_log + (np.log(times) - np.log(base_ms)) / exponent)
        if self._step_mask is not None:
            chunks = np.where((k >= 0) & (k < last) & self._step_mask[i], nodes[i], chunks)
        if self._odd_mask is not None:  # beside an odd point the dearer end: no further than the node
            j = _index_within(np.searchsorted(levels, histories, side="right") - 1, len(levels) - 2)
            beside = (self._odd_mask[j] | self._odd_mask[j + 1]).ravel()
            starts = np.arange(0, beside.size, last).reshape(histories.shape)
            chunks = np.where((k >= 0) & (k < last) & beside.take(starts + i), nodes[i], chunks)
        chunks = np.where(below & ((exponent <= 0) | ~(times > 0)), 0.0, chunks)
        if up_to is None:
            return chunks
        if self._odd_mask is not None:  # up_to itself, when it fits (a node before it may not)
            chunks = np.where(self.time_ms_many(up_to, histories) <= times, np.inf, chunks)
        return np.minimum(chunks, up_to)

    def request_ms_many(self, chunk_tokens: np.ndarray, history_tokens: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, self.time_ms_many(chunk_tokens, history_tokens) - self.fixed_ms)

    def decode_ms_many(self, history_tokens: np.ndarray) -> np.ndarray:
        """``decode_ms`` of many histories: with C = 1 profiled, one linear interpolation down the levels."""
        nodes, _, levels, rows = self._vector
        histories = np.asarray(history_tokens, dtype=np.float64)
        if nodes[0] != 1.0:
            return self.request_ms_many(np.ones_like(histories), histories)
        column = rows[:, 0]
        slope = max(0.0, (column[-1] - column[-2]) / (levels[-1] - levels[-2]))
        inside = np.interp(histories, levels, column)
        times = np.where(histories > levels[-1], column[-1] + slope * (histories - levels[-1]), inside)
        return np.maximum(0.0, times - self.fixed_ms)

    def step_lowers(self) -> list[int]:
        """The sizes right before each step: a chunk one token larger costs the next size's time."""
        return [self.chunk_tokens[i] for i in self.steps]

    # ---------------------------------------------------------------- description
    @property
    def max_history_tokens(self) -> int:
        """The deepest history measured."""
        return self.history_tokens[-1]

    def describe(self) -> str:
        """One line for the log: the grid, its range and its noise."""
        nodes, levels = self.chunk_tokens, self.history_tokens
        return (
            f"{len(nodes)} chunk sizes {nodes[0]}..{nodes[-1]} x {len(levels)} history lengths 0..{levels[-1]}, "
            f"{self.time_ms(nodes[-1], 0):.4g} ms for {nodes[-1]} tokens without history, "
            f"fixed cost {self.fixed_ms:.4g} ms, scatter {100 * self.scatter:.1f}%"
            + "".join(f", a step after {nodes[i]} tokens" for i in self.steps)
            + (f", {len(self.odd_points)} odd point(s) kept" if self.odd_points else "")
        )

    def to_dict(self) -> dict:
        keys = ("chunk_tokens", "history_tokens", "step_ms", "fixed_ms", "scatter", "num_points", "steps")
        data = {key: list(v) if isinstance(v := getattr(self, key), tuple) else v for key in keys}
        odd, reach = [list(point) for point in self.odd_points], [list(point) for point in self.reach]
        return {**data, "step_ms": [list(row) for row in self.step_ms], "odd_points": odd, "reach": reach}

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyModel:
        try:
            return cls(
                tuple(int(c) for c in data["chunk_tokens"]),
                tuple(int(h) for h in data["history_tokens"]),
                tuple(tuple(float(t) for t in row) for row in data["step_ms"]),
                float(data["fixed_ms"]),
                scatter=float(data.get("scatter", 0.0)),
                num_points=int(data.get("num_points", 0)),
                steps=tuple(int(i) for i in data.get("steps", ())),
                odd_points=tuple((int(c), int(h)) for c, h in data.get("odd_points", ())),
                reach=tuple((int(c), int(h), float(r)) for c, h, r in data.get("reach", ())),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise FitError(f"not a latency model: {error}") from None
