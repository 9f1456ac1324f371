"""One scheduling step of dynamic chunked pipeline parallelism (CPP): the step budget.

``StepBudget`` applies the chunk rule (core/cpp_chunk_rule.py) within one step. Running
decodes are reserved first, at their true history (never cut); then the prefills are
sized, each its chunk cut to what is left of the batch-time target T.

Order. vLLM visits running requests in admission order, then waiting ones. Sized as
visited, an old long prompt fills the batch and a short one behind it gets a crumb a
step, one token step after step. So at step start the running prefills and the first
waiting requests are allotted their chunks (``allot``): the running ones first (a prefill
once started runs to its end), then the waiting ones, each group in order of response
ratio, (waited + work left) / work left: the shortest first, the mean TTFT's
gain, while a long prompt gains on a new short one as it waits, so a stream of short
prompts cannot starve it (highest response ratio next, which does not preempt: a short
prompt let in ahead of a started long one would then decode beside all of its chunks,
each token a pipeline round of them). Of the allotted prefills, one a step may stay
unfinished; the others finish in it. Two long prompts thus run one after the other, as
under a fixed chunk, not side by side at half pace each, which would delay the first
one's first token and keep the decodes beside them waiting on both. Prefills visited
without an allotment (waiting further back) get tokens only if they finish in the batch
or have fewer left than the unfinished one (shortest remaining first). A waiting request
that gets nothing this way is passed over, not a stop to admission (``admit``), so
shorter ones behind it are still reached; at most ``PASS_OVER_LIMIT`` per step, which
bounds the prefix-cache lookups the loop makes.

The step's first prefill always advances by at least the floor, so prefills never
starve behind decodes; under a TPOT target, while decodes fill its bound, once a pipeline
round (``floor_due``). Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, Plan
from vllm_ascend.core.cpp_running import ReservedDecodes, charged_of

__all__ = ["PASS_OVER", "PASS_OVER_LIMIT", "StepBudget"]

PASS_OVER = -1  # ``admit``'s answer for a waiting request to skip this step (the loop goes on to the next)
PASS_OVER_LIMIT = 8  # waiting requests one step passes over to reach a shorter one behind them
_VECTOR_DECODES = 16  # from this many decodes in a step, their costs come from one vectorised call
PACE_STEP = 0.005  # the decode step bound follows the measured pace in steps of at least 0.5%


class StepBudget:
    """One scheduling step's time budget (rule 3): reserve decodes, grant prefills, charge, refund.

    Decodes are reserved at step start as if already in the batch (``reserved``: arrays in
    running order, no per-decode entry built on the step's path), so charging one as reserved
    costs nothing; ``settle`` drops the reservations of decodes the step did not schedule
    after all (preempted before their turn). ``charged`` is every request in the step, the
    reserved decodes first, built when asked (records and tests).
    """

    def __init__(self, rule: ChunkRule, plan: Plan | None = None) -> None:
        self.rule = rule
        self.pace_scale = 1.0  # predicted over measured time (``pace``)
        self.floor_every = 1  # under a TPOT target, the floor is owed once in this many steps (a pipeline round)
        self._floorless_steps = 1 << 30  # paced steps in a row that advanced no prefill (none yet: the floor is owed)
        self.paced = False  # requests decode in this step's time, under a TPOT target (``decoding``)
        self._decode_table = np.zeros(0)  # each history's decode cost under ``_table_model`` (``decode_costs``)
        self._table_model = None
        self.plan = plan if plan is not None else rule.plan(rule.model.time_ms(rule.limits.cap_tokens, 0))
        self.start()

    @property
    def plan(self) -> Plan:
        """The plan in force this step: the planned one, within the decode step bound while requests decode."""
        return self._in_force

    @plan.setter
    def plan(self, plan: Plan) -> None:
        self._planned = self._in_force = plan
        self._bounded: Plan | None = None  # the planned one within the decode step bound, made once per plan

    @property
    def decode_bound_ms(self) -> float | None:
        """The decode step bound in predicted ms: the target's share, times ``pace_scale``."""
        bound_ms = self.rule.limits.decode_step_ms
        return None if bound_ms is None else bound_ms * self.pace_scale

    def pace(self, scale: float) -> None:
        """Predicted over measured time of the latest timed steps: the decode step bound is kept in measured
        time (a model a few percent slow or fast would otherwise miss the user's target by as much)."""
        if abs(scale - self.pace_scale) > PACE_STEP * self.pace_scale:
            self.pace_scale = scale
            self._bounded = None

    @property
    def floor_due(self) -> bool:
        """Whether this step's first prefill is owed the floor: always, but while decodes fill a TPOT target's
        bound only once a pipeline round (its decodes then wait for one floor chunk a round, not one a step)."""
        return not self.paced or self._floorless_steps + 1 >= self.floor_every

    def decoding(self, any_decodes: bool) -> None:
        """Whether requests decode in this step's time: with a TPOT target (``decode_step_ms``) no step is
        then longer than its bound, even before a plan made for the decodes is adopted."""
        bound_ms, planned = self.decode_bound_ms, self._planned
        self.paced = any_decodes and bound_ms is not None  # this step's time is a decode's: it keeps to the pace
        if not any_decodes or bound_ms is None or planned.target_ms <= bound_ms:
            self._in_force = planned
            return
        if self._bounded is None:
            self._bounded = replace(planned, target_ms=bound_ms)
        self._in_force = self._bounded

    @property
    def target_ms(self) -> float:
        return self.plan.target_ms

    def start(self, extra_fixed_ms: float = 0.0) -> None:
        """A new step: only the fixed cost is spent (plus ``extra_fixed_ms``, the planner's stand-in for decodes)."""
        self.used_ms = self.rule.model.fixed_ms + extra_fixed_ms  # fixed + charged requests, reserved decodes included
        self.paced = False  # (until ``decoding`` says otherwise)
        self.charged_ms = extra_fixed_ms  # charged requests only
        # request -> chunk_tokens, history_tokens, ms of the requests charged one by one (not the reserved
        # decodes); a new dict each step, so a step's stays as it was
        self.individually: dict[str, tuple[int, int, float]] = {}
        self.reserved: ReservedDecodes | None = None
        self.charged_tokens = 0  # tokens of every charged request, reserved decodes included
        self.prefills: set[str] = set()
        self.prefill_tokens = 0  # tokens charged to prefills in this step
        self.unfinished_tokens = math.inf  # the fewest left to a prefill granted here that this step does not finish
        self.passed_over = 0  # waiting requests passed over in this step
        self.allotted: dict[str, int] = {}  # request -> chunk, worked out in response-ratio order (``allot``)

    @property
    def charged(self) -> dict[str, tuple[int, int, float]]:
        """Every request charged in this step, reserved decodes first: request -> chunk, history, ms (built)."""
        return charged_of(self.reserved, self.individually)

    @property
    def any_charged(self) -> bool:
        return bool(self.individually) or bool(self.reserved)

    def reserve_decodes(self, decodes: Iterable[tuple[str, int, int]]) -> None:
        """Book running decodes, (request, new_tokens, history_tokens), before any prefill: decodes are never cut."""
        decodes = list(decodes)
        if not decodes:
            return
        model = self.rule.model
        request_ids, new_tokens, histories = zip(*decodes, strict=True)
        if len(decodes) >= _VECTOR_DECODES:  # one numpy call instead of many (speculative tokens: C > 1)
            chunks, at = np.array(new_tokens, dtype=np.float64), np.array(histories, dtype=np.float64)
            costs = model.decode_ms_many(at) if chunks.max() == 1 else model.request_ms_many(chunks, at)
        else:
            costs = np.array([model.request_ms(n, h) for n, h in zip(new_tokens, histories, strict=True)])
        ids = np.empty(len(request_ids), dtype=object)
        ids[:] = request_ids
        self._book(ReservedDecodes(ids, np.array(new_tokens), np.array(histories), costs))

    def reserve_unit_decodes(self, request_ids: np.ndarray, histories: np.ndarray) -> None:
        """``reserve_decodes`` of decodes of one token each, from arrays (``decode_costs``)."""
        if len(request_ids):
            costs = self.decode_costs(histories)
            self._book(ReservedDecodes(request_ids, None, histories, costs))

    def _book(self, reserved: ReservedDecodes) -> None:
        self.reserved = reserved if self.reserved is None else self.reserved.joined(reserved)
        self.charged_tokens += reserved.tokens
        self.used_ms += reserved.total_ms
        self.charged_ms += reserved.total_ms

    def decode_costs(self, histories: np.ndarray) -> np.ndarray:
        """``decode_ms_many`` of whole histories, read from a table of the model's (each entry is what the
        call gives for that history; it grows by doubling to the longest history seen, and is made again
        when the model changes)."""
        model, table = self.rule.model, self._decode_table
        needed = int(histories.max()) + 1 if len(histories) else 0
        if model is not self._table_model or needed > len(table):
            size = max(needed, 2 * len(table) if model is self._table_model else needed, 1024)
            table = self._decode_table = model.decode_ms_many(np.arange(size, dtype=np.float64))
            self._table_model = model
        return table[histories]

    def allot(
        self,
        prefills: Sequence[tuple[str, int, int, float, bool]],
        step_tokens: float = math.inf,
        request_tokens: float = math.inf,
    ) -> None:
        """Work out this step's prefill chunks before vLLM visits them: started ones first, then by response ratio.

        ``prefills`` are (request, history_tokens, remaining_tokens, waited_s, started) of the
        running prefills and the first waiting requests (history: their prefix-cache hit; waited:
        since arrival; started: it has had a chunk, it is running). vLLM visits running requests in
        admission order, so granting as it visits lets an old long prompt fill the batch and leaves
        a shorter one behind it a crumb a step (one token, step after step). Here the started ones
        come first (one left unfinished at most: it runs to its end), then the waiting ones in
        order of response ratio, (waited + work left) / work left, the work at the pipeline's rate
        at the base chunk: the shortest first, but a long prompt that has waited as long as its own
        work gains on a new short one, so none starves behind a stream of shorter ones (waiting
        counts to the end of this step: among ones that have just come, the shortest first).
        ``grant`` and ``admit`` then answer from this allotment. ``step_tokens`` is vLLM's token
        budget for the step (the reserved decodes' tokens come off it), ``request_tokens`` its cap
        on one request's.
        """
        self.allotted = {}
        if len(prefills) < 2:
            return  # one prefill: granted as visited, the same chunk
        model, used_ms, prefill_tokens = self.rule.model, self.used_ms, self.prefill_tokens
        first, alone = not self.prefills, not self.any_charged
        tokens_per_s = self.rule.base_tokens_per_s
        step_s = self.plan.target_ms / 1000.0
        tokens_left = step_tokens - self.charged_tokens

        # Waiting counted to the end of this step, as if it waited through it: among ones that have
        # just come, the shortest loses the most by waiting, so it comes first (ties: the order given).
        order = sorted(
            (not started, remaining / (remaining + (max(0.0, waited_s) + step_s) * tokens_per_s), remaining, index)
            for index, (_, _, remaining, waited_s, started) in enumerate(prefills)
        )
        for *_, index in order:
            request_id, history_tokens, remaining_tokens, _, _ = prefills[index]
            allowed_tokens = int(max(0, min(remaining_tokens, request_tokens, tokens_left)))
            if self._waits(remaining_tokens, allowed_tokens, prefill_tokens):
                self.allotted[request_id] = 0  # (``_sized``'s first answer, without the rest of it)
                continue
            chunk = self._sized(history_tokens, remaining_tokens, allowed_tokens, used_ms, prefill_tokens, first, alone)
            if chunk < remaining_tokens and self.unfinished_tokens < math.inf:
                chunk = 0  # one prefill a step that the batch does not finish: the rest finish or wait
            self.allotted[request_id] = chunk
            if chunk > 0:
                if chunk < remaining_tokens:
                    self.unfinished_tokens = remaining_tokens
                used_ms += model.request_ms(chunk, history_tokens)
                prefill_tokens += chunk
                tokens_left -= chunk
                first = alone = False

    def grant(self, history_tokens: int, remaining_tokens: int, allowed_tokens: int, request_id: str = "") -> int:
        """Tokens a prefill at ``history_tokens`` with ``remaining_tokens`` left may take now (<= allowed)."""
        allotted = self.allotted.get(request_id)
        if allotted is not None:
            return min(allotted, allowed_tokens, remaining_tokens)
        chunk = self._sized(
            history_tokens,
            remaining_tokens,
            allowed_tokens,
            self.used_ms,
            self.prefill_tokens,
            not self.prefills,
            not self.any_charged,
        )
        if 0 < chunk < remaining_tokens:
            self.unfinished_tokens = remaining_tokens
        return chunk

    def _waits(self, remaining_tokens: int, allowed_tokens: int, prefill_tokens: int) -> bool:
        """A prefill with at least as many tokens left as the unfinished one, which cannot finish in this batch,
        waits (shortest remaining first)."""
        return remaining_tokens >= self.unfinished_tokens and remaining_tokens > min(
            allowed_tokens, self.plan.batch_tokens - prefill_tokens
        )

    def _sized(
        self,
        history_tokens: int,
        remaining_tokens: int,
        allowed_tokens: int,
        used_ms: float,
        prefill_tokens: int,
        first: bool,
        alone: bool,
    ) -> int:
        """The chunk rule for one prefill, given what the step already holds (``used_ms`` of the
        target, ``prefill_tokens``; ``first``: no prefill yet; ``alone``: nothing charged yet)."""
        if self._waits(remaining_tokens, allowed_tokens, prefill_tokens):
            return 0  # no chunk to work out
        rule, target_ms = self.rule, self.plan.target_ms
        wanted = rule.wanted_chunk(history_tokens, remaining_tokens, self.plan)
        # The relative 1e-9 absorbs rounding: a chunk sized for the target must fit it.
        chunk = min(wanted, rule.chunk_within(history_tokens, target_ms * (1.0 + 1e-9) - used_ms, remaining_tokens))
        if (
            wanted == remaining_tokens
            and chunk < remaining_tokens
            and used_ms + rule.model.request_ms(remaining_tokens, history_tokens)
            <= (1.0 + rule.limits.tail_tolerance) * target_ms
        ):
            chunk = remaining_tokens  # the whole tail: no extra step for it
        if first and self.floor_due:
            # The step's first prefill advances by at least the floor (or its whole tail),
            # even when decodes fill the budget (under a TPOT target, once a pipeline round:
            # ``floor_due``); alone in the batch it gets its own chunk.
            chunk = max(chunk, min(wanted, rule.limits.floor_tokens))
            if alone:
                chunk = max(chunk, wanted)
        chunk = max(0, min(chunk, allowed_tokens, self.plan.batch_tokens - prefill_tokens))
        if chunk < remaining_tokens and remaining_tokens >= self.unfinished_tokens:
            return 0  # shortest remaining first: it waits for the unfinished prefill granted before it
        return chunk

    def admit(self, history_tokens: int, remaining_tokens: int, allowed_tokens: int, request_id: str = "") -> int:
        """``grant`` for a waiting request; ``PASS_OVER`` when it gets nothing and has at least as many
        tokens left as a prefill this step does not finish, or was allotted nothing (a shorter request
        behind it may still be admitted), 0 to stop admission for this step (first come, first served)."""
        granted = self.grant(history_tokens, remaining_tokens, allowed_tokens, request_id)
        if (
            granted <= 0
            and (remaining_tokens >= self.unfinished_tokens or request_id in self.allotted)
            and self.passed_over < PASS_OVER_LIMIT
        ):
            self.passed_over += 1
            return PASS_OVER
        return granted

    def charge(self, request_id: str, new_tokens: int, history_tokens: int, *, reserved: bool = True) -> None:
        """A request is in the batch with ``new_tokens``: count its cost.

        A decode scheduled as reserved is already in; one scheduled otherwise (more or
        fewer speculative tokens) is counted again. Any request not reserved as a
        decode is a prefill. ``reserved=False``: the caller knows it was not reserved.
        """
        previous = self.individually.get(request_id)
        if previous is None and reserved and self.reserved is not None:
            previous = self.reserved.get(request_id)
            if previous is not None:
                if previous[0] == new_tokens and previous[1] == history_tokens:
                    return
                self.reserved.drop(request_id)  # charged again below, one by one
        prefill = previous is None or request_id in self.prefills
        if previous is not None:
            if previous[0] == new_tokens and previous[1] == history_tokens:
                return
            self.used_ms -= previous[2]
            self.charged_ms -= previous[2]
            self.charged_tokens -= previous[0]
            if prefill:
                self.prefill_tokens -= previous[0]
        else:
            self.prefills.add(request_id)
        if prefill:
            self.prefill_tokens += new_tokens
        cost_ms = self.rule.model.request_ms(new_tokens, history_tokens)
        self.used_ms += cost_ms
        self.charged_ms += cost_ms
        self.individually[request_id] = (new_tokens, history_tokens, cost_ms)
        self.charged_tokens += new_tokens

    def refund(self, request_id: str) -> None:
        """A request charged (or reserved) in this step leaves it: preempted within the step."""
        charged = self.individually.pop(request_id, None)
        if charged is None and self.reserved is not None:
            charged = self.reserved.drop(request_id)
        if charged is not None:
            self.used_ms -= charged[2]
            self.charged_ms -= charged[2]
            self.charged_tokens -= charged[0]
            if request_id in self.prefills:
                self.prefill_tokens -= charged[0]
        self.prefills.discard(request_id)
        if not self.prefills:  # (with others left, the order they set stands: a longer prompt waits a step)
            self.unfinished_tokens = math.inf

    def settle(self, scheduled: Collection[str]) -> None:
        """End of step: refund reservations of decodes the step did not schedule.

        A scheduled request is charged or reserved, so with no decode reserved in vain the sizes
        are equal: the usual step costs one comparison. (One scheduled but neither, which a
        kept state that is wrong would cause, leaves the sizes unequal after this: the
        scheduler then reads its state again.)
        """
        if len(self.individually) + len(self.reserved or ()) != len(scheduled):
            reserved = [] if self.reserved is None else self.reserved.ids.tolist()  # (ids only: no entry per decode)
            for request_id in [r for r in [*reserved, *self.individually] if r not in scheduled]:
                self.refund(request_id)  # (a decode already dropped refunds nothing)
        self._floorless_steps = self._floorless_steps + 1 if self.paced and not self.prefill_tokens else 0

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The step's (chunk_tokens, history_tokens) pairs, in the order they were charged."""
        return tuple((chunk, history) for chunk, history, _ in self.charged.values())

    def predicted_ms(self) -> float:
        """The model's time of the step's charged requests (fixed cost included)."""
        return self.rule.model.fixed_ms + self.charged_ms
