"""The least TTFT any chunking of one prompt can reach under the twin's cost model.

A prompt of N tokens is cut into chunks on a ``GRID_TOKENS`` grid; chunk i (C_i tokens
after H_i) takes t_i = ``surface.time_ms(C_i, H_i)`` for the whole model. With P
stages of equal layer share the chunks form a proportionate flow shop, whose makespan
without the engine's in-flight limit is exactly

    sum_i t_i / P + (P - 1) * max_i t_i / P

(every chunk crosses stage 0, the largest one crosses the other P - 1). For a cap T on
the largest chunk time, a dynamic programme over grid positions gives S(T), the least
sum of chunk times with every chunk within T (the slicing DP of TeraPipe, Li et al.
2021); the optimum is min over T of S(T)/P + (P - 1)*T/P. S only changes where T passes
a chunk time, so the search evaluates caps on a geometric grid and refines every
interval [a, b] whose lower bound S(b)/P + (P - 1)*a/P is below the best value found:
the result is certified to ``rel_tol`` (``Optimum.lower_ms`` <= true optimum <=
``Optimum.best_ms``).

The engine keeps at most P batches in flight: a batch cannot enter stage 0 before the
batch P places ahead has left the last stage, so a schedule whose chunk times fall can
take longer than the formula. ``Optimum.in_flight_ms`` is the best makespan under that
rule among the DP's optimal chunkings of every cap evaluated: a schedule the engine can
run, so the engine's own best lies between ``lower_ms`` and it (in_flight_bound.py certifies a
bound under the rule, closer to it).

With uneven stage shares (``--layers``) the formula does not hold; the DP's chunkings
are then evaluated on the real shares (exact flow-shop makespan, without and with the
in-flight rule) and ``best_ms`` is the best of them: an achievable schedule, not a
certified optimum; ``lower_ms`` is then s_max * S(inf), the bottleneck stage's share of
the least total work, a valid but loose bound.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .surface import Surface

GRID_TOKENS = 64
PATH_CAPS = 24  # chunkings rebuilt (for best_ms, in_flight_ms): those of the caps with the lowest bound


@dataclass(frozen=True)
class Optimum:
    prompt_tokens: int
    num_stages: int
    lower_ms: float  # certified lower bound of the least TTFT (equal shares), see the module doc
    best_ms: float  # least TTFT found (equal shares: within rel_tol of lower_ms)
    in_flight_ms: float  # best TTFT of those chunkings under the P-batches-in-flight rule
    chunks: tuple[int, ...]  # the chunking that reaches best_ms
    caps_evaluated: int
    certified: bool

    def to_json(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=2)
def grid_rows(surface: Surface, prompt_tokens: int, max_units: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """rows[s]: the times of chunks of 1, 2, ... grid units starting at grid position s, and their running maximum.

    A measured surface may dip where its medians did: the times are the surface's own (a
    dip is a chunk any policy may take), the running maximum finds how far a cap reaches.
    """
    units = -(-prompt_tokens // GRID_TOKENS)
    rows = []
    for start in range(units):
        history = start * GRID_TOKENS
        chunks = np.minimum(np.arange(1, min(units - start, max_units) + 1) * GRID_TOKENS, prompt_tokens - history)
        times = np.asarray(surface.time_ms_many(chunks, history), dtype=np.float64)
        rows.append((times, np.minimum.accumulate(times[::-1])[::-1]))
    return rows


def _least_sum(rows: Sequence[np.ndarray], cap_ms: float, with_path: bool) -> tuple[float, list[int]]:
    units = len(rows)
    best = np.full(units + 1, np.inf)
    best[0] = 0.0
    came_from = np.zeros(units + 1, dtype=np.int64) if with_path else None
    for start in range(units):
        here = best[start]
        if not math.isfinite(here):
            continue
        row, least_after = rows[start]
        # Beyond the last chunk within the cap, every chunk exceeds it: the least time from there on does.
        reach = int(np.searchsorted(least_after, cap_ms, side="right"))
        if reach == 0:
            continue
        candidate = here + np.where(row[:reach] <= cap_ms, row[:reach], np.inf)
        window = best[start + 1 : start + 1 + reach]
        if with_path:
            better = candidate < window
            window[better] = candidate[better]
            came_from[start + 1 : start + 1 + reach][better] = start
        else:
            np.minimum(window, candidate, out=window)
    if not with_path or not math.isfinite(best[units]):
        return float(best[units]), []
    cuts, position = [], units
    while position > 0:
        cuts.append(int(came_from[position]))
        position = cuts[-1]
    cuts.reverse()
    return float(best[units]), cuts


def flow_shop_ms(chunk_ms: Sequence[float], shares: Sequence[float], in_flight: bool) -> float:
    """Makespan of chunks through stages of the given shares, in order; optionally P batches in flight."""
    stages = len(shares)
    free = [0.0] * stages
    done: list[float] = []
    for index, total_ms in enumerate(chunk_ms):
        ready = done[index - stages] if in_flight and index >= stages else 0.0
        for stage, share in enumerate(shares):
            ready = max(ready, free[stage]) + total_ms * share
            free[stage] = ready
        done.append(ready)
    return done[-1] if done else 0.0


def optimum(
    surface: Surface,
    prompt_tokens: int,
    num_stages: int,
    shares: Sequence[float] | None = None,
    rel_tol: float = 1e-5,
    max_rounds: int = 60,
    base_chunk_tokens: int | None = None,
) -> Optimum:
    """The optimum of one prompt (see the module docstring); chunks at most ``base_chunk_tokens`` if given.

    The engine never schedules more than ``max_num_batched_tokens`` in a step, so that cap
    (rounded down to the grid) bounds every chunk any policy of that deployment can run.
    """
    if prompt_tokens <= 0 or num_stages < 1:
        raise ValueError(f"need prompt_tokens > 0 and num_stages >= 1, got {prompt_tokens}, {num_stages}")
    shares = tuple(shares) if shares else tuple(1.0 / num_stages for _ in range(num_stages))
    equal = max(shares) - min(shares) < 1e-12
    max_units = -(-prompt_tokens // GRID_TOKENS)
    if base_chunk_tokens is not None:
        max_units = max(1, min(max_units, int(base_chunk_tokens) // GRID_TOKENS))
    rows = grid_rows(surface, prompt_tokens, max_units)
    sums: dict[float, float] = {}

    def least(cap_ms: float) -> float:
        if cap_ms not in sums:
            sums[cap_ms] = _least_sum(rows, cap_ms, with_path=False)[0]
        return sums[cap_ms]

    def bound(cap_ms: float) -> float:
        return least(cap_ms) / num_stages + (num_stages - 1) * cap_ms / num_stages

    low_cap = float(min(row.min() for row, _ in rows))
    high_cap = float(max(row.max() for row, _ in rows))
    caps = list(np.geomspace(low_cap, high_cap, 48)) if high_cap > low_cap else [high_cap]
    best = min(bound(cap) for cap in caps)
    intervals = list(zip(caps[:-1], caps[1:], strict=True))
    closed = [best]  # lower bounds of the intervals no longer searched

    def interval_bound(a: float, b: float) -> float:
        return least(b) / num_stages + (num_stages - 1) * a / num_stages

    rounds = 0
    while intervals and rounds < max_rounds:
        rounds += 1
        kept = []
        for a, b in intervals:
            if interval_bound(a, b) < best * (1.0 - rel_tol):
                middle = math.sqrt(a * b)
                best = min(best, bound(middle))
                kept += [(a, middle), (middle, b)]
            else:
                closed.append(interval_bound(a, b))
        intervals = kept
    lower = min([*closed, *(interval_bound(a, b) for a, b in intervals)])
    # The chunkings behind the caps: the best one, and the engine's best under the in-flight rule.
    finite = sorted((cap for cap, total in sums.items() if math.isfinite(total)), key=bound)[:PATH_CAPS]
    best_ms, best_chunks, in_flight_best = math.inf, (), math.inf
    for cap in finite:
        _, cuts = _least_sum(rows, cap, with_path=True)
        edges = [*(c * GRID_TOKENS for c in cuts), prompt_tokens]
        chunks = tuple(b - a for a, b in zip(edges[:-1], edges[1:], strict=True))
        times = [surface.time_ms(c, h) for c, h in zip(chunks, edges[:-1], strict=True)]
        makespan = flow_shop_ms(times, shares, in_flight=False)
        if makespan < best_ms:
            best_ms, best_chunks = makespan, chunks
        in_flight_best = min(in_flight_best, flow_shop_ms(times, shares, in_flight=True))
    if not equal:
        lower = max(shares) * least(math.inf)
    return Optimum(
        prompt_tokens=prompt_tokens,
        num_stages=num_stages,
        lower_ms=float(lower),
        best_ms=float(best_ms),
        in_flight_ms=float(in_flight_best),
        chunks=best_chunks,
        caps_evaluated=len(sums),
        certified=equal and not intervals,
    )
