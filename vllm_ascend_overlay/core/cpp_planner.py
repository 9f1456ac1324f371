"""The batch-time target of dynamic chunked pipeline parallelism (CPP): a plan for the held prefills.

``plan_target`` chooses the target T that minimises the predicted mean time to first
token of the prefills the scheduler holds, given P stages:

1. For each candidate T the chunks of every held prefill follow from the chunk rule
   (core/cpp_chunk_rule.py, ``chunk_alone_many``: the same numbers the step budget
   grants); their total time is integrated over the prompt (Simpson's rule on the
   time per token of the chunk covering each position, read from the measured model),
   and the TTFT of the j-th prefill in FCFS order is the work of prefills 1..j plus
   (P - 1) times the largest batch, the batches still in flight included. One prompt at
   a shallow pipeline wants large chunks; a deep pipeline wants smaller ones to shorten
   the fill; a backlog wants the most tokens per millisecond.
2. The engine keeps at most P batches in flight, so a batch shorter than the one P
   places before it cannot start earlier: the largest batch in flight counts in the
   fill and drain term, and T does not drop for a gain it cannot have.
3. When the first prefill needs few chunks (up to ``EXACT_MAX_CHUNKS``) counting chunks
   as a continuous quantity misjudges the last one, so the result is checked chunk by
   chunk, by running the step budget itself and the batches through P stages with at
   most P in flight (``pipeline_done_ms``), against the targets at which its chunk count
   steps, where the best target lies.
4. Decodes ride in the same batches and wait for each one, so their inter-token latency
   grows with T. When requests are decoding, T is at most the time of the next batch
   under the fixed chunk that would serve the same prefills best (the chunk a user would
   tune by hand), so decodes wait no longer than under that chunk, and within that bound
   the planner still chooses the chunks. It then takes the shortest T whose prefill work
   is within ``DECODE_WORK_SLACK`` of that of the TTFT-best T; where the work is flat in
   T batches get much shorter for almost nothing. ``max_batch_ms`` bounds T for an
   explicit latency objective.

The search runs only when the set of held prefills changes, never per step. Pure
Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, EfficientChunks, Plan, StepBudget

__all__ = ["DECODE_WORK_SLACK", "EXACT_MAX_CHUNKS", "PLAN_MAX_PREFILLS", "plan_target", "prefill_chunk_ms"]

PLAN_MAX_PREFILLS = 8  # held prefills the target is planned for (FCFS head; later ones count as arrivals)
_PLAN_PANELS = 6  # Simpson panels per prefill
_PLAN_GRID = 16  # candidate targets per search round (two rounds)
_GRID_STEPS = np.linspace(0.0, 1.0, _PLAN_GRID)  # candidates: low * (high / low) ** step
_NODES = np.linspace(0.0, 1.0, 2 * _PLAN_PANELS + 1)  # Simpson nodes over a prefill's remaining tokens
_SIMPSON = np.array([1.0] + [4.0, 2.0] * (_PLAN_PANELS - 1) + [4.0, 1.0]) / (6.0 * _PLAN_PANELS)
EXACT_MAX_CHUNKS = 48  # a first prefill of at most this many chunks is planned chunk by chunk
_STEP_SEARCH_ROUNDS = 16  # bisections for the target at which a chunk count steps
DECODE_WORK_SLACK = 0.02  # with decodes in the batches: the shortest batch within 2% of the best work


def target_bounds(rule: ChunkRule, prefills: Sequence[tuple[int, int]], fixed_ms: float) -> tuple[float, float]:
    """Targets worth searching: a floor-sized chunk at the deepest history, up to a full cap there.

    ``max_batch_ms`` bounds both: the user's latency bound wins over the low end too (the
    step's first prefill still advances by the floor).
    """
    model, limits = rule.model, rule.limits
    deepest = max((history + remaining for history, remaining in prefills), default=0)
    deepest = min(deepest, limits.max_model_len)
    low = fixed_ms + model.request_ms(limits.floor_tokens, deepest)
    high = max(low, fixed_ms + model.request_ms(limits.cap_tokens, deepest))
    if limits.max_batch_ms is not None:
        low, high = min(low, limits.max_batch_ms), min(high, limits.max_batch_ms)
    return low, high


def plan_target(
    rule: ChunkRule,
    prefills: Sequence[tuple[int, int]],
    *,
    fixed_ms: float | None = None,
    inflight_ms: float = 0.0,
    decoding: int = 0,
    arrivals_per_ms: float = 0.0,
) -> Plan:
    """The plan whose target minimises the predicted mean TTFT of ``prefills`` (see the module docstring).

    ``prefills``: (history_tokens, remaining_tokens) in FCFS order; ``fixed_ms``: each
    batch's cost before any prefill (the model's fixed cost plus the decodes it carries);
    ``inflight_ms``: the largest predicted time of a batch still in flight; ``decoding``:
    how many requests are decoding (rule 4 applies when there are any). Always returns a
    finite target within the bounds.
    """
    model = rule.model
    fixed_ms = model.fixed_ms if fixed_ms is None else max(float(fixed_ms), model.fixed_ms)
    if not math.isfinite(fixed_ms):
        fixed_ms = model.fixed_ms
    efficient = rule.efficient_chunks()
    held = [(max(0, int(h)), int(r)) for h, r in prefills if r > 0][:PLAN_MAX_PREFILLS]
    low, high = target_bounds(rule, held, fixed_ms)
    if not held or high <= low * (1.0 + 1e-6):
        return Plan(high, fixed_ms, efficient)
    if decoding:
        # Decodes wait for every batch: none longer than the next batch of the best fixed chunk.
        high = min(high, max(low, fixed_chunk_batch_ms(rule, held, fixed_ms, inflight_ms, arrivals_per_ms)))
        if high <= low * (1.0 + 1e-6):
            return Plan(high, fixed_ms, efficient)
    candidates = low * (high / low) ** _GRID_STEPS
    costs, work = predicted_ttft_ms(rule, held, candidates, fixed_ms, inflight_ms, efficient, arrivals_per_ms)
    best = int(np.argmin(costs))
    if not np.isfinite(costs[best]):
        return Plan(high, fixed_ms, efficient)
    # Refine between the neighbours of the best candidate.
    lo_index, hi_index = max(best - 1, 0), min(best + 1, len(candidates) - 1)
    fine = candidates[lo_index] * (candidates[hi_index] / candidates[lo_index]) ** _GRID_STEPS
    fine_costs, fine_work = predicted_ttft_ms(rule, held, fine, fixed_ms, inflight_ms, efficient, arrivals_per_ms)
    candidates = np.concatenate([candidates, fine])
    costs, work = np.concatenate([costs, fine_costs]), np.concatenate([work, fine_work])
    best = int(np.argmin(costs))
    if not decoding:
        target = _refine_for_few_chunks(
            rule, held, float(candidates[best]), low, high, fixed_ms, inflight_ms, efficient
        )
        return Plan(target, fixed_ms, efficient)
    # Decodes ride in these batches and wait for each one: take the shortest batch that
    # does the prefills' work within DECODE_WORK_SLACK of the best target's.
    shorter = (candidates <= candidates[best]) & (work <= work[best] * (1.0 + DECODE_WORK_SLACK))
    return Plan(float(np.min(candidates[shorter], initial=candidates[best])), fixed_ms, efficient)


def mean_ttft(
    request_ms: np.ndarray, chunks: np.ndarray, fixed_ms: float, batch_ms: np.ndarray, drain_ms: np.ndarray,
    arrivals_per_ms: float,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Mean TTFT of the held prefills, and their total time, per candidate (rows).

    ``request_ms`` (candidates, prefills): each prefill's own work; ``chunks``: how many chunks
    it takes; ``batch_ms`` (candidates): the time a batch may take. Prefills finish in FCFS
    order; a batch's fixed cost is paid once however many prefills share it, so the first j
    need as many batches as their work fills at ``batch_ms`` each, and never fewer than the
    chunks of the longest of them (one prefill's chunks cannot share a batch). The j-th's
    first token comes after that work and the drain. Requests expected to arrive while the
    held ones run (at ``arrivals_per_ms``) wait for half the held work on average, then do
    their own work and drain: the more of them, the more the pipeline's throughput counts
    against any one prompt's fill and drain.
    """
    room_ms = np.maximum(batch_ms - fixed_ms, 1e-9)[:, None]
    own_ms = np.cumsum(request_ms, axis=1)
    batches = np.maximum(own_ms / room_ms, np.maximum.accumulate(chunks, axis=1))
    work_ms = own_ms + fixed_ms * batches  # (candidates, prefills): the first j prefills' time
    total_ms, count = work_ms[:, -1], work_ms.shape[1]
    future = arrivals_per_ms * total_ms
    future_ms = future * (total_ms / 2 + total_ms / count + drain_ms)
    return (work_ms.sum(axis=1) + count * drain_ms + future_ms) / (count + future), total_ms


