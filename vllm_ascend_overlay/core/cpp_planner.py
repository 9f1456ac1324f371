"""The batch-time target of dynamic chunked pipeline parallelism (CPP): a plan for the held prefills.

``plan_target`` chooses the target T that minimises the predicted mean time to first
token of the prefills the scheduler holds, given P stages:

1. For each candidate T the chunks of every held prefill follow from the chunk rule
   (core/cpp_chunk_rule.py, ``chunk_alone_many``: the same numbers the step budget
   grants); their total time is integrated over the prompt (Simpson's rule on the
   time per token of the chunk covering each position, read from the measured model),
   and the TTFT of the j-th prefill in FCFS order is the work of prefills 1..j plus
   (P - 1) times the largest batch, the batches still in flight included. Prefills share
   batches: the largest batch is T itself when their chunks can fill it. After the first
   ``PLAN_MAX_PREFILLS`` held ones, the rest count as a queue (their number and tokens).
   Requests expected meanwhile (``Load``, core/cpp_traffic.py: the arrival rate measured
   over the latest arrivals, and the latest prefills as the sample of their sizes) find
   that work, queue behind each other as at one server (Pollaczek-Khinchine), then do
   their own work and drain.
   One prompt at a shallow pipeline wants large chunks; a deep pipeline wants smaller ones
   to shorten the fill; a backlog, or load, wants the most tokens per millisecond.
2. The engine keeps at most P batches in flight, so a batch shorter than the one P
   places before it cannot start earlier: the largest batch in flight counts in the
   fill and drain term, and T does not drop for a gain it cannot have.
3. When the first prefill needs few chunks (up to ``EXACT_MAX_CHUNKS``), no request
   decodes and no more than ``PLAN_MAX_PREFILLS`` prefills are held, counting chunks as a
   continuous quantity misjudges the last one, so the result is checked chunk by chunk,
   by running the step budget itself and the batches through P stages with at most P in
   flight (``pipeline_done_ms``), against the targets at which its chunk count
   steps, where the best target lies. On a device with tile steps (a granule) the plan is
   also weighed, the same way, against constant chunks of the sizes its schedule uses: a
   chunk that shrinks a tile at a time makes batches shorter than the ones P places before
   them, and the stages idle (core/cpp_chunk_check.py). Where the model has steps (waves of
   tiles over the cores), constant chunks of each step's lower size (whole waves) are
   weighed too: the integral over the prompt cannot see that a chunk shrinking with the
   history leaves whole waves for a share of a wave's tokens. On any device the plan is
   weighed against a constant chunk of the largest size it runs: the integral counts the
   prompt's chunks as a continuous quantity, so it cannot see that shrinking chunks may
   add a last one, which pays a whole batch's cost for a few tokens (one wave, where a
   wave is wider than the cap). The size is one the plan itself runs, never a larger one
   the model may know only from its continuation. Last, the safety net (``checked_plan``):
   the plan, the same target taking the sweet spots below its chunks, one prompt's plan of
   a size per stretch of history (core/cpp_regions.py) and the fixed chunks a user would
   sweep are weighed the same way, and the best runs: never behind the simple alternative.
4. Decodes ride in the same batches and wait for each one, so their inter-token latency
   grows with T. When requests are decoding, T is at most the mean batch time the held
   and queued prefills would get under rule 4's chunk (``chunk_for_decodes``), no chunk is
   larger than that chunk (the plan's C*(H) is capped by it) and the prefills of one batch
   share that many tokens (``Plan.batch_tokens``), so at any history no batch is longer than
   that chunk's would be there: decodes wait no longer than under it, wherever in a prompt
   they fall. Rule 4's chunk lies between the fixed chunk tuned for this traffic (the
   least predicted mean TTFT at the traffic's steady arrival rate, with the same queue; a
   fixed chunk packs short prompts into one batch) and the smallest chunk within
   ``TUNED_CHUNK_SLACK`` of that least, walking down from it and never across a hump (read
   where the curve crosses that bound between profiled sizes, so a small change in the
   model moves it a little, not a ladder step): the one of the least product of the
   predicted mean TTFT and the decodes' pace. A smaller chunk is taken only where it
   shortens a decode's time per token by a larger share than it lengthens TTFT: not where
   a batch's fixed cost dominates it, nor where prefills take little of the time.
   Within that bound the planner still chooses the chunks, by an explicit objective: the
   predicted mean end-to-end latency of the requests in flight, the prefills' TTFT plus
   what the decodes wait for the prefills' share of each batch (``decodes_wait_ms``: a
   decode that outlasts the prefills waits their work whatever T is, one about to end
   waits less under shorter batches). With the user's TPOT target
   (``target_tpot_ms``) rule 4 is theirs instead: while requests decode, T is at most the
   target over the steps between two of a decode's tokens (``ChunkLimits.decode_step_ms``),
   no fixed chunk caps the chunks, and within that bound T is the least mean TTFT's.

The search runs only when the set of held prefills changes or decodes start or stop, never
per step, and while a batch is in flight in the planner thread (core/cpp_policy.py): it
works on copies of the step's inputs and shares only the rule with the step (whose one
mutable part, the cache of efficient chunks, is a dictionary: each access is atomic).
Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from vllm_ascend.core.cpp_chunk_check import (
    EXACT_MAX_CHUNKS,
    checked_plan,
    constant_chunk_if_better,
    refine_for_few_chunks,
)
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, EfficientChunks, Plan
from vllm_ascend.core.cpp_traffic import (
    NO_LOAD,
    PROMPT_NODES,
    PROMPT_WEIGHTS,
    Load,
    chunk_for_decodes,
    fixed_chunk_batch_ms,
    prompt_work_ms,
    queue_wait_ms,
)

__all__ = [
    "EXACT_MAX_CHUNKS",
    "PLAN_MAX_PREFILLS",
    "TUNED_CHUNK_SLACK",
    "plan_target",
]

PLAN_MAX_PREFILLS = 8  # held prefills the target is planned for one by one (FCFS head; later ones as a queue)
_PLAN_GRID = 16  # candidate targets per search round (two rounds)
_GRID_STEPS = np.linspace(0.0, 1.0, _PLAN_GRID)  # candidates: low * (high / low) ** step
TUNED_CHUNK_SLACK = 0.05  # rule 4's chunk: the smallest fixed chunk within 5% of the best predicted mean TTFT


def target_bounds(
    rule: ChunkRule, prefills: Sequence[tuple[int, int]], fixed_ms: float, decoding: int = 0
) -> tuple[float, float]:
    """Targets worth searching: a floor-sized chunk at the deepest history, up to a full cap there.

    While requests decode, the decode step bound (the user's TPOT target over the steps between
    two tokens) bounds both: it wins over the low end too (the step's first prefill still
    advances by the floor).
    """
    model, limits = rule.model, rule.limits
    deepest = max((history + remaining for history, remaining in prefills), default=0)
    deepest = min(deepest, limits.max_model_len)
    low = fixed_ms + model.request_ms(limits.floor_tokens, deepest)
    high = max(low, fixed_ms + model.request_ms(limits.cap_tokens, deepest))
    if decoding and limits.decode_step_ms is not None:
        low, high = min(low, limits.decode_step_ms), min(high, limits.decode_step_ms)
    return low, high


def plan_target(
    rule: ChunkRule,
    prefills: Sequence[tuple[int, int]],
    *,
    fixed_ms: float | None = None,
    inflight_ms: float = 0.0,
    decoding: int = 0,
    load: Load = NO_LOAD,
    decode_left: Sequence[float] = (),
    steps_per_token: int = 1,
) -> Plan:
    """The plan whose target minimises the predicted mean TTFT of ``prefills`` (see the module docstring).

    ``prefills``: (history_tokens, remaining_tokens) in FCFS order; ``fixed_ms``: each
    batch's cost before any prefill (the model's fixed cost plus the decodes it carries);
    ``inflight_ms``: the largest predicted time of a batch still in flight; ``decoding``:
    how many requests are decoding (rule 4 applies when there are any); ``load``: the
    traffic, for the requests expected meanwhile and for rule 4's fixed chunk (its jobs are
    the held prefills when it has none). Prefills after the first ``PLAN_MAX_PREFILLS``
    count as a queue behind them: their number and tokens. Always returns a finite target
    within the bounds.
    """
    model = rule.model
    fixed_ms = model.fixed_ms if fixed_ms is None else max(float(fixed_ms), model.fixed_ms)
    if not math.isfinite(fixed_ms):
        fixed_ms = model.fixed_ms
    efficient = rule.efficient_chunks()
    positions = [(max(0, int(h)), int(r)) for h, r in prefills if r > 0]
    held, behind = positions[:PLAN_MAX_PREFILLS], positions[PLAN_MAX_PREFILLS:]
    queued = (len(behind), sum(r for _, r in behind))
    low, high = target_bounds(rule, held, fixed_ms, decoding)
    if not held or high <= low * (1.0 + 1e-6):
        return Plan(high, fixed_ms, efficient)
    if not load.jobs:
        load = dataclasses.replace(load, jobs=tuple(held))
    batch_tokens = math.inf
    paced = decoding and rule.limits.decode_step_ms is not None  # the user's TPOT target bounds the batches
    if decoding and not paced:
        # Decodes wait for every batch: none longer, on average, than the batches rule 4's chunk
        # would make of the prefills held and queued, and no chunk larger than that chunk, so that
        # at any history no batch is longer than its. It is chosen for the traffic at large: at its
        # steady rate, not a burst's.
        tuned = chunk_for_decodes(rule, load.steady(), fixed_ms, len(positions), TUNED_CHUNK_SLACK)
        efficient, batch_tokens = efficient.capped(tuned), int(tuned)
        high = min(high, max(low, fixed_chunk_batch_ms(rule, held, tuned, fixed_ms, queued[1])))
        if high <= low * (1.0 + 1e-6):
            return Plan(high, fixed_ms, efficient, batch_tokens)
    candidates = low * (high / low) ** _GRID_STEPS
    costs, _ = predicted_ttft_ms(rule, held, candidates, fixed_ms, inflight_ms, efficient, load, queued)
    best = int(np.argmin(costs))
    if not np.isfinite(costs[best]):
        return Plan(high, fixed_ms, efficient, batch_tokens)
    # Refine between the neighbours of the best candidate.
    lo_index, hi_index = max(best - 1, 0), min(best + 1, len(candidates) - 1)
    fine = candidates[lo_index] * (candidates[hi_index] / candidates[lo_index]) ** _GRID_STEPS
    fine_costs, _ = predicted_ttft_ms(rule, held, fine, fixed_ms, inflight_ms, efficient, load, queued)
    candidates = np.concatenate([candidates, fine])
    costs = np.concatenate([costs, fine_costs])
    best = int(np.argmin(costs))
    if not decoding and not queued[0]:  # (the chunk-by-chunk check sees the held prefills alone)
        target = refine_for_few_chunks(rule, held, float(candidates[best]), low, high, fixed_ms, inflight_ms, efficient)
        lowers = [c for c in model.step_lowers() if c <= rule.limits.cap_tokens]
        tiles = rule.limits.granule_tokens > 1 or bool(lowers)
        plan = Plan(target, fixed_ms, efficient)
        plan = constant_chunk_if_better(rule, held, plan, high, inflight_ms, lowers, spread=tiles)
        return checked_plan(rule, held, plan, high, inflight_ms)  # never behind the simple alternative
    if paced:  # within the user's bound, the least mean TTFT
        return Plan(float(candidates[best]), fixed_ms, efficient, batch_tokens)
    # Decodes ride in these batches and wait for each one: the target of the least predicted mean
    # end-to-end latency of the requests in flight, the prefills' TTFT and the decodes' wait.
    left = np.array(list(decode_left) or [math.inf] * decoding, dtype=np.float64)
    costs, work_ms, count = predicted_ttft_ms(
        rule, held, candidates, fixed_ms, inflight_ms, efficient, load, queued, counted=True
    )
    wait_ms = decodes_wait_ms(candidates, work_ms, fixed_ms, left, steps_per_token)
    objective = (costs * count + wait_ms) / (count + len(left))
    return Plan(float(candidates[int(np.argmin(objective))]), fixed_ms, efficient, batch_tokens)


def mean_ttft(
    request_ms: np.ndarray, chunks: np.ndarray, fixed_ms: float, batch_ms: np.ndarray, drain_ms: np.ndarray,
    load: Load, job_service_ms: np.ndarray | None = None, queued: tuple[int, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Mean TTFT of the held prefills and of the requests expected meanwhile, the held ones'
    total time, and how many requests the mean is over, per candidate (rows).

    ``request_ms`` (candidates, prefills): each prefill's own work; ``chunks``: how many chunks
    it takes; ``batch_ms`` (candidates): the time a batch may take. Prefills finish in FCFS
    order; a batch's fixed cost is paid once however many prefills share it, so the first j
    need as many batches as their work fills at ``batch_ms`` each, and never fewer than the
    chunks of the longest of them (one prefill's chunks cannot share a batch). The j-th's
    first token comes after that work and the drain. ``queued``: how many requests wait
    behind them, and one such request's own work and chunks; they share batches as the held
    ones do, and the i-th of n has its first token after the held work, i n-ths of theirs
    and the drain. Requests expected to arrive while all those run (at ``load``'s rate)
    find half that work left on average, queue behind each other (``queue_wait_ms`` over
    ``job_service_ms``, the pipeline time of the latest prefills, or of the held ones), then
    do their own work and drain: the more load, the more the pipeline's throughput counts
    against any one prompt's fill and drain.
    """
    room_ms = np.maximum(batch_ms - fixed_ms, 1e-9)[:, None]
    own_ms = np.cumsum(request_ms, axis=1)
    batches = np.maximum(own_ms / room_ms, np.maximum.accumulate(chunks, axis=1))
    work_ms = own_ms + fixed_ms * batches  # (candidates, prefills): the first j prefills' time
    total_ms, count = work_ms[:, -1], work_ms.shape[1]
    held_ms = work_ms.sum(axis=1) + count * drain_ms
    all_ms = total_ms
    if queued is not None and queued[0] > 0:
        waiting, one_ms, one_chunks = queued
        queue_ms = waiting * one_ms + fixed_ms * np.maximum(waiting * one_ms / room_ms[:, 0], one_chunks)
        held_ms = held_ms + waiting * (total_ms + drain_ms) + queue_ms * (waiting + 1) / 2
        count, all_ms = count + waiting, total_ms + queue_ms
    if load.arrivals_per_ms <= 0:
        return held_ms / count, total_ms, np.full_like(total_ms, count)
    service_ms = request_ms + fixed_ms * chunks if job_service_ms is None else job_service_ms
    wait_ms = queue_wait_ms(load, service_ms)
    future = load.arrivals_per_ms * all_ms
    future_ms = all_ms / 2 + wait_ms + service_ms.mean(axis=1) + drain_ms
    return (held_ms + future * future_ms) / (count + future), total_ms, count + future


