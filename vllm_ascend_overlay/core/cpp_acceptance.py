"""Whether a CPP profile may schedule: refuse broken data, judge stability by the decisions.

``judge`` is the one acceptance rule, for a fresh profile and a cached one alike. A
profile is the samples of ``core/cpp_samples.py`` (each admitted by ``check_sample``;
one that is not is dropped and counted). It is judged by what it is for, never by how
well one functional form fits it:

1. **Broken data** is refused: too few valid samples to form the grid of chunk sizes by
   history lengths the model needs (a sample that is not a measurement is dropped; a
   worker failing ends the profile before it is judged). A time that falls as the chunk
   (or the history) grows is never broken data (core/cpp_falls.py): one beyond the noise
   is measured again (``Verdict.remeasure``), and one that repeats is a fact about the
   device that the model keeps (odd points); one that does not is noise, which the model
   averages away.
2. **Stability** is judged on the decisions: the repeats are split into rounds (the
   k-th run of every point), each round's model plans the *reference prompt* (one
   prompt filling the history the scheduler will see, at this pipeline depth), and each
   round's schedule is timed on the model of all rounds. If a round's schedule is slower
   than the full model's own by more than ``UNSTABLE_LOSS``, the profile is too noisy to
   decide well, and one more round is measured. Noise alone never refuses a profile:
   after the last round the model of every round's median is the best estimate there is.
   At most ``MAX_ROUNDS`` rounds are planned (the first ones): no fresh profile has more,
   and a cached file holding more is refused before it is judged (core/cpp_profiling.py).
3. **Tiles**: a device that works on tiles of rows (64 to 512 tokens) costs as much for
   one token past a tile boundary as for a whole tile more. The profile's tile probe
   measures pairs of sizes S and S + 1 at each candidate tile's first boundary (S = the
   tile, where a tile's step is the largest share of the chunk's time), several times
   each: a jump beyond ``FALL_SIGMAS`` standard errors of the two medians (from the
   scatter and their repeats), and beyond ``STEP_TOKENS`` tokens at the steeper slope
   measured to the sizes either side, makes the smallest candidate that steps there the granule (a
   larger tile's device does not step at a smaller one's first boundary, and a smaller
   tile's steps at a larger one's by only its own tile, too little to ask for), and
   chunks are then whole multiples of it (core/cpp_chunk_rule.py). Larger steps (one more
   wave of tiles over the device's cores, a kernel switch) show in the grid itself: a
   segment that jumps where the growth on either side is flat (``detect_steps``) is a step
   of the model, and a chunk past its lower size costs its upper size's time; sizes
   measured inside the segment (the profile bisects it) move the lower size up to the
   largest of them before the jump (``locate_steps``).
4. **The fallback is never the worst choice**: when a profile is broken, the scheduler
   runs the fixed chunk that is best for the reference prompt on what the valid part
   measured (``best_fixed_chunk`` on the largest grid of sizes and histories it holds),
   or, if that is no grid either, upstream's behaviour (fixed chunks of
   ``max_num_batched_tokens``).

Pure Python and numpy: no vLLM, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_falls import (
    FALL_SIGMAS,
    find_falls,
    median_variance,
    odd_points,
    remeasure_runs,
    runs_by_point,
)
from vllm_ascend.core.cpp_latency_model import MIN_NODES, LatencyModel
from vllm_ascend.core.cpp_odd_reach import reach_of
from vllm_ascend.core.cpp_planner import plan_target
from vllm_ascend.core.cpp_samples import FitError, Point, admitted, group_points
from vllm_ascend.core.cpp_step_budget import StepBudget

__all__ = [
    "Verdict",
    "best_fixed_chunk",
    "flat_side",
    "judge",
    "locate_steps",
    "reference_prompt_tokens",
    "schedule_ttft_ms",
    "untried_tile",
]

UNSTABLE_LOSS = 0.03  # a round's schedule may cost this much more than the full model's own
TILE_CANDIDATES = (64, 128, 256, 512)  # tile sizes the profile probes
STEP_TOKENS = 12  # a tile step costs more than this many tokens' smooth share of the time
STEP_EXCESS = 0.30  # a segment of the ladder is a step when it grows 30% beyond its neighbours' laws ...
STEP_FLATNESS = 0.25  # ... and they grow at most a quarter as fast as it (flat on either side of the jump)
LOCATE_TOKENS = 64  # a step's jump is placed to within this many tokens (the optimum's grid)
PAIR_SHARE = 0.5  # two sizes that close hold a jump when at least half the segment's growth lies between them
MAX_ROUNDS = 32  # rounds planned at most: 2 rounds of the largest profile_repeats (16) make no more


@dataclass(frozen=True)
class Verdict:
    """What a profile gives the scheduler.

    ``model``: schedule with it (None: no model). ``fixed_chunk_tokens``: without a
    model, the fixed chunk to run (None: upstream's behaviour). ``noisy``: measuring
    more rounds may change the verdict. ``reason``: why, for the one log line.
    """

    model: LatencyModel | None
    fixed_chunk_tokens: int | None
    noisy: bool
    reason: str
    granule_tokens: int = 1
    # (chunk_tokens, history_tokens) runs that would tell whether a fall repeats (core/cpp_falls.py)
    remeasure: tuple[tuple[int, int], ...] = ()


def _fallback_chunk(points: Sequence[Point], limits: ChunkLimits, num_stages: int, max_history: int) -> int | None:
    """The best fixed chunk on the largest grid the valid points hold: the sizes measured without history
    and at as many of the other histories as still leave ``MIN_NODES`` sizes measured at all of them."""
    sizes: dict[int, set[int]] = {}
    for p in points:
        sizes.setdefault(p.history_tokens, set()).add(p.chunk_tokens)
    if 0 not in sizes:
        return None
    if len(sizes) >= 3:
        above, deepest = sorted(sizes)[-2:]
        sizes[deepest] = sizes[deepest] | _unfit_deepest(sizes[deepest], sizes[above])
    levels, common = [0], sizes[0]
    for history in sorted(sizes, key=lambda h: (-len(sizes[h]), h)):
        if history and len(common & sizes[history]) >= MIN_NODES:
            levels, common = [*levels, history], common & sizes[history]
    kept = [p for p in points if p.history_tokens in levels and p.chunk_tokens in common]
    try:
        rule = ChunkRule(LatencyModel.from_points(kept), limits, num_stages)
    except FitError:
        return None
    return best_fixed_chunk(rule, reference_prompt_tokens(rule, max_history))


def _unfit_deepest(at_deepest: set[int], above: set[int]) -> set[int]:
    """The sizes measured at the level above the deepest that count as measured at the deepest: those over half
    the largest, which do not fit there (core/cpp_profile_plan.py), when ``MIN_NODES`` sizes up to half were."""
    largest = max(above, default=0)
    enough = len({c for c in at_deepest if 2 * c <= largest}) >= MIN_NODES
    return {c for c in above if 2 * c > largest} if enough else set()


def grid_part(points: Sequence[Point]) -> list[Point]:
    """The points whose chunk size was measured at every history length of the grid, the lengths its smallest
    size was measured at (not the probe's extra sizes, nor the runs between lengths, core/cpp_odd_reach.py),
    or at every one but the deepest when it does not fit there (``_unfit_deepest``)."""
    smallest = min((p.chunk_tokens for p in points), default=0)
    histories = {p.history_tokens for p in points if p.chunk_tokens == smallest}
    sizes: dict[int, set[int]] = {}
    for p in points:
        sizes.setdefault(p.chunk_tokens, set()).add(p.history_tokens)
    full = {c for c, measured in sizes.items() if measured >= histories}
    if len(histories) >= 3:
        full |= _unfit_deepest(full, {c for c, measured in sizes.items() if measured >= histories - {max(histories)}})
    return [p for p in points if p.history_tokens in histories and p.chunk_tokens in full]


def detect_granule(points: Sequence[Point], scatter: float) -> int:
    """The tile the profile's probe saw time step at (1: none); see the module docstring."""
    without_history = {p.chunk_tokens: p for p in points if p.history_tokens == 0}
    for tile in sorted(TILE_CANDIDATES):
        boundaries = [c for c in sorted(without_history) if c % tile == 0 and (c // tile) % 2 == 1]
        boundaries = [c for c in boundaries if c + 1 in without_history]
        if boundaries and _jumps_after(without_history, boundaries[0], scatter):
            return tile
    # A step of the grid right after a smaller size than the probe tries is that size's tile when
    # time jumps one token past it and one token past twice it (the profile measures both there).
    for tile in sorted(c for c in without_history if untried_tile(c)):
        pairs = [(b, b + 1) for b in (tile, 2 * tile)]
        if all(b in without_history and past in without_history for b, past in pairs):
            if all(_jumps_after(without_history, b, scatter) for b, _ in pairs):
                return tile
    return 1


def untried_tile(size: int) -> bool:
    """Whether ``size`` could be a tile the probe does not try: smaller than its largest, not one of them."""
    return size < max(TILE_CANDIDATES) and size not in TILE_CANDIDATES


def _jumps_after(without_history: dict[int, Point], size: int, scatter: float) -> bool:
    """Whether one token past ``size`` costs a tile's step: beyond the noise and the smooth growth."""
    sizes = sorted(without_history)
    low, high = without_history[size], without_history[size + 1]
    jump = high.median_ms / low.median_ms - 1.0
    # The smooth growth a step must beat: STEP_TOKENS tokens at the steeper of the slopes from the
    # measured size below S and up to the one above S + 1 (a step shows only in the one above).
    below = [c for c in sizes if c < low.chunk_tokens][-1:]
    above = [c for c in sizes if c > high.chunk_tokens][:1]
    slopes = [(low.median_ms - without_history[c].median_ms) / (low.chunk_tokens - c) for c in below]
    slopes += [(without_history[c].median_ms - low.median_ms) / (c - low.chunk_tokens) for c in above]
    smooth = STEP_TOKENS * max(slopes) / low.median_ms if slopes else STEP_TOKENS / low.chunk_tokens
    noise = FALL_SIGMAS * scatter * math.sqrt(median_variance(low.repeats) + median_variance(high.repeats))
    return jump > max(noise, smooth)


def detect_steps(model: LatencyModel, points: Sequence[Point], scatter: float) -> tuple[int, ...]:
    """Segments of the ladder (without history) whose time jumps where it is flat on either side.

    Between two measured sizes the model follows the local law; a staircase (one more wave
    of tiles on the device's cores, a kernel switch) puts a whole jump somewhere between
    them, and a segment holding one grows much faster than its neighbours, which hold none
    and are nearly flat. A segment is a step when its growth beats what the steeper
    neighbouring segment's law gives over the same span by more than ``STEP_EXCESS`` and by
    more than ``FALL_SIGMAS`` standard errors of the two medians, and that law is at most
    ``STEP_FLATNESS`` of its own: a smooth surface whose growth steepens (a cache that
    overflows, attention among the chunk's own tokens) is steep beside it too, and noise
    does not make a jump of that size.
    """
    nodes, row = model.chunk_tokens, model.step_ms[0]
    repeats = {p.chunk_tokens: p.repeats for p in points if p.history_tokens == 0}
    spans = [math.log(b / a) for a, b in zip(nodes, nodes[1:], strict=False)]
    growths = [math.log(b / a) for a, b in zip(row, row[1:], strict=False)]
    laws = [g / span for g, span in zip(growths, spans, strict=True)]
    odd = {nodes.index(c) for c, h in model.odd_points if h == 0}  # (a segment beside one is no law)

    def variance(j: int) -> float:  # of segment j's growth, in units of the scatter's square
        return sum(median_variance(repeats.get(nodes[k], 1)) for k in (j, j + 1))

    steps = []
    for i in range(1, len(laws)):  # (the first segment runs from a decode's one token)
        beside = [j for j in (i - 1, i + 1) if 1 <= j < len(laws)]
        if not beside or odd & {i - 1, i, i + 1, i + 2}:
            continue
        j = max(beside, key=lambda k: laws[k])
        if laws[j] > STEP_FLATNESS * laws[i]:
            continue
        excess = growths[i] - laws[j] * spans[i]
        # Its standard error: the segment's growth and the neighbour's law, each from two medians
        # (noise pooled flat by the monotone fit makes a staircase of its own).
        noise = FALL_SIGMAS * scatter * math.sqrt(variance(i) + (spans[i] / spans[j]) ** 2 * variance(j))
        if excess > math.log1p(max(STEP_EXCESS, noise)):
            steps.append(i)
    return tuple(steps)


def flat_side(low_ms: float, high_ms: float, median_ms: float) -> bool:
    """Whether a time measured inside a step's segment is before its jump: under the jump's geometric middle."""
    return median_ms * median_ms < low_ms * high_ms


def _pair_jumps(flat: Point, past: Point, low_ms: float, high_ms: float, scatter: float) -> bool:
    """Whether two sizes measured within ``LOCATE_TOKENS`` of each other inside a segment hold most of
    its growth between them (beyond ``FALL_SIGMAS`` standard errors): a jump, not smooth growth."""
    if past.chunk_tokens - flat.chunk_tokens > LOCATE_TOKENS:
        return False
    jump = math.log(past.median_ms / flat.median_ms)
    noise = FALL_SIGMAS * scatter * math.sqrt(median_variance(flat.repeats) + median_variance(past.repeats))
    return jump > max(noise, PAIR_SHARE * math.log(high_ms / low_ms))


def locate_steps(
    model: LatencyModel, points: Sequence[Point], steps: Sequence[int], scatter: float = 0.0
) -> LatencyModel:
    """``model`` with ``steps``, each jump placed after the largest size measured on its flat side.

    The grid puts a jump somewhere in a step's segment (a, b); sizes measured inside it without
    history (the profile bisects a segment, ``cpp_profiling.locate_runs``) tell where: the
    jump comes after the largest one below the smallest that is past it (``flat_side``), and
    chunks up to that size cost what was measured there, not b's time. That size becomes a
    node, its time at each history the time measured without history plus what history adds
    (read between a and b, where the jump does not show), kept between a's and b's. A
    segment the grid did not mark holds a step too where two sizes measured close together
    inside it hold most of its growth (``_pair_jumps``: the profile measures each side of
    where a located wave's multiples fall).
    """
    zero = {p.chunk_tokens: p for p in points if p.history_tokens == 0}
    nodes, rows = list(model.chunk_tokens), [list(row) for row in model.step_ms]
    located = set(steps)
    odd = {c for c, _ in model.odd_points}
    for i in reversed(range(len(nodes) - 1)):  # from the top: an insertion moves only the segments above it
        a, b = nodes[i], nodes[i + 1]
        if {a, b} & odd:  # beside an odd point a size between costs the dearer end already
            continue
        low_ms, high_ms = rows[0][i], rows[0][i + 1]
        inside = sorted(c for c in zero if a < c < b)
        past = [c for c in inside if not flat_side(low_ms, high_ms, zero[c].median_ms)]
        flat = [c for c in inside if c < (past[0] if past else b)]
        if i not in located:  # a jump the grid could not tell from growth: a pair of runs across it
            if not (flat and past and _pair_jumps(zero[flat[-1]], zero[past[0]], low_ms, high_ms, scatter)):
                continue
            located.add(i)
        if not flat:
            continue
        size, share = flat[-1], (flat[-1] - a) / (b - a)
        size_ms = min(max(zero[size].median_ms, low_ms), high_ms)
        for row in rows:
            added = row[i] - rows[0][i] + share * ((row[i + 1] - high_ms) - (row[i] - low_ms))
            row.insert(i + 1, min(max(size_ms + added, row[i]), row[i + 1]))
        nodes.insert(i + 1, size)
        located = {j + 1 if j >= i else j for j in located}
    return replace(
        model, chunk_tokens=tuple(nodes), step_ms=tuple(tuple(row) for row in rows), steps=tuple(sorted(located))
    )


def reference_prompt_tokens(rule: ChunkRule, max_history_tokens: int) -> int:
    """The prompt the decisions are judged on: one that fills the history the scheduler will see."""
    limits = rule.limits
    return max(limits.floor_tokens, min(limits.max_model_len, max_history_tokens + limits.cap_tokens))


def schedule_ttft_ms(rule: ChunkRule, truth: LatencyModel, prompt_tokens: int) -> float:
    """One prompt planned and chunked by ``rule``, its TTFT on ``truth``: sum of times + (P - 1) x the largest."""
    plan = plan_target(rule, [(0, prompt_tokens)])
    budget = StepBudget(rule, plan)
    history, remaining, times = 0, prompt_tokens, []
    while remaining > 0:
        budget.start()
        chunk = budget.grant(history, remaining, remaining)
        if chunk <= 0:
            return float("inf")
        times.append(truth.time_ms(chunk, history))
        history, remaining = history + chunk, remaining - chunk
    return sum(times) + (rule.num_stages - 1) * max(times)


def best_fixed_chunk(rule: ChunkRule, prompt_tokens: int) -> int:
    """The fixed chunk (a profiled size from the floor to the cap) with the least TTFT for the reference prompt."""
    model, limits = rule.model, rule.limits
    candidates = [c for c in model.chunk_tokens if limits.floor_tokens <= c <= limits.cap_tokens] or [limits.cap_tokens]
    best, best_ms = candidates[-1], float("inf")
    for chunk in candidates:
        starts = np.arange(0, prompt_tokens, chunk, dtype=np.float64)
        sizes = np.minimum(chunk, prompt_tokens - starts)
        times = model.time_ms_many(sizes, starts)
        ttft_ms = float(times.sum() + (rule.num_stages - 1) * times.max())
        if ttft_ms < best_ms:
            best, best_ms = chunk, ttft_ms
    return int(best)


def _rounds(samples: Sequence[tuple[int, int, float]]) -> list[list[tuple[int, int, float]]]:
    """The k-th run of every point, for each k that every point has (the profile runs in passes), up to
    ``MAX_ROUNDS`` of them."""
    seen: dict[tuple[int, int], int] = {}
    rounds: dict[int, list] = {}
    for chunk, history, latency in samples:
        k = seen.get((chunk, history), 0)
        seen[(chunk, history)] = k + 1
        rounds.setdefault(k, []).append((chunk, history, latency))
    complete = min(min(seen.values(), default=0), MAX_ROUNDS)
    return [rounds[k] for k in range(complete)]


def judge(
    samples: Iterable[object],
    limits: ChunkLimits,
    num_stages: int,
    *,
    max_history_tokens: int,
    last_round: bool,
    remeasure_budget: int = 0,
) -> Verdict:
    """The verdict on a profile for a scheduler with these limits and pipeline depth (see the module doc).

    ``last_round``: no more rounds will follow, so noise is settled by the median of all of them;
    ``remeasure_budget``: the most runs the verdict may ask for to tell whether falls repeat.
    """
    valid, dropped = admitted(samples)
    note = f"; {dropped} sample(s) not measurements, dropped" if dropped else ""
    all_points, scatter = group_points(valid)
    points = grid_part(all_points)
    falls = find_falls(points, runs_by_point(valid), scatter)
    odd = odd_points(falls)
    try:
        model = LatencyModel.from_points(points, scatter, odd)
    except FitError as error:
        fallback = _fallback_chunk(all_points, limits, num_stages, max_history_tokens)
        return Verdict(None, fallback, False, f"no usable profile ({error}){note}")
    granule = detect_granule(all_points, scatter)
    if granule > 1:
        note = f"; time steps every {granule} tokens: chunks are multiples of it{note}"
    kept = [fall for fall in falls if fall.repeated]
    if kept:
        note = f"; {len(kept)} fall(s) that repeated kept, e.g. {kept[0].describe()}{note}"
    if len(kept) < len(falls):
        note = f"; {len(falls) - len(kept)} fall(s) that did not repeat averaged away{note}"
    steps = detect_steps(model, points, scatter)
    model = replace(locate_steps(model, all_points, steps, scatter), reach=reach_of(model, all_points))
    judged = ChunkRule(model, replace(limits, granule_tokens=granule), num_stages)
    prompt_tokens = reference_prompt_tokens(judged, max_history_tokens)
    grid_keys = {(p.chunk_tokens, p.history_tokens) for p in points}
    rounds = _rounds([s for s in valid if (s[0], s[1]) in grid_keys])  # (a size measured once is in none)
    loss = 0.0
    if len(rounds) >= 2:
        own_ms = schedule_ttft_ms(judged, model, prompt_tokens)
        for samples_of_round in rounds:
            round_points, _ = group_points(samples_of_round)
            try:
                round_model = LatencyModel.from_points(grid_part(round_points), odd=odd)
                round_rule = judged.with_model(locate_steps(round_model, all_points, steps, scatter))
            except FitError:
                continue
            loss = max(loss, schedule_ttft_ms(round_rule, model, prompt_tokens) / own_ms - 1.0)
    reason = (
        f"accepted: {model.describe()}; a single round's schedule of a {prompt_tokens}-token prompt "
        f"costs {loss:+.1%}{note}"
    )
    if loss > UNSTABLE_LOSS and not last_round:
        return Verdict(None, None, True, f"unstable decisions: a single round's schedule costs {loss:+.1%}{note}")
    remeasure = tuple(remeasure_runs(falls, runs_by_point(valid), remeasure_budget))
    return Verdict(model, None, False, reason, granule, remeasure)
