"""A certified lower bound of one prompt's least TTFT under the engine's limit of P batches in flight.

optimum.py's bound is exact for a pipeline without that limit. The engine keeps at most
P batches in flight: chunk k enters stage 0 only after chunk k - P has left the last
stage. Where chunk times fall (odd points, sweet spots), the chunkings that reach the
flow-shop bound stall on that rule, and the least TTFT the engine can reach lies a few
percent above the bound. This module certifies a higher bound under the rule, for equal
stage shares: chunk k of time t_k takes t_k / P on every stage, and

    C[k][s] = max(C[k][s - 1], C[k - 1][s]) + t_k / P,   C[k][-1] = C[k - P][P - 1].

A dynamic programme runs over grid positions (optimum.py's grid); its state is the
pipeline after the chunks so far: the stages' free times and the last P completion times,
2P numbers the next chunks' times depend on through max and plus only. Three things keep
it small, none of which can raise the bound above the true optimum:

- a canonical form: each number is raised to what the next chunk reaches anyway (a stage
  cannot start the next chunk before the stage above has run it), which changes no future;
- merging: states alike to within q are replaced by their componentwise least. Max-plus
  is monotone, so every future of the merged state is no later than the same future of
  each state merged; q doubles until at most ``max_states`` remain at a position;
- pruning against a threshold theta: a state is dropped when every completion of it is
  provably >= theta: its next chunk's entry time plus the least makespan of the tokens
  left on their own (from the other pass, below), or a flow-shop path from any stage.

The precedence graph is the same with chunks and stages reversed, so the least makespan of
a suffix on its own is a prefix of the reversed problem: passes alternate forward and
reversed, each pruning with the table of least prefix makespans the other one left (over
the states it kept: a chunking it dropped takes >= theta anyway). A pass that ends with no
completion below theta certifies that every chunking takes >= theta; otherwise its least
completion (below theta) is itself a valid bound. ``in_flight_lower_ms`` bisects theta
between the flow-shop bound and an achievable makespan: the highest theta certified, a
bound, not the optimum itself (merging may stop short of it). With max_states never
reached, states merge only on the first grid (``MERGE_SHARE`` of the least stage time):
the result is then the least makespan to within that grid per chunk (tests check it
against every chunking of small problems).
"""

from __future__ import annotations

import math

import numpy as np

from .optimum import GRID_TOKENS, grid_rows
from .surface import Surface

MERGE_SHARE = 1e-3  # first merging grid, of the least stage time; doubled at a position until max_states remain
MAX_STAGES = 128
_HASH = np.random.default_rng(0).integers(1, 2**62, size=2 * MAX_STAGES, dtype=np.int64)


def _flow_shop_tails(times: list[np.ndarray], units: int, num_stages: int, caps: int = 64) -> np.ndarray:
    """tails[x][s]: least time from stage s's start of the next chunk to the end, over the chunkings of [x, end).

    The path along stage s through every chunk left, down at the largest one: sum t / P +
    (P - 1 - s) * max t / P, bounded per interval of the largest time (optimum.py's caps).
    """
    low = min(float(row.min()) for row in times)
    high = max(float(row.max()) for row in times)
    grid = np.concatenate([np.geomspace(low, high, caps), [np.inf]])
    least = np.full((len(grid), units + 1), np.inf)
    least[:, units] = 0.0
    for x in range(units - 1, -1, -1):
        row = times[x]
        total = row[None, :] + least[:, x + 1 : x + 1 + len(row)]
        least[:, x] = np.where(row[None, :] <= grid[:, None], total, np.inf).min(axis=1)
    floor = np.concatenate([[0.0], grid[:-1]])  # largest time of an interval's chunkings: above the cap below
    floor[-1] = grid[-2]
    tails = np.zeros((units + 1, num_stages))
    for s in range(num_stages):
        tails[:, s] = np.min(least / num_stages + (num_stages - 1 - s) / num_stages * floor[:, None], axis=0)
    return tails


def _pass(times: list[np.ndarray], num_stages: int, theta: float, rest: np.ndarray, max_states: int):
    """One pass: (least completion found, below theta or inf; least prefix makespan per position)."""
    units, stages = len(times), num_stages
    tails = _flow_shop_tails(times, units, stages)
    tau_min = np.minimum.accumulate(np.array([row.min() for row in times])[::-1])[::-1] / stages
    grid = [MERGE_SHARE * float(tau_min[0])]  # the merging grid: the last one used, the next start

    def kept(state: np.ndarray, x: int) -> np.ndarray:
        """The states at position x that may still complete below theta."""
        entry = np.maximum(state[:, 0], state[:, stages])  # stage 0 free, and the batch P places ahead done
        bound = entry + max(tails[x, 0], rest[x])
        for s in range(1, stages):
            bound = np.maximum(bound, state[:, s] + tails[x, s])
        return state[bound < theta]

    def compact(parts: list[np.ndarray], x: int) -> np.ndarray:
        state = np.concatenate(parts)
        _canonical(state, stages, tau_min[x])
        return _merged(state, max_states, grid)

    prefix = np.full(units + 1, np.inf)
    prefix[0] = 0.0
    arriving: dict[int, list[np.ndarray]] = {0: [np.zeros((1, 2 * stages))]}
    final = math.inf
    for x in range(units):
        state = kept(np.concatenate(arriving.pop(x, [np.empty((0, 2 * stages))])), x)
        if not len(state):
            continue
        state = compact([state], x)
        row = times[x]
        for size in range(1, len(row) + 1):
            stage_ms = row[size - 1] / stages
            done = state[:, stages].copy()
            after = np.empty_like(state)
            for s in range(stages):
                done = np.maximum(done, state[:, s]) + stage_ms
                after[:, s] = done
            after[:, stages : 2 * stages - 1] = state[:, stages + 1 :]
            after[:, 2 * stages - 1] = done
            if x + size == units:
                final = min(final, float(done.min()))
                continue
            after = kept(after, x + size)  # pruned on arrival, and merged while waiting: memory stays bounded
            if not len(after):
                continue
            # the prefix's own makespan, before a canonical form raises it (a merged parent only lowers it)
            prefix[x + size] = min(prefix[x + size], float(after[:, stages - 1].min()))
            parts = arriving.setdefault(x + size, [])
            parts.append(after)
            if sum(len(part) for part in parts) > 4 * max_states:
                parts[:] = [compact(parts, x + size)]
    prefix[units] = final
    return (final if final < theta else math.inf), prefix