def predicted_ttft_ms(
    rule: ChunkRule,
    held: Sequence[tuple[int, int]],
    targets: np.ndarray,
    fixed_ms: float,
    inflight_ms: float,
    efficient: EfficientChunks,
    arrivals_per_ms: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per target (vectors): the mean predicted TTFT of ``held``, and their total work in ms."""
    model = rule.model
    starts = np.array([float(h) for h, _ in held])[:, None]
    remaining = np.array([float(r) for _, r in held])
    histories = starts + remaining[:, None] * _NODES[None, :]  # (prefills, nodes)
    targets = np.asarray(targets, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        chunk = rule.chunk_alone_many(histories[None, :, :], targets[:, None, None], fixed_ms, efficient)
        # Only the context can leave no room (at a prompt's very end): every chunk is at least one token.
        chunk = np.minimum(np.maximum(chunk, 1.0), remaining[None, :, None])
        # The chunk covering position H starts at about H - C/2 (not before the prompt's start):
        # its time per token is what that stretch of the prompt costs.
        covering = np.maximum(starts[None, :, :], histories[None, :, :] - chunk / 2)
        request_ms = (model.request_ms_many(chunk, covering) / chunk @ _SIMPSON) * remaining  # (targets, prefills)
        chunks = ((1.0 / chunk) @ _SIMPSON) * remaining
        chunk_ms = fixed_ms + model.request_ms_many(chunk, histories[None, :, :])
        largest_ms = np.maximum(np.max(chunk_ms, axis=(1, 2)), inflight_ms)
        mean_ttft_ms, work_ms = mean_ttft(
            request_ms, chunks, fixed_ms, targets, (rule.num_stages - 1) * largest_ms, arrivals_per_ms
        )
    ok = np.isfinite(mean_ttft_ms) & (work_ms > 0)
    return np.where(ok, mean_ttft_ms, np.inf), np.where(ok, work_ms, np.inf)


def fixed_chunk_batch_ms(
    rule: ChunkRule, held: Sequence[tuple[int, int]], fixed_ms: float, inflight_ms: float, arrivals_per_ms: float
) -> float:
    """A batch's time under the fixed chunk that would give ``held`` the least predicted mean TTFT.

    Fixed chunks are the profiled sizes from the floor to the cap; for each, every prefill
    is chunked at that size, its time per token integrated over the prompt as in
    ``predicted_ttft_ms``, and a batch holds that many tokens of any prefills. The batch is
    one of that many tokens at the first held prefill's history.
    """
    model, limits = rule.model, rule.limits
    sizes = np.array(
        [c for c in model.chunk_tokens if limits.floor_tokens <= c <= limits.cap_tokens] or [limits.cap_tokens],
        dtype=np.float64,
    )
    starts = np.array([float(h) for h, _ in held])[:, None]
    remaining = np.array([float(r) for _, r in held])
    histories = starts + remaining[:, None] * _NODES[None, :]
    chunk = np.minimum(sizes[:, None, None], remaining[None, :, None])
    batch_ms = fixed_ms + model.request_ms_many(chunk, histories[None, :, :])  # (sizes, prefills, nodes)
    covering = np.maximum(starts[None, :, :], histories[None, :, :] - chunk / 2)
    request_ms = (model.request_ms_many(chunk, covering) / chunk @ _SIMPSON) * remaining
    chunks = remaining / chunk[:, :, 0]
    # A fixed chunk fills a batch with its tokens: the batch's own time is what those tokens cost.
    full_ms = fixed_ms + request_ms.sum(axis=1) * sizes / np.maximum(remaining.sum(), 1.0)
    largest_ms = np.maximum(batch_ms.max(axis=(1, 2)), inflight_ms)
    mean_ttft_ms, _ = mean_ttft(
        request_ms, chunks, fixed_ms, np.maximum(full_ms, fixed_ms + 1e-9), (rule.num_stages - 1) * largest_ms,
        arrivals_per_ms,
    )  # fmt: skip
    # A batch of that chunk: its tokens from whichever prefills are held, at the first one's history.
    best = float(sizes[int(np.argmin(mean_ttft_ms))])
    return fixed_ms + model.request_ms(best, float(starts[0, 0]))


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


def prefill_chunk_ms(rule: ChunkRule, plan: Plan, history: int, remaining: int, limit: int) -> list[float]:
    """The batch times of one prefill scheduled alone, step by step by ``StepBudget`` (at most ``limit``)."""
    budget = StepBudget(rule, plan)
    extra_ms = plan.fixed_ms - rule.model.fixed_ms
    times: list[float] = []
    while remaining > 0 and len(times) < limit:
        budget.start(extra_ms)
        chunk = budget.grant(history, remaining, remaining)
        if chunk <= 0:
            break
        budget.charge("prefill", chunk, history)
        times.append(budget.predicted_ms())
        history, remaining = history + chunk, remaining - chunk
    return times if remaining <= 0 else []


def _refine_for_few_chunks(
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

    def exact_cost(target: float) -> tuple[float, int]:
        times, ends, first_chunks = [inflight_ms] if inflight_ms > 0 else [], [], 0
        for history, remaining in held:
            chunk_ms = prefill_chunk_ms(rule, plan(target), history, remaining, EXACT_MAX_CHUNKS)
            if not chunk_ms:
                return math.inf, EXACT_MAX_CHUNKS + 1
            first_chunks = first_chunks or len(chunk_ms)
            times += chunk_ms
            ends.append(len(times) - 1)
        done_ms = pipeline_done_ms(times, rule.num_stages)
        return sum(done_ms[end] for end in ends) / len(ends), first_chunks

    first_history, first_remaining = held[0]

    def first_fits(target: float, count: int) -> bool:
        return bool(prefill_chunk_ms(rule, plan(target), first_history, first_remaining, count))

    best_cost, chunks = exact_cost(target_ms)
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
        cost = exact_cost(hi_ms)[0]
        if cost < best_cost:
            best_cost, best_target = cost, hi_ms
    return best_target
