"""The chunk rule of dynamic chunked pipeline parallelism (CPP): batch-time target and per-step budget.

Under pipeline parallelism a long prompt's chunks follow each other through P stages.
With chunk times t_i (one stage's time, the slowest stage's) the prompt's first token
is ready after

    sum_i t_i + (P - 1) * max_i t_i

the pipeline's work plus its fill and drain, which the largest chunk sets. Small
chunks shorten the fill and drain but pay the fixed per-step cost c0 more often;
large chunks do the opposite. The rule, from the fitted latency model t(C, H)
(core/cpp_latency_model.py) alone:

1. Every batch gets one time budget, the *target* T. A prefill at history H gets the
   largest chunk whose time fits what is left of T, but never more than C*(H), the
   size that does the prompt's work fastest: over a whole prompt the chunks' attention
   over history sums to c4 * (N^2 - sum C_i^2) / 2, so a chunk of C tokens costs
   (c0 + c2*H)/C + (c3 - c4/2)*C per token beyond what no chunking changes, least at
   C*(H) = sqrt((c0 + c2*H) / (c3 - c4/2)). Where the target binds, chunks shrink as
   history grows, so batch times stay equal and the stages stay in step; where C*
   binds (early in a prompt) chunk times rise, which costs the pipeline nothing.
2. T is chosen (``ChunkRule.plan_target``) to minimise the predicted mean TTFT of the
   prefills the scheduler holds, given P: for each candidate T the chunks of every
   held prefill follow from rule 1, their total time is integrated over the prompt
   (Simpson's rule on the chunk-size curve), the TTFT of the j-th prefill in FCFS
   order is the work of prefills 1..j plus (P - 1) times the largest chunk time. One
   prompt at a shallow pipeline wants large chunks; a deep pipeline wants smaller ones
   to shorten the fill; a backlog of prompts wants the most tokens per millisecond.
   When the first prefill needs few chunks (up to ``EXACT_MAX_CHUNKS``) the result is
   checked chunk by chunk against the targets at which its chunk count steps, where the
   best target lies. The search runs only when the set of prefills changes, never per
   step.
3. The engine keeps at most P batches in flight, so a batch shorter than the one P
   places before it cannot start earlier: a fall in batch time is not a gain for one
   pipeline round. So chunks are any whole number of tokens (a coarser grid makes batch
   times fall at every step down in size), and the planner counts the largest batch
   still in flight in the fill and drain term, so T does not drop for a gain it cannot
   have.
4. Decodes ride in the same batches and wait for each one, so their inter-token latency
   grows with T. When decodes are present the planner takes the shortest T whose
   prefill work is within ``DECODE_WORK_SLACK`` (2%) of that of the TTFT-best T: where
   the work is flat in T (deep histories, small fixed cost) batches get much shorter for
   almost nothing. ``max_batch_ms`` bounds T for an explicit latency objective.

``StepBudget`` applies rule 1 within one scheduling step: running decodes are reserved
first (never cut), then each prefill, in vLLM's order, is granted a chunk; the step's
first prefill always advances by at least the floor (``min_chunk``), so prefills never
starve behind decodes. Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from vllm_ascend.core.cpp_latency_model import LatencyModel

__all__ = ["DEFAULT_FLOOR_TOKENS", "ChunkLimits", "ChunkRule", "StepBudget"]

DEFAULT_FLOOR_TOKENS = 64  # the step's first prefill advances by at least this much
PLAN_MAX_PREFILLS = 16  # held prefills the target is planned for (FCFS head)
_PLAN_PANELS = 8  # Simpson panels per prefill
_PLAN_GRID = 24  # candidate targets per search round (two rounds)
_GRID_STEPS = np.linspace(0.0, 1.0, _PLAN_GRID)  # candidates: low * (high / low) ** step
_NODES = np.linspace(0.0, 1.0, 2 * _PLAN_PANELS + 1)  # Simpson nodes over a prefill's remaining tokens
_SIMPSON = np.array([1.0] + [4.0, 2.0] * (_PLAN_PANELS - 1) + [4.0, 1.0]) / (6.0 * _PLAN_PANELS)
EXACT_MAX_CHUNKS = 48  # a first prefill of at most this many chunks is planned chunk by chunk
_STEP_SEARCH_ROUNDS = 16  # bisections for the target at which a chunk count steps
DECODE_WORK_SLACK = 0.02  # with decodes in the batches: the shortest batch within 2% of the best work


def whole_tokens(tokens: float) -> int:
    """Round down to whole tokens, forgiving float error in a root that is exact in theory."""
    if not tokens < 1e15:
        return 10**15
    return max(0, int(math.floor(tokens + 1e-9)))


@dataclass(frozen=True)
class ChunkLimits:
    """What bounds a chunk besides the model: vLLM's caps and the user's settings."""

    max_chunk_tokens: int  # vLLM's per-step token budget (max_num_batched_tokens)
    max_model_len: int
    min_chunk_tokens: int = DEFAULT_FLOOR_TOKENS  # the step's first prefill advances by at least this
    smooth_factor: float = 1.0  # 1: the rule's chunk; < 1 blends it towards max_chunk_tokens
    tail_tolerance: float = 0.0  # a request's final tail may take the target * (1 + this)
    max_batch_ms: float | None = None  # upper bound of the target

    @property
    def floor_tokens(self) -> int:
        return max(1, min(self.min_chunk_tokens, self.max_chunk_tokens))

    @property
    def cap_tokens(self) -> int:
        return max(1, self.max_chunk_tokens)


class ChunkRule:
    """A latency model with its limits: the chunk for a time, the cheapest chunk, and the target."""

    def __init__(self, model: LatencyModel, limits: ChunkLimits, num_stages: int) -> None:
        self.model = model
        self.limits = limits
        self.num_stages = max(1, int(num_stages))

    def with_model(self, model: LatencyModel) -> ChunkRule:
        return ChunkRule(model, self.limits, self.num_stages)

    def with_limits(self, **changes) -> ChunkRule:
        return ChunkRule(self.model, replace(self.limits, **changes), self.num_stages)

    # ------------------------------------------------------------------ chunk sizes
    def efficient_tokens(self, history_tokens: float) -> float:
        """C*(H): the chunk size that does a prompt's work in the least time around this history.

        Over a whole prompt the chunks' attention over history adds up to
        c4 * (N^2 - sum C_i^2) / 2, so a chunk of C tokens effectively costs
        (c0 + c2*H)/C + (c3 - c4/2)*C per token beyond the terms no chunking changes;
        the minimum is at sqrt((c0 + c2*H) / (c3 - c4/2)). Without a net quadratic term
        (c3 <= c4/2) larger chunks are always cheaper: inf.
        """
        model = self.model
        net_quadratic_ms = model.c3_ms - model.c4_ms / 2.0
        if net_quadratic_ms <= 0:
            return math.inf
        return math.sqrt((model.c0_ms + model.c2_ms * history_tokens) / net_quadratic_ms)

    def _context_cap(self, history_tokens: int) -> int:
        return min(self.limits.cap_tokens, whole_tokens(self.limits.max_model_len - history_tokens))

    def wanted_chunk(self, history_tokens: int, remaining_tokens: int, target_ms: float) -> int:
        """The chunk of a request alone in a batch of ``target_ms``: rule 1, smoothing, floor and caps."""
        if remaining_tokens <= 0:
            return 0
        limits = self.limits
        raw = min(
            self.model.chunk_for_time(history_tokens, target_ms),
            self.efficient_tokens(history_tokens),
            float(limits.max_chunk_tokens),
        )
        blended = limits.max_chunk_tokens + limits.smooth_factor * (raw - limits.max_chunk_tokens)
        cap = self._context_cap(history_tokens)
        chunk = min(max(whole_tokens(blended), limits.floor_tokens), cap)
        if remaining_tokens <= chunk:
            return remaining_tokens  # the request's final tail
        if chunk <= 0:  # the request runs into max_model_len: what is left of the context
            context_left = limits.max_model_len - history_tokens
            return max(0, min(remaining_tokens, context_left, limits.max_chunk_tokens))
        if (
            remaining_tokens - chunk < max(chunk // 4, limits.floor_tokens)
            and remaining_tokens <= min(limits.max_chunk_tokens, limits.max_model_len - history_tokens)
            and self.model.time_ms(remaining_tokens, history_tokens) <= (1.0 + limits.tail_tolerance) * target_ms
        ):
            return remaining_tokens  # merge a small tail: no extra step for it
        return chunk

    def chunk_within(self, history_tokens: int, budget_ms: float, remaining_tokens: int) -> int:
        """Largest chunk with request_ms <= budget_ms (or all remaining tokens); 0 if none fits."""
        if remaining_tokens <= 0 or not budget_ms > 0:
            return 0
        limits = self.limits
        limit = min(remaining_tokens, limits.max_chunk_tokens, limits.max_model_len - history_tokens)
        if limit <= 0:
            return 0
        raw = self.model.chunk_for_request_ms(history_tokens, budget_ms)
        if raw >= limit:
            return limit
        return whole_tokens(raw)

    # ------------------------------------------------------------------ the target
    def target_bounds(self, prefills: Sequence[tuple[int, int]], fixed_ms: float) -> tuple[float, float]:
        """Targets worth searching: a floor-sized chunk at the deepest history, up to a full cap there.

        ``max_batch_ms`` bounds both: the user's latency bound wins over the low end too (the
        step's first prefill still advances by the floor).
        """
        model, limits = self.model, self.limits
        deepest = max((history + remaining for history, remaining in prefills), default=0)
        low = fixed_ms + model.request_ms(limits.floor_tokens, deepest)
        high = max(low, fixed_ms + model.request_ms(limits.cap_tokens, deepest))
        if limits.max_batch_ms is not None:
            low, high = min(low, limits.max_batch_ms), min(high, limits.max_batch_ms)
        return low, high

    def plan_target(
        self,
        prefills: Sequence[tuple[int, int]],
        *,
        fixed_ms: float | None = None,
        inflight_ms: float = 0.0,
        decoding: int = 0,
    ) -> float:
        """The batch time that minimises the predicted mean TTFT of ``prefills`` (rule 2).

        ``prefills``: (history_tokens, remaining_tokens) in FCFS order; ``fixed_ms``: each
        batch's cost before any prefill (c0 plus the decodes it carries; default c0);
        ``inflight_ms``: the largest predicted time of a batch still in flight;
        ``decoding``: how many requests are decoding (rule 4 applies when there are any).
        """
        model = self.model
        fixed_ms = model.c0_ms if fixed_ms is None else max(float(fixed_ms), model.c0_ms)
        held = [(int(h), int(r)) for h, r in prefills if r > 0][:PLAN_MAX_PREFILLS]
        low, high = self.target_bounds(held, fixed_ms)
        if not held or high <= low * (1.0 + 1e-6):
            return high
        candidates = low * (high / low) ** _GRID_STEPS
        costs, work = self._predicted_ttft_ms(held, candidates, fixed_ms, inflight_ms)
        best = int(np.argmin(costs))
        if not np.isfinite(costs[best]):
            return high
        # Refine between the neighbours of the best candidate.
        lo_index, hi_index = max(best - 1, 0), min(best + 1, len(candidates) - 1)
        fine = candidates[lo_index] * (candidates[hi_index] / candidates[lo_index]) ** _GRID_STEPS
        fine_costs, fine_work = self._predicted_ttft_ms(held, fine, fixed_ms, inflight_ms)
        candidates = np.concatenate([candidates, fine])
        costs, work = np.concatenate([costs, fine_costs]), np.concatenate([work, fine_work])
        best = int(np.argmin(costs))
        if not decoding:
            return self._refine_for_few_chunks(held, float(candidates[best]), low, high, fixed_ms, inflight_ms)
        # Decodes ride in these batches and wait for each one: take the shortest batch that
        # does the prefills' work within DECODE_WORK_SLACK of the best target's.
        shorter = (candidates <= candidates[best]) & (work <= work[best] * (1.0 + DECODE_WORK_SLACK))
        return float(np.min(candidates[shorter]))

    def _exact_chunk_ms(self, history: int, remaining: int, target_ms: float, fixed_ms: float, limit: int) -> list:
        """The batch times of one prefill chunked alone, step by step as ``StepBudget`` grants (at most ``limit``)."""
        model, floor = self.model, self.limits.floor_tokens
        budget_ms = target_ms * (1.0 + 1e-9) - fixed_ms
        times: list[float] = []
        while remaining > 0 and len(times) < limit:
            wanted = self.wanted_chunk(history, remaining, target_ms)
            chunk = min(wanted, self.chunk_within(history, budget_ms, remaining))
            chunk = max(chunk, min(wanted, floor)) if fixed_ms > model.c0_ms else max(chunk, wanted)
            if chunk <= 0:
                break
            times.append(fixed_ms + model.request_ms(chunk, history))
            history, remaining = history + chunk, remaining - chunk
        return times if remaining <= 0 else []

    def _refine_for_few_chunks(
        self,
        held: Sequence[tuple[int, int]],
        target_ms: float,
        low: float,
        high: float,
        fixed_ms: float,
        inflight_ms: float,
    ) -> float:
        """Counting chunks as a continuous quantity misjudges the last one, by up to a few percent
        when a prefill has few chunks: between the targets at which its chunk count steps, the
        predicted TTFT rises with the target, so the best target is one of those steps. Compare,
        chunk by chunk, the target found with the least targets at which the first prefill fits
        in one chunk fewer, as many, or one more."""

        def exact_cost(target: float) -> tuple[float, int]:
            total, cumulative, largest, first_chunks = 0.0, 0.0, inflight_ms, 0
            for history, remaining in held:
                times = self._exact_chunk_ms(history, remaining, target, fixed_ms, EXACT_MAX_CHUNKS)
                if not times:
                    return math.inf, EXACT_MAX_CHUNKS + 1
                first_chunks = first_chunks or len(times)
                cumulative += sum(times)
                total += cumulative
                largest = max(largest, *times)
            return total / len(held) + (self.num_stages - 1) * largest, first_chunks

        first_history, first_remaining = held[0]

        def first_fits(target: float, count: int) -> bool:
            return bool(self._exact_chunk_ms(first_history, first_remaining, target, fixed_ms, count))

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

    def _predicted_ttft_ms(
        self,
        held: Sequence[tuple[int, int]],
        targets: np.ndarray,
        fixed_ms: float,
        inflight_ms: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per target (vectors): the mean predicted TTFT of ``held``, and their total work in ms."""
        model, limits = self.model, self.limits
        c1, c2, c3, c4 = model.c1_ms, model.c2_ms, model.c3_ms, model.c4_ms
        histories = np.array([h + r * _NODES for h, r in held])  # (prefills, nodes)
        remaining = np.array([float(r) for _, r in held])
        history = histories[None, :, :]
        spare = targets[:, None, None] - fixed_ms - c2 * history
        slope = c1 + c4 * history
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for_time = np.where(
                spare > 0, 2.0 * spare / (slope + np.sqrt(slope * slope + 4.0 * c3 * np.maximum(spare, 0.0))), 0.0
            )
            net_quadratic = c3 - c4 / 2.0
            efficient = np.sqrt((fixed_ms + c2 * history) / net_quadratic) if net_quadratic > 0 else np.inf
            cap = np.minimum(float(limits.cap_tokens), limits.max_model_len - history)
            chunk = np.minimum(np.minimum(for_time, efficient), cap)
            chunk = limits.max_chunk_tokens + limits.smooth_factor * (chunk - limits.max_chunk_tokens)
            chunk = np.minimum(np.maximum(chunk, limits.floor_tokens), cap)
            feasible = np.all(chunk > 0, axis=(1, 2))
            chunk = np.maximum(chunk, 1.0)
            # A chunk covering position H starts at about H - C/2: its attention over history
            # and its history read are counted from there.
            per_token_ms = (fixed_ms + c2 * (history - chunk / 2)) / chunk + c1 + (c3 - c4 / 2) * chunk + c4 * history
            work_ms = (per_token_ms @ _SIMPSON) * remaining  # (targets, prefills)
            chunk_ms = fixed_ms + c2 * history + chunk * (c1 + c3 * chunk + c4 * history)
        largest_ms = np.maximum(np.max(chunk_ms, axis=(1, 2)), inflight_ms)
        mean_ttft_ms = np.cumsum(work_ms, axis=1).mean(axis=1) + (self.num_stages - 1) * largest_ms
        ok = feasible & np.isfinite(mean_ttft_ms)
        return np.where(ok, mean_ttft_ms, np.inf), np.where(ok, work_ms.sum(axis=1), np.inf)