def _canonical(state: np.ndarray, stages: int, tau_min: float) -> None:
    """Raise each number to what the next chunk reaches anyway (in place): no future changes.

    Stage s's free time matters only against the next chunk's arrival from stage s - 1,
    which is at least entry + s * tau and the chunk's time after stage s - 1's free time;
    completion j places back gates chunk j ahead, which enters after C[k][0] + (j - 1) * tau.
    """
    entry = np.maximum(state[:, 0], state[:, stages])
    for s in range(1, stages):
        reached = np.maximum(state[:, s - 1], entry + (s - 1) * tau_min) + tau_min
        np.maximum(state[:, s], reached, out=state[:, s])
    for j in range(1, stages + 1):
        np.maximum(state[:, stages + j - 1], state[:, 0] + (j - 1) * tau_min, out=state[:, stages + j - 1])


def _merged(state: np.ndarray, max_states: int, grid: list[float]) -> np.ndarray:
    """States alike to within a grid step replaced by their componentwise least; the step doubles until at most
    max_states remain. ``grid`` holds the first step and the last one used (the next call starts a quarter of it)."""
    step = max(grid[0], grid[-1] / 4)
    weights = _HASH[: state.shape[1]]
    while True:
        keys = np.floor(state / step).astype(np.int64) @ weights  # a collision only merges more: still valid
        unique, groups = np.unique(keys, return_inverse=True)
        if len(unique) <= max_states:
            break
        step *= 2
    grid[1:] = [step]
    merged = np.full((len(unique), state.shape[1]), np.inf)
    np.minimum.at(merged, groups.ravel(), state)
    return merged


def _reversed(times: list[np.ndarray]) -> list[np.ndarray]:
    """The chunk times of the reversed problem: its position y ends the original chunk at units - y."""
    units = len(times)
    return [
        np.array([times[units - y - size][size - 1] for size in range(1, min(len(times[0]), units - y) + 1)])
        for y in range(units)
    ]


def _check(times: list[np.ndarray], num_stages: int, max_states: int) -> None:
    """A ValueError naming what the programme cannot take (a bound from it would be no bound)."""
    if not times:
        raise ValueError("no chunk times: the prompt needs at least one token")
    if not 1 <= num_stages <= MAX_STAGES:
        raise ValueError(f"num_stages {num_stages}: give 1 to {MAX_STAGES}")
    if max_states < 1:
        raise ValueError(f"max_states {max_states}: give at least 1")
    least = min(float(row.min()) for row in times)
    if not (least > 0 and all(np.isfinite(row).all() for row in times)):
        raise ValueError(f"chunk times must be finite and > 0 (least {least}): the surface gives no such time")


def certified_at(times: list[np.ndarray], num_stages: int, theta: float, max_states: int, max_passes: int) -> float:
    """A valid lower bound of the least makespan, theta itself when a pass certifies it."""
    _check(times, num_stages, max_states)
    backward = _reversed(times)
    rest = np.zeros(len(times) + 1)
    best = 0.0
    for index in range(max_passes):
        final, prefix = _pass(backward if index % 2 else times, num_stages, theta, rest, max_states)
        found = min(theta, final)
        if found >= theta:
            return theta
        if index and found <= best:
            return best
        best = max(best, found)
        rest = np.where(np.isfinite(prefix[::-1]), prefix[::-1], theta)
        rest[-1] = 0.0
    return best


def in_flight_lower_ms(
    surface: Surface,
    prompt_tokens: int,
    num_stages: int,
    lower_ms: float,
    upper_ms: float,
    base_chunk_tokens: int | None = None,
    rel_tol: float = 0.002,
    max_states: int = 1000,
    max_passes: int = 4,
) -> float:
    """The highest bound certified between ``lower_ms`` (a valid bound) and ``upper_ms`` (a makespan reached).

    Equal stage shares; chunks on optimum.py's grid, at most ``base_chunk_tokens``.
    """
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens {prompt_tokens}: give at least 1")
    if not 0 < lower_ms <= upper_ms < math.inf:
        raise ValueError(f"need 0 < lower_ms <= upper_ms < inf, got {lower_ms} and {upper_ms}")
    units = -(-prompt_tokens // GRID_TOKENS)
    max_units = units if base_chunk_tokens is None else max(1, min(units, int(base_chunk_tokens) // GRID_TOKENS))
    times = [row for row, _ in grid_rows(surface, prompt_tokens, max_units)]
    low, high = float(lower_ms), float(upper_ms)
    found = certified_at(times, num_stages, high, max_states, max_passes)
    if found >= high:
        return high
    low = max(low, found)
    while high > low * (1.0 + rel_tol):
        middle = math.sqrt(low * high)
        found = certified_at(times, num_stages, middle, max_states, max_passes)
        low = max(low, found)
        if found < middle:
            high = middle
    return low
