"""The chunk-by-chunk check of a CPP plan: its batches, step by step, through P stages.

The planner (core/cpp_planner.py) integrates a prompt's chunks as a continuous quantity.
Where that misjudges, a plan is checked by running the step budget itself
(``prefill_steps``: what ``StepBudget`` grants a prefill alone, batch by batch) and the
batches through P stages with at most P in flight (``pipeline_done_ms``), as vLLM's
engine runs them:

- ``refine_for_few_chunks``: when the first prefill needs few chunks (up to
  ``EXACT_MAX_CHUNKS``), the last one is misjudged; between the targets at which the
  chunk count steps the TTFT rises with the target, so those steps are compared.
- ``constant_chunk_if_better``: on a device with tile steps (a granule), a chunk that
  shrinks as the history grows does so a tile at a time, and each step down makes a
  batch shorter than the one P places before it; that batch cannot start earlier (at
  most P in flight), so the stages idle. A constant chunk's batches only grow, for more
  batches' fixed cost. The plan and constant chunks of the sizes its schedule uses are
  compared. On any device, the plan and a constant chunk of the largest size it runs:
  chunks that shrink with the history may add a last, short one that costs nearly a
  full batch, which the planner's continuous chunk count does not see.
- ``checked_plan``: the safety net, last. Where the cost per token dips at some size (a
  sweet spot: a better kernel or tiling), a chunk the target would make larger is cheaper
  cut down to it, but the batch is then shorter than the one before it, which the
  pipeline cannot start earlier (at most P in flight); a prompt may also do best with
  one size where a dip is and another elsewhere (core/cpp_regions.py). The plan, the
  same target with the sweet spots, the plan of a size per stretch of history and the
  fixed chunks of a sweep (64 tokens and up in 1-1.5-2 steps, as a user would tune one)
  are run chunk by chunk under the same model and the same pipeline loop, and the best
  one is adopted: never behind the simple alternative, so what the other checks do not
  see (a model that bends between its sizes, a sweet spot a constant chunk sits on)
  costs at most the gap to it.

Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, EfficientChunks, Plan
from vllm_ascend.core.cpp_ladder import ladder
from vllm_ascend.core.cpp_regions import region_plan
from vllm_ascend.core.cpp_step_budget import StepBudget

__all__ = [
    "EXACT_MAX_CHUNKS",
    "checked_plan",
    "constant_chunk_if_better",
    "exact_cost",
    "fixed_sweep",
    "pipeline_done_ms",
    "prefill_chunk_ms",
    "prefill_steps",
    "refine_for_few_chunks",
]

EXACT_MAX_CHUNKS = 48  # a first prefill of at most this many chunks is planned chunk by chunk
_STEP_SEARCH_ROUNDS = 16  # bisections for the target at which a chunk count steps
_LARGEST_SWEPT = 96 << 23  # the fixed sweep stops at 805M tokens, past any context
_CONSTANT_MAX_CHUNKS = 4 * EXACT_MAX_CHUNKS  # on tiles, constant chunks are weighed for prompts of up to so many
_CONSTANT_SIZES = 6  # ... of at most so many sizes (and the best one's neighbours)


def pipeline_done_ms(batch_ms: Sequence[float], num_stages: int) -> list[float]:
    """When each batch leaves the last of P stages: each spends its time on every stage, a stage
    takes the batches in order, and at most P batches are in flight (a batch enters the first stage
    only once the batch P places ahead has left the last), as vLLM's engine runs them.

    While batch times do not fall, no batch ever waits: the first stage works without a gap (the
    batch P places ahead took no longer than the P batches since, so it has left), and batch i
    leaves stage s at E_i + (s + 1) t_i, E_i the sum of the times before it. That prefix is read
    in closed form (a constant chunk's batches only grow); the rest runs stage by stage.
    """
    times = np.asarray(batch_ms, dtype=np.float64)
    falls = np.flatnonzero(np.diff(times) < 0)
    rising = int(falls[0]) + 1 if len(falls) else len(times)  # batches [0, rising) never wait
    entered = np.cumsum(times[:rising]) - times[:rising]
    done_ms = (entered + num_stages * times[:rising]).tolist()
    free_ms = [0.0] * num_stages
    if rising:
        free_ms = [float(entered[-1] + (stage + 1) * times[rising - 1]) for stage in range(num_stages)]
    for index in range(rising, len(times)):
        time_ms = float(times[index])
        ready_ms = done_ms[index - num_stages] if index >= num_stages else 0.0
        for stage in range(num_stages):
            ready_ms = max(ready_ms, free_ms[stage]) + time_ms
            free_ms[stage] = ready_ms
        done_ms.append(ready_ms)
    return done_ms


def prefill_steps(rule: ChunkRule, plan: Plan, history: int, remaining: int, limit: int) -> list[tuple[int, float]]:
    """(chunk, batch time) of one prefill scheduled alone, step by step by ``StepBudget`` (at most ``limit``
    steps; [] if it needs more)."""
    budget = StepBudget(rule, plan)
    extra_ms = plan.fixed_ms - rule.model.fixed_ms
    steps: list[tuple[int, float]] = []
    while remaining > 0 and len(steps) < limit:
        budget.start(extra_ms)
        chunk = budget.grant(history, remaining, remaining)
        if chunk <= 0:
            break
        budget.charge("prefill", chunk, history)
        steps.append((chunk, budget.predicted_ms()))
        history, remaining = history + chunk, remaining - chunk
    return steps if remaining <= 0 else []


def prefill_chunk_ms(rule: ChunkRule, plan: Plan, history: int, remaining: int, limit: int) -> list[float]:
    """The batch times of one prefill scheduled alone, step by step by ``StepBudget`` (at most ``limit``)."""
    return [time_ms for _, time_ms in prefill_steps(rule, plan, history, remaining, limit)]


def exact_cost(
    rule: ChunkRule, held: Sequence[tuple[int, int]], plan: Plan, inflight_ms: float, limit: int
) -> tuple[float, int]:
    """The held prefills' mean TTFT under ``plan``, chunk by chunk through P stages with at most P in
    flight, and the first one's chunk count (inf and ``limit`` + 1 when one needs more than ``limit``)."""
    times, ends, first_chunks = [inflight_ms] if inflight_ms > 0 else [], [], 0
    for history, remaining in held:
        chunk_ms = prefill_chunk_ms(rule, plan, history, remaining, limit)
        if not chunk_ms:
            return math.inf, limit + 1
        first_chunks = first_chunks or len(chunk_ms)
        times += chunk_ms
        ends.append(len(times) - 1)
    done_ms = pipeline_done_ms(times, rule.num_stages)
    return sum(done_ms[end] for end in ends) / len(ends), first_chunks


def refine_for_few_chunks(
    rule: ChunkRule,
    held: Sequence[tuple[int, int]],
    target_ms: float,
    low: float,
    high: float,
    fixed_ms: float,
    inflight_ms: float,
    efficient: EfficientChunks,
) -> float:
    """Between the targets at which the first prefill's chunk count steps, the predicted TTFT
    rises with the target, so the best target is one of those steps. Compare, chunk by chunk,
    the target found with the least targets at which the first prefill fits in one chunk
    fewer, as many, or one more."""

    def plan(target: float) -> Plan:
        return Plan(target, fixed_ms, efficient)

    first_history, first_remaining = held[0]

    def first_fits(target: float, count: int) -> bool:
        return bool(prefill_chunk_ms(rule, plan(target), first_history, first_remaining, count))

    best_cost, chunks = exact_cost(rule, held, plan(target_ms), inflight_ms, EXACT_MAX_CHUNKS)
    if chunks > EXACT_MAX_CHUNKS:
        return target_ms
    best_target = target_ms
    for count in range(max(1, chunks - 1), min(chunks + 1, EXACT_MAX_CHUNKS) + 1):
        if not first_fits(high, count):
            continue
        lo_ms, hi_ms = low, high  # the least target at which the first prefill takes <= count chunks
        for _ in range(_STEP_SEARCH_ROUNDS):
            middle = math.sqrt(lo_ms * hi_ms)
            lo_ms, hi_ms = (lo_ms, middle) if first_fits(middle, count) else (middle, hi_ms)
        cost = exact_cost(rule, held, plan(hi_ms), inflight_ms, EXACT_MAX_CHUNKS)[0]
        if cost < best_cost:
            best_cost, best_target = cost, hi_ms
    return best_target


def constant_chunk_if_better(
    rule: ChunkRule,
    held: Sequence[tuple[int, int]],
    plan: Plan,
    high: float,
    inflight_ms: float,
    also: Sequence[int] = (),
    spread: bool = True,
) -> Plan:
    """On tiles, the plan, or a constant chunk of a size its schedule uses if that is faster chunk by chunk.

    Where time steps every tile, a chunk that shrinks as the history grows does so a tile at
    a time, and each step down makes a batch shorter than the one P places before it, which
    cannot start earlier (at most P in flight): the stages idle. A constant chunk's batches
    only grow, for more batches' fixed cost. Of the sizes the first prefill's schedule uses,
    at most ``_CONSTANT_SIZES`` spread over them and the neighbours of the best are run, and
    every size of ``also`` (a step's lower size: whole waves, which a shrinking chunk leaves).
    ``spread=False``: of the schedule's sizes, only the largest (no tiles: the shrinking
    chunk's cost is its extra last chunk, not idle stages)."""
    first_history, first_remaining = held[0]
    steps = prefill_steps(rule, plan, first_history, first_remaining, _CONSTANT_MAX_CHUNKS)
    used = {chunk for chunk, _ in steps[:-1]}  # (not the prompt's tail)
    if not spread:
        used = {max(used)} if used else set()
    sizes = sorted(used | {int(size) for size in also})
    if not sizes:
        return plan
    costs: dict[int, float] = {}

    def constant(index: int) -> Plan:
        return Plan(high, plan.fixed_ms, plan.efficient.capped(sizes[index]), sizes[index])

    def cost_of(index: int) -> float:
        if index not in costs:
            costs[index] = exact_cost(rule, held, constant(index), inflight_ms, _CONSTANT_MAX_CHUNKS)[0]
        return costs[index]

    spread = np.unique(np.linspace(0, len(sizes) - 1, min(len(sizes), _CONSTANT_SIZES)).round().astype(int))
    best = min([*spread.tolist(), *[sizes.index(int(size)) for size in also]], key=cost_of)
    best = min([best, *[i for i in (best - 1, best + 1) if 0 <= i < len(sizes)]], key=cost_of)
    if cost_of(best) >= exact_cost(rule, held, plan, inflight_ms, _CONSTANT_MAX_CHUNKS)[0]:
        return plan
    return constant(best)


def _limit(rule: ChunkRule, held: Sequence[tuple[int, int]]) -> int:
    """Chunks the held prefills can take at most: every one of them the floor."""
    return sum(-(-remaining // rule.limits.floor_tokens) for _, remaining in held) + 1


def _grantable(rule: ChunkRule, sizes) -> list[int]:
    """The sizes the step budget grants as they are: from the floor to the cap, whole tiles with a granule."""
    limits = rule.limits
    granule = limits.granule_tokens
    return sorted(
        {int(c) for c in sizes if limits.floor_tokens <= c <= limits.cap_tokens and (granule <= 1 or c % granule == 0)}
    )


def fixed_sweep(rule: ChunkRule) -> list[int]:
    """The fixed chunks a user sweeps: 64 tokens and up in 1-1.5-2 steps, and the cap itself (those the
    step budget grants as they are)."""
    cap = rule.limits.cap_tokens
    return _grantable(rule, {cap, *ladder(64, min(cap - 1, _LARGEST_SWEPT))})


def _constant_times(rule: ChunkRule, prefill: tuple[int, int], chunk: int, extra_ms: float) -> list[float]:
    """A prefill in constant chunks of ``chunk`` tokens and its tail (what the step budget grants under a plan
    of that chunk and as many tokens a batch): their batch times."""
    history, remaining = prefill
    starts = np.arange(history, history + remaining, chunk, dtype=np.float64)
    sizes = np.minimum(float(chunk), history + remaining - starts)
    return (rule.model.time_ms_many(sizes, starts) + extra_ms).tolist()


def checked_plan(rule: ChunkRule, held: Sequence[tuple[int, int]], plan: Plan, high: float, inflight_ms: float) -> Plan:
    """The safety net, last: of the plan, the same target taking the sweet spots below its chunks
    (``EfficientChunks.instead``), a constant chunk per stretch of one prompt's history
    (core/cpp_regions.py), and constant chunks of the fixed sweep (``fixed_sweep``), the one with
    the least TTFT chunk by chunk through P stages with at most P in flight, under the same model:
    the plan is never adopted behind the simple alternative. A constant chunk's plan has the target
    ``high`` (every chunk of the size fits) and no sweet spot below it."""
    limit = _limit(rule, held)
    candidates = [plan]
    if plan.batch_tokens == math.inf and plan.efficient.instead is None:
        sweet = rule.efficient_chunks(sweet=True)
        if sweet.instead is not None:  # (a chunk cut to a sweet spot makes a shorter batch than the one before)
            candidates.append(Plan(plan.target_ms, plan.fixed_ms, sweet))
    one = len(held) == 1  # (several prompts share batches: a constant chunk is no fixed chunk's schedule)
    if one:
        sizes = _grantable(rule, {*rule.model.chunk_tokens, *fixed_sweep(rule)})
        regions = region_plan(rule, sizes, *held[0], Plan(high, plan.fixed_ms, plan.efficient))
        candidates += [regions] if regions is not None else []
    costs = [exact_cost(rule, held, candidate, inflight_ms, limit)[0] for candidate in candidates]
    best_ms = min(costs)
    best_plan = candidates[costs.index(best_ms)]
    extra_ms = plan.fixed_ms - rule.model.fixed_ms
    best = None
    for chunk in fixed_sweep(rule) if one else ():
        times = _constant_times(rule, held[0], chunk, extra_ms)
        if max(times, default=0.0) > high:  # (not every chunk fits the target: the step budget would cut it)
            continue
        prefix = [inflight_ms] if inflight_ms > 0 else []
        cost_ms = pipeline_done_ms(prefix + times, rule.num_stages)[-1]
        if cost_ms < best_ms:
            best, best_ms = chunk, cost_ms
    if best is None:
        return best_plan
    return Plan(high, plan.fixed_ms, EfficientChunks((0.0,), (float(best),)), best)  # (every chunk of the size)
