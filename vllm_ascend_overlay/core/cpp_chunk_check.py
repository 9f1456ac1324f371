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

Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, EfficientChunks, Plan
from vllm_ascend.core.cpp_step_budget import StepBudget

__all__ = [
    "EXACT_MAX_CHUNKS",
    "constant_chunk_if_better",
    "exact_cost",
    "pipeline_done_ms",
    "prefill_chunk_ms",
    "prefill_steps",
    "refine_for_few_chunks",
]

EXACT_MAX_CHUNKS = 48  # a first prefill of at most this many chunks is planned chunk by chunk
_STEP_SEARCH_ROUNDS = 16  # bisections for the target at which a chunk count steps
_CONSTANT_MAX_CHUNKS = 4 * EXACT_MAX_CHUNKS  # on tiles, constant chunks are weighed for prompts of up to so many
_CONSTANT_SIZES = 6  # ... of at most so many sizes (and the best one's neighbours)


def pipeline_done_ms(batch_ms: Sequence[float], num_stages: int) -> list[float]:
    """When each batch leaves the last of P stages: each spends its time on every stage, a stage
    takes the batches in order, and at most P batches are in flight (a batch enters the first stage
    only once the batch P places ahead has left the last), as vLLM's engine runs them."""
    free_ms = [0.0] * num_stages
    done_ms: list[float] = []
    for index, time_ms in enumerate(batch_ms):
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
