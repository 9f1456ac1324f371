"""The chunk rule of dynamic chunked pipeline parallelism (CPP): the chunk for a time, and the step budget.

Under pipeline parallelism a long prompt's chunks follow each other through P stages.
With chunk times t_i (one stage's time, the slowest stage's) the prompt's first token
is ready after

    sum_i t_i + (P - 1) * max_i t_i

the pipeline's work plus its fill and drain, which the largest chunk sets. The rule,
from the measured latency model t(C, H) (core/cpp_latency_model.py) alone:

1. Every batch gets one time budget, the *target* T (core/cpp_planner.py chooses it).
   A prefill at history H gets the largest chunk whose step fits T, but never more than
   C*(H), the chunk that does the prompt's work in the least time around H: the chunk
   whose tokens, centred on H, cost the least per token,

       C*(H) = argmin_C (F + r(C, H - C/2)) / C

   with F each batch's fixed cost and r a request's own cost. It is found on the
   measured surface itself (a search over chunk sizes at a grid of histories, once per
   plan), so it follows a cache regime, a knee or a tile step wherever the profile saw
   one. Sizes within the profile's noise of the least cost count as equal (the smallest
   is taken), and C* never falls as H grows. Where T binds, chunks shrink as history
   grows and batch times stay equal; where C* binds (early in a prompt) chunk times
   rise, which costs the pipeline nothing.
2. A chunk is a whole multiple of the granule (1 unless the profile measured a tile
   step), at least the floor (``min_chunk``) and at most vLLM's token budget and what
   is left of the context; ``smooth_factor`` < 1 blends it towards the token budget. A
   request's small last tail (under a quarter of the chunk, or the floor) is merged into
   its last chunk when that step still fits T (times ``1 + tail_tolerance``).
3. ``StepBudget`` (core/cpp_step_budget.py) applies rule 1 within one scheduling step:
   running decodes are reserved first (never cut), then the running prefills and the
   first waiting requests are allotted their chunks, the running ones first and the
   waiting ones in response-ratio order, each cut to what is left of T, and at most one
   of them left unfinished; a prefill visited without an allotment gets tokens only if it
   finishes in the batch or has fewer left than the unfinished one. The step's first
   prefill always advances by at least the floor, so prefills never starve behind decodes.

``ChunkRule.chunk_alone`` (a request alone in a batch) is the one statement of rules 1
and 2; ``chunk_alone_many`` computes the same numbers for arrays, for the planner.
Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np
from vllm_ascend.core.cpp_latency_model import LatencyModel

__all__ = ["DEFAULT_FLOOR_TOKENS", "ChunkLimits", "ChunkRule", "EfficientChunks", "Plan"]

DEFAULT_FLOOR_TOKENS = 64  # the step's first prefill advances by at least this much
_EFFICIENT_HISTORIES = 48  # histories at which C*(H) is searched
_EFFICIENT_CHUNKS = 96  # chunk sizes searched at each
EFFICIENT_SLACK = 0.005  # per-token costs this close to the least count as equal (at least; more with noise)


def whole_tokens(tokens: float, granule: int = 1) -> int:
    """Round down to whole tokens (a multiple of ``granule`` once at least one), forgiving float error."""
    if not tokens < 1e15:
        return 10**15
    whole = max(0, int(math.floor(tokens + 1e-9)))
    return whole - whole % granule if whole >= granule else whole


@dataclass(frozen=True)
class ChunkLimits:
    """What bounds a chunk besides the model: vLLM's caps, the user's settings, the measured granule."""

    base_chunk_tokens: int  # vLLM's per-step token budget (max_num_batched_tokens)
    max_model_len: int
    min_chunk_tokens: int = DEFAULT_FLOOR_TOKENS  # the step's first prefill advances by at least this
    smooth_factor: float = 1.0  # 1: the rule's chunk; < 1 blends it towards base_chunk_tokens
    tail_tolerance: float = 0.0  # a request's final tail may take the target * (1 + this)
    # While requests decode, no batch longer than this: the TPOT target over the steps between
    # two of a decode's tokens (P under pipeline parallelism, 1 under asynchronous scheduling).
    decode_step_ms: float | None = None
    granule_tokens: int = 1  # chunks are multiples of this (a measured tile step), tails excepted

    @property
    def floor_tokens(self) -> int:
        """At least ``min_chunk_tokens``, rounded up to the granule: a part of a tile costs a whole tile."""
        floor = max(1, self.min_chunk_tokens)
        if self.granule_tokens > 1:
            floor = -(-floor // self.granule_tokens) * self.granule_tokens
        return min(floor, max(1, self.base_chunk_tokens))

    @property
    def cap_tokens(self) -> int:
        return max(1, self.base_chunk_tokens)


@dataclass(frozen=True)
class EfficientChunks:
    """C*(H) at a grid of histories for one fixed cost per batch; linear in between, flat beyond.

    And the sweet spots below a chunk: at the i-th history a chunk of ``sizes[k]`` tokens up to
    ``sizes[k + 1]`` takes ``instead[i][k]`` tokens when that size is cheaper per token than any
    other up to it (0: the chunk itself); at a history between two of the grid, the nearer's.
    """

    history_tokens: tuple[float, ...]
    chunk_tokens: tuple[float, ...]
    sizes: np.ndarray | None = field(default=None, compare=False)
    instead: np.ndarray | None = field(default=None, compare=False)  # [history][size]

    def at(self, history_tokens: float) -> float:
        histories, chunks = self.history_tokens, self.chunk_tokens
        j = bisect.bisect_right(histories, history_tokens) - 1
        if j < 0:
            return chunks[0]
        if j >= len(histories) - 1:
            return chunks[-1]
        weight = (history_tokens - histories[j]) / (histories[j + 1] - histories[j])
        return chunks[j] + weight * (chunks[j + 1] - chunks[j])

    def at_many(self, history_tokens: np.ndarray) -> np.ndarray:
        return np.interp(history_tokens, self.history_tokens, self.chunk_tokens)

    def capped(self, chunk_tokens: float, sweet: bool = True) -> EfficientChunks:
        """The same, never over ``chunk_tokens`` (``sweet=False``: and no sweet spot below a chunk either)."""
        chunks = tuple(min(c, float(chunk_tokens)) for c in self.chunk_tokens)
        return EfficientChunks(self.history_tokens, chunks, *((self.sizes, self.instead) if sweet else ()))

    def _nearest(self, history_tokens: np.ndarray) -> np.ndarray:
        histories = np.asarray(self.history_tokens)
        upper = np.minimum(np.searchsorted(histories, history_tokens), len(histories) - 1)
        lower = np.maximum(upper - 1, 0)
        nearer_upper = np.abs(histories[upper] - history_tokens) < np.abs(history_tokens - histories[lower])
        return np.where(nearer_upper, upper, lower)

    def sweet(self, history_tokens: float, chunk_tokens: float) -> float:
        """The chunk a rule that would take ``chunk_tokens`` takes: a sweet spot below it, or it."""
        if self.instead is None:
            return chunk_tokens
        histories = self.history_tokens
        upper = min(bisect.bisect_left(histories, history_tokens), len(histories) - 1)
        lower = max(upper - 1, 0)
        i = upper if histories[upper] - history_tokens < history_tokens - histories[lower] else lower
        k = bisect.bisect_right(self.sizes, chunk_tokens) - 1
        instead = float(self.instead[i, k]) if k >= 0 else 0.0
        return instead if instead > 0 else chunk_tokens

    def sweet_many(self, history_tokens: np.ndarray, chunk_tokens: np.ndarray) -> np.ndarray:
        """``sweet`` of arrays (broadcast together)."""
        if self.instead is None:
            return chunk_tokens
        k = np.searchsorted(self.sizes, chunk_tokens, side="right") - 1
        instead = self.instead[self._nearest(np.asarray(history_tokens, dtype=np.float64)), np.maximum(k, 0)]
        return np.where((k >= 0) & (instead > 0), instead, chunk_tokens)


@dataclass(frozen=True)
class Plan:
    """The batch-time target and what it was planned with: each batch's fixed cost and C*(H) for
    it; and the most prefill tokens one batch takes (a token budget, as a fixed chunk's)."""

    target_ms: float
    fixed_ms: float
    efficient: EfficientChunks
    batch_tokens: float = math.inf


def _sweet_spots(sizes: np.ndarray, per_token: np.ndarray, slack: float) -> tuple[np.ndarray, np.ndarray] | tuple:
    """``EfficientChunks.instead`` for the cost per token of ``sizes`` at each history (rows): below a chunk
    whose own cost is more than ``slack`` over the least of the sizes up to it, the largest size within
    ``slack`` of that least (a size a better kernel or tiling favours; none on a smooth device, where the
    cost per token falls with the size up to C*). () when there is none."""
    least = np.minimum.accumulate(per_token, axis=1)  # [history, k]: the least up to size k
    up_to = np.arange(len(sizes))
    near = (per_token[:, None, :] <= least[:, :, None] * (1.0 + slack)) & (up_to[None, :] <= up_to[:, None])[None]
    largest = len(sizes) - 1 - np.argmax(near[:, :, ::-1], axis=2)  # [history, k]
    instead = np.where(largest < up_to[None, :], sizes[largest], 0.0)
    return (sizes, instead) if instead.any() else ()


class ChunkRule:
    """A latency model with its limits: the chunk for a time, C*(H), and plans (core/cpp_planner.py)."""

    def __init__(self, model: LatencyModel, limits: ChunkLimits, num_stages: int) -> None:
        self.model = model
        self.limits = limits
        self.num_stages = max(1, int(num_stages))
        self._efficient_cache: dict[float, EfficientChunks] = {}

    def with_model(self, model: LatencyModel) -> ChunkRule:
        return ChunkRule(model, self.limits, self.num_stages)

    @functools.cached_property
    def base_tokens_per_s(self) -> float:
        """Prefill tokens a second in chunks of the base size without history (once per model)."""
        cap = self.limits.cap_tokens
        return 1000.0 * cap / self.model.time_ms(cap, 0)

    def with_limits(self, **changes) -> ChunkRule:
        return ChunkRule(self.model, replace(self.limits, **changes), self.num_stages)

    # ------------------------------------------------------------------ C*(H)
    def efficient_chunks(self, fixed_ms: float | None = None, sweet: bool = False) -> EfficientChunks:
        """C*(H) = argmin_C (F + r(C, H - C/2)) / C over chunk sizes from the floor to the cap (rule 1).

        Searched on the model at a grid of histories up to the context (linear and
        geometric steps, so early history is fine-grained); cached per fixed cost. With
        ``sweet``, also the sweet spots below a chunk (``EfficientChunks.instead``): a chunk
        that falls to one makes a batch shorter than the one before it, which the pipeline
        may not turn into a gain (at most P in flight), so only a plan checked chunk by
        chunk takes them (core/cpp_chunk_check.py).
        """
        model, limits = self.model, self.limits
        fixed_ms = model.fixed_ms if fixed_ms is None else max(float(fixed_ms), model.fixed_ms)
        cached = self._efficient_cache.get(fixed_ms)
        if cached is not None:
            return cached if sweet or cached.instead is None else cached.capped(math.inf, sweet=False)
        deepest = max(1.0, float(limits.max_model_len))
        histories = np.unique(
            np.concatenate(
                [
                    np.linspace(0.0, deepest, _EFFICIENT_HISTORIES // 2),
                    np.geomspace(min(128.0, deepest), deepest, _EFFICIENT_HISTORIES // 2),
                ]
            ).round()
        )
        low, high = float(limits.floor_tokens), float(limits.cap_tokens)
        chunks = np.geomspace(low, max(low, high), _EFFICIENT_CHUNKS).round()
        # And each odd point's size (a sweet spot is measured there and may hold nowhere else) and each
        # step's lower size (the end of a wave): the cheapest per token near them, on no grid.
        measured = np.array([*(c for c, _ in model.odd_points), *model.step_lowers()], dtype=np.float64)
        chunks = np.unique(np.concatenate([chunks, measured[(measured >= low) & (measured <= high)]]))
        if limits.granule_tokens > 1:
            granule = limits.granule_tokens
            aligned = np.arange(granule, high + 1, granule, dtype=np.float64)
            aligned = aligned[aligned >= low]
            if len(aligned):
                chunks = np.unique(np.concatenate([chunks[chunks < granule], aligned]))
        starts = np.maximum(0.0, histories[:, None] - chunks[None, :] / 2)
        per_token = (fixed_ms + model.request_ms_many(chunks[None, :], starts)) / chunks[None, :]
        # Sizes whose cost per token is within the profile's noise of the least are as good as
        # it: take the smallest of them, which shortens the pipeline's fill and drain and the
        # batches decodes wait for, instead of whichever one the noise favoured.
        slack = max(EFFICIENT_SLACK, model.scatter / 2)
        near_best = per_token <= per_token.min(axis=1, keepdims=True) * (1.0 + slack)
        best = chunks[np.argmax(near_best, axis=1)]
        # Never smaller deeper in the prompt: history adds a cost per request that does not grow
        # with the chunk, so it only ever favours larger chunks; a dip is measurement noise, and
        # following it would make batch times fall, which the pipeline cannot turn into a gain.
        best = np.maximum.accumulate(best)
        curve = EfficientChunks(
            tuple(histories.tolist()), tuple(best.tolist()), *_sweet_spots(chunks, per_token, slack)
        )
        if len(self._efficient_cache) > 64:
            self._efficient_cache.clear()
        self._efficient_cache[fixed_ms] = curve
        return self.efficient_chunks(fixed_ms, sweet)

    def plan(self, target_ms: float, fixed_ms: float | None = None) -> Plan:
        """A plan with this target (``fixed_ms``: each batch's cost before any prefill; default the model's)."""
        fixed_ms = self.model.fixed_ms if fixed_ms is None else max(float(fixed_ms), self.model.fixed_ms)
        return Plan(float(target_ms), fixed_ms, self.efficient_chunks(fixed_ms))

    # ------------------------------------------------------------------ the chunk for a time
    def _context_cap(self, history_tokens: float) -> int:
        return min(self.limits.cap_tokens, whole_tokens(self.limits.max_model_len - history_tokens))

    def chunk_alone(self, history_tokens: float, plan: Plan, fixed_ms: float) -> int:
        """Rules 1 and 2 for a request alone in a batch whose fixed cost is ``fixed_ms``: whole tokens, no tail."""
        limits = self.limits
        up_to = min(plan.efficient.at(history_tokens), float(limits.cap_tokens))
        raw = self.model.chunk_for_request_ms(history_tokens, plan.target_ms - fixed_ms, up_to)
        raw = plan.efficient.sweet(history_tokens, raw)  # (a sweet spot below it costs less per token)
        blended = limits.cap_tokens + limits.smooth_factor * (raw - limits.cap_tokens)
        chunk = max(whole_tokens(blended, limits.granule_tokens), limits.floor_tokens)
        return min(chunk, self._context_cap(history_tokens))

    def chunk_alone_many(
        self,
        history_tokens: np.ndarray,
        target_ms: np.ndarray,
        fixed_ms: float,
        efficient: EfficientChunks,
    ) -> np.ndarray:
        """``chunk_alone`` for arrays of histories and targets (as floats; the planner's form)."""
        limits = self.limits
        up_to = np.minimum(efficient.at_many(history_tokens), float(limits.cap_tokens))
        raw = self.model.chunk_for_time_many(history_tokens, self.model.fixed_ms + target_ms - fixed_ms, up_to)
        raw = efficient.sweet_many(history_tokens, raw)
        blended = limits.cap_tokens + limits.smooth_factor * (raw - limits.cap_tokens)
        granule = limits.granule_tokens
        whole = np.floor(blended + 1e-9)
        whole = np.where(whole >= granule, whole - np.mod(whole, granule), whole)
        context = np.floor(limits.max_model_len - np.asarray(history_tokens, dtype=np.float64) + 1e-9)
        return np.minimum(np.maximum(whole, limits.floor_tokens), np.minimum(float(limits.cap_tokens), context))

    def wanted_chunk(self, history_tokens: int, remaining_tokens: int, plan: Plan) -> int:
        """The chunk of a request alone in a batch of ``plan.target_ms``: rules 1 and 2 with its tail."""
        if remaining_tokens <= 0:
            return 0
        limits = self.limits
        chunk = self.chunk_alone(history_tokens, plan, self.model.fixed_ms)
        if remaining_tokens <= chunk:
            return remaining_tokens  # the request's final tail
        if chunk <= 0:  # the request runs into max_model_len: what is left of the context
            context_left = limits.max_model_len - history_tokens
            return max(0, min(remaining_tokens, context_left, limits.base_chunk_tokens))
        if (
            remaining_tokens - chunk < max(chunk // 4, limits.floor_tokens)
            and remaining_tokens <= min(limits.base_chunk_tokens, limits.max_model_len - history_tokens)
            and self.model.time_ms(remaining_tokens, history_tokens) <= (1.0 + limits.tail_tolerance) * plan.target_ms
        ):
            return remaining_tokens  # merge a small tail: no extra step for it
        return chunk

    def chunk_within(self, history_tokens: int, budget_ms: float, remaining_tokens: int) -> int:
        """Largest chunk with request_ms <= budget_ms (or all remaining tokens); 0 if none fits."""
        if remaining_tokens <= 0 or not budget_ms > 0:
            return 0
        limits = self.limits
        limit = min(remaining_tokens, limits.base_chunk_tokens, limits.max_model_len - history_tokens)
        if limit <= 0:
            return 0
        raw = self.model.chunk_for_request_ms(history_tokens, budget_ms, limit)
        if raw >= limit:
            return limit
        return whole_tokens(raw, limits.granule_tokens)