class StepBudget:
    """One scheduling step's time budget (rule 1): reserve decodes, grant prefills, charge, refund.

    Decodes are reserved at step start as if already in the batch, so charging one as
    reserved costs a dictionary lookup; ``settle`` drops the reservations of decodes the
    step did not schedule after all (preempted before their turn).
    """

    def __init__(self, rule: ChunkRule, target_ms: float | None = None) -> None:
        self.rule = rule
        self.target_ms = float(target_ms) if target_ms is not None else rule.target_bounds([], rule.model.c0_ms)[1]
        self.start()

    def start(self) -> None:
        """A new step: only the fixed cost c0 is spent."""
        self.used_ms = self.rule.model.c0_ms  # c0 + charged requests, reserved decodes included
        self.charged_ms = 0.0  # charged requests only
        # request -> chunk_tokens, history_tokens, ms; a new dict each step, so a step's stays as it was
        self.charged: dict[str, tuple[int, int, float]] = {}
        self.prefills: set[str] = set()

    def reserve_decodes(self, decodes: Iterable[tuple[str, int, int]]) -> None:
        """Book running decodes, (request, new_tokens, history_tokens), before any prefill: decodes are never cut."""
        request_ms = self.rule.model.request_ms
        charged = self.charged
        total_ms = 0.0
        for request_id, new_tokens, history_tokens in decodes:
            cost_ms = request_ms(new_tokens, history_tokens)
            charged[request_id] = (new_tokens, history_tokens, cost_ms)
            total_ms += cost_ms
        self.used_ms += total_ms
        self.charged_ms += total_ms

    def grant(self, history_tokens: int, remaining_tokens: int, allowed_tokens: int) -> int:
        """Tokens a prefill at ``history_tokens`` with ``remaining_tokens`` left may take now (<= allowed)."""
        rule, target_ms = self.rule, self.target_ms
        wanted = rule.wanted_chunk(history_tokens, remaining_tokens, target_ms)
        # The relative 1e-9 absorbs rounding: a chunk sized for the target must fit it.
        chunk = min(
            wanted, rule.chunk_within(history_tokens, target_ms * (1.0 + 1e-9) - self.used_ms, remaining_tokens)
        )
        if (
            wanted == remaining_tokens
            and chunk < remaining_tokens
            and self.used_ms + rule.model.request_ms(remaining_tokens, history_tokens)
            <= (1.0 + rule.limits.tail_tolerance) * target_ms
        ):
            chunk = remaining_tokens  # the whole tail: no extra step for it
        if not self.prefills:
            # The step's first prefill advances by at least the floor (or its whole tail),
            # even when decodes fill the budget; alone in the batch it gets its own chunk.
            chunk = max(chunk, min(wanted, rule.limits.floor_tokens))
            if not self.charged:
                chunk = max(chunk, wanted)
        return max(0, min(chunk, allowed_tokens))

    def charge(self, request_id: str, new_tokens: int, history_tokens: int) -> None:
        """A request is in the batch with ``new_tokens``: count its cost.

        A decode scheduled as reserved is already in; one scheduled otherwise (more or
        fewer speculative tokens) is counted again. Any request not reserved as a
        decode is a prefill.
        """
        previous = self.charged.get(request_id)
        if previous is not None:
            if previous[0] == new_tokens and previous[1] == history_tokens:
                return
            self.used_ms -= previous[2]
            self.charged_ms -= previous[2]
        else:
            self.prefills.add(request_id)
        cost_ms = self.rule.model.request_ms(new_tokens, history_tokens)
        self.used_ms += cost_ms
        self.charged_ms += cost_ms
        self.charged[request_id] = (new_tokens, history_tokens, cost_ms)

    def refund(self, request_id: str) -> None:
        """A request charged (or reserved) in this step leaves it: preempted within the step."""
        charged = self.charged.pop(request_id, None)
        if charged is not None:
            self.used_ms -= charged[2]
            self.charged_ms -= charged[2]
        self.prefills.discard(request_id)

    def settle(self, scheduled: Collection[str]) -> None:
        """End of step: refund reservations of decodes the step did not schedule.

        Every scheduled request is charged, so equal sizes mean equal sets: the usual
        step costs one comparison.
        """
        if len(self.charged) != len(scheduled):
            for request_id in [r for r in self.charged if r not in scheduled]:
                self.refund(request_id)

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The step's (chunk_tokens, history_tokens) pairs, in the order they were charged."""
        return tuple((chunk, history) for chunk, history, _ in self.charged.values())

    def predicted_ms(self) -> float:
        """The model's time of the step's charged requests (c0 included)."""
        return self.rule.model.c0_ms + self.charged_ms