def _prefill_work(
    rule: ChunkRule, prefills: Sequence[tuple[int, int]], targets: np.ndarray, fixed_ms: float,
    efficient: EfficientChunks,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Per target and prefill: its own work (ms) and its chunks under the chunk rule, integrated
    over the prompt; and the most of a batch each prefill can take (its largest chunk's own time)."""
    model = rule.model
    starts = np.array([float(h) for h, _ in prefills])[:, None]
    remaining = np.array([float(r) for _, r in prefills])
    histories = starts + remaining[:, None] * PROMPT_NODES[None, :]  # (prefills, nodes)
    chunk = rule.chunk_alone_many(histories[None, :, :], targets[:, None, None], fixed_ms, efficient)
    # Only the context can leave no room (at a prompt's very end): every chunk is at least one token.
    chunk = np.minimum(np.maximum(chunk, 1.0), remaining[None, :, None])
    # (targets, prefills): each prefill's own work, the time per token of the chunk covering each position
    request_ms = prompt_work_ms(model, starts[None, :, :], histories[None, :, :], chunk, remaining)
    chunks = ((1.0 / chunk) @ PROMPT_WEIGHTS) * remaining
    largest_ms = np.max(model.request_ms_many(chunk, histories[None, :, :]), axis=2)  # (targets, prefills)
    return request_ms, chunks, largest_ms


def predicted_ttft_ms(
    rule: ChunkRule,
    held: Sequence[tuple[int, int]],
    targets: np.ndarray,
    fixed_ms: float,
    inflight_ms: float,
    efficient: EfficientChunks,
    load: Load = NO_LOAD,
    queued: tuple[int, int] = (0, 0),
    counted: bool = False,
) -> tuple[np.ndarray, ...]:
    """Per target (vectors): the mean predicted TTFT of ``held``, of the ``queued`` (requests,
    tokens) behind them and of the requests expected meanwhile (like ``load``'s jobs), and the
    held prefills' total work in ms (and, ``counted``, how many requests the mean is over)."""
    targets = np.asarray(targets, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # One pass over the held prefills, the load's jobs and one request of the queue's mean
        # size (from no history), the columns then taken apart: the same numbers as three passes.
        jobs = list(load.jobs) if load.arrivals_per_ms > 0 else []
        behind_one = [(0, max(1.0, queued[1] / queued[0]))] if queued[0] > 0 else []
        every_ms, every_chunks, every_largest_ms = _prefill_work(
            rule, [*held, *jobs, *behind_one], targets, fixed_ms, efficient
        )
        count, jobs_end = len(held), len(held) + len(jobs)
        request_ms, chunks, largest_ms = every_ms[:, :count], every_chunks[:, :count], every_largest_ms[:, :count]
        job_service_ms = None
        if jobs:
            job_service_ms = every_ms[:, count:jobs_end] + fixed_ms * every_chunks[:, count:jobs_end]
        behind = None
        if behind_one:
            behind = (queued[0], every_ms[:, jobs_end], every_chunks[:, jobs_end])
            largest_ms = np.concatenate([largest_ms, queued[0] * every_largest_ms[:, jobs_end:]], axis=1)
        # The largest batch: the target, when the prefills' chunks can fill it, else all of them at once.
        batch_ms = np.minimum(targets, fixed_ms + largest_ms.sum(axis=1))
        drain_ms = (rule.num_stages - 1) * np.maximum(batch_ms, inflight_ms)
        mean_ttft_ms, work_ms, count = mean_ttft(
            request_ms, chunks, fixed_ms, targets, drain_ms, load, job_service_ms, behind
        )
    ok = np.isfinite(mean_ttft_ms) & (work_ms > 0)
    figures = np.where(ok, mean_ttft_ms, np.inf), np.where(ok, work_ms, np.inf)
    return (*figures, count) if counted else figures


def decodes_wait_ms(
    targets: np.ndarray, work_ms: np.ndarray, fixed_ms: float, decode_left: np.ndarray, steps_per_token: int
) -> np.ndarray:
    """What the decoding requests wait in all, per target, for the prefills' share of the batches.

    The held prefills take about ``work_ms / T`` batches of T each, and every batch is
    ``T - fixed_ms`` longer than one of decodes alone. A decode with n tokens left sees a
    batch every step until it ends: at most ``n * steps_per_token`` of them (a token every
    pipeline round, or every step under asynchronous scheduling). One that outlasts the
    prefills waits their work whatever T is; one that ends first waits less with shorter
    batches, which is what makes the objective choose them."""
    steps = work_ms / targets
    seen = np.minimum(steps[:, None], steps_per_token * decode_left[None, :]).sum(axis=1)
    return seen * np.maximum(targets - fixed_ms, 0.0)
