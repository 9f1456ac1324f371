"""The running requests as CPP sizes them, kept from step to step: a step touches only what changed.

At a sized step's start CPP needs the running prefills (in running order) and the decodes
with a token to schedule (their history, in running order). Walking every running request
for them costs Python attribute reads per request per step. ``RunningState`` keeps them
instead, updated from the events that change them, all of which pass through the
scheduler's own methods:

- a step scheduled (``after_step``): each reserved decode that was scheduled is one token
  further (its history + 1) and, under synchronous scheduling, waits for that step's output;
  the open prefills and the requests admitted in the step are read (few): a prompt done is
  a decode from then on; preempted requests (``preempted_req_ids``) leave;
- a step's output back (``output_back``): the decodes it carried have their next token to
  schedule again (synchronous scheduling);
- requests finished or aborted (vLLM's ``finished_req_ids``, read at the next step start) leave.

Everything else rebuilds the state from vLLM's queues (``rebuild``, one walk): steps that
were not sized (decodes only, nothing tracked but the outputs in flight: the next sized
step rebuilds once, and the decodes each of those outputs carries wait for it), a count
that does not add up (a request left by a path not listed), speculative decoding
(a decode's history can go back when draft tokens are rejected), a KV load failure and a
prefix-cache reset with running requests. ``check`` rebuilds a fresh state and compares
it with the kept one (tests run it every step). Memory: a few numbers per running request,
in arrays that grow to the most requests ever running and are reused; nothing is kept for a
request once it has left.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["ReservedDecodes", "RunningState", "charged_of", "decode_new_tokens"]

MAX_PENDING_OUTPUTS = 64  # outputs whose decodes wait for them; more means outputs were dropped (then: rebuild)


def decode_new_tokens(request: Any) -> int:
    """Tokens a running decode has to schedule now: none while its last token is in flight, unless
    asynchronous scheduling already counts that token as a placeholder (speculative tokens added)."""
    new_tokens = request.num_tokens - request.num_computed_tokens + request.num_output_placeholders
    if request.spec_token_ids:
        new_tokens += len(request.spec_token_ids)
    return new_tokens


class ReservedDecodes:
    """A step's reserved decodes in running order, as arrays: no per-decode Python object on the step's path.

    ``new_tokens`` None: one token each. ``costs`` are each decode's own cost (ms); ``total_ms``
    their sum, added in order as a Python sum does. A decode refunded within the step is ``dropped``."""

    __slots__ = ("ids", "new_tokens", "histories", "costs", "total_ms", "tokens", "unit", "dropped", "_index")

    def __init__(
        self, ids: np.ndarray, new_tokens: np.ndarray | None, histories: np.ndarray, costs: np.ndarray
    ) -> None:
        self.ids, self.new_tokens, self.histories, self.costs = ids, new_tokens, histories, costs
        self.total_ms = sum(costs.tolist())
        self.tokens = len(ids) if new_tokens is None else int(new_tokens.sum())
        self.unit = self.tokens == len(ids)  # one token each (every reserved decode has at least one)
        self.dropped: set[str] = set()
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.ids) - len(self.dropped)

    def _new_tokens(self) -> np.ndarray:
        return np.ones(len(self.ids), dtype=np.int64) if self.new_tokens is None else self.new_tokens

    def get(self, request_id: str) -> tuple[int, int, float] | None:
        """(new_tokens, history_tokens, ms) of a reserved decode still in the step (a dict made on first use)."""
        if self._index is None:
            self._index = {request_id: i for i, request_id in enumerate(self.ids.tolist())}
        index = self._index.get(request_id)
        if index is None or request_id in self.dropped:
            return None
        return int(self._new_tokens()[index]), int(self.histories[index]), float(self.costs[index])

    def drop(self, request_id: str) -> tuple[int, int, float] | None:
        entry = self.get(request_id)
        if entry is not None:
            self.dropped.add(request_id)
        return entry

    def joined(self, more: ReservedDecodes) -> ReservedDecodes:
        """These decodes, then ``more`` (a second reservation in the same step)."""
        columns = zip(
            (self.ids, self._new_tokens(), self.histories, self.costs),
            (more.ids, more._new_tokens(), more.histories, more.costs),
            strict=True,
        )
        joined = ReservedDecodes(*(np.concatenate(pair) for pair in columns))
        joined.dropped = self.dropped | more.dropped
        return joined

    def items(self) -> Iterable[tuple[str, tuple[int, int, float]]]:
        """(request, (new_tokens, history_tokens, ms)) of the decodes still in the step, in running order."""
        columns = (self.ids, self._new_tokens(), self.histories, self.costs)
        rows = zip(*(column.tolist() for column in columns), strict=True)
        return ((r, (n, h, c)) for r, n, h, c in rows if r not in self.dropped)


def charged_of(
    reserved: ReservedDecodes | None, individually: dict[str, tuple[int, int, float]]
) -> dict[str, tuple[int, int, float]]:
    """Every request of a step, reserved decodes first: request -> chunk_tokens, history_tokens, ms (built)."""
    return dict(individually) if reserved is None else {**dict(reserved.items()), **individually}


class RunningState:
    """The running prefills and decodes of one scheduler, kept from step to step (see the module docstring)."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.prefills: list = []  # running requests with more than one prompt token left, in running order
        self._seq: dict[str, int] = {}  # request -> its place in running order (admission order)
        self._next_seq = 0
        self._slot: dict[str, int] = {}  # decoding request -> its slot in the arrays below
        self._ids = np.empty(0, dtype=object)
        self._history = np.zeros(0, dtype=np.int64)
        self._ready = np.zeros(0, dtype=bool)  # it has a token to schedule now
        self._used = np.zeros(0, dtype=bool)  # the slot holds a request
        self._born = np.zeros(0, dtype=np.int64)  # departures counted when the slot's request entered
        self._order = np.zeros(0, dtype=np.int64)  # decoding slots in running order
        self._order_seq = np.zeros(0, dtype=np.int64)
        self._free: list[int] = []
        self._pending: dict[int, list[tuple[np.ndarray, int]]] = {}  # output -> (slots, departures then) it frees
        self._untracked: dict[int, Any] = {}  # outputs of steps not sized, not back yet (by id)
        self.stale = True  # rebuild at the next sized step
        self.rebuilds = 0
        self._departures = 0  # requests that left the arrays (a slot freed: kept slot lists need a check)
        self.mismatches: list[str] = []  # what ``check`` found (each then rebuilt)
        self._reserved = self._order[:0]  # slots of this step's reserved decodes

    @property
    def num_decodes(self) -> int:
        return len(self._slot)

    # ------------------------------------------------------------------ a step's start
    def step_start(self, scheduler: Any, *, keep: bool = True, check: bool = False) -> None:
        """Bring the state to this sized step's start: finished requests leave; a rebuild when it cannot be
        trusted (or without ``keep``: the reference). ``check``: compare with a rebuild, keep what differs."""
        if self.stale or not keep:
            self.rebuild(scheduler.running)
            return
        for request_id in scheduler.finished_req_ids:
            self._leave(request_id)
        if len(scheduler.running) != len(self.prefills) + len(self._slot):
            self.rebuild(scheduler.running)  # a request left by a path the events do not cover
        elif check and (problem := self.check(scheduler.running)) is not None:
            self.mismatches.append(problem)
            self.rebuild(scheduler.running)

    def reserve(self, scheduler: Any, budget: Any) -> None:
        """Reserve this step's decodes in the step budget (``after_step`` learns which went out)."""
        if scheduler.num_spec_tokens:  # a decode may have several tokens to schedule: read them
            decoding = [r for r in scheduler.running if r.num_tokens - r.num_computed_tokens <= 1]
            budget.reserve_decodes(
                (r.request_id, n, r.num_computed_tokens) for r in decoding if (n := decode_new_tokens(r)) > 0
            )
            self._reserved = self._order[:0]
        else:
            self._reserved, request_ids, histories = self.ready_decodes()
            budget.reserve_unit_decodes(request_ids, histories)

    def ready_decodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slots, request ids and histories of the decodes with a token to schedule, in running order."""
        slots = self._order[self._ready[self._order]]
        return slots, self._ids[slots], self._history[slots]

    # ------------------------------------------------------------------ events
    def after_step(self, scheduler: Any, output: Any, budget: Any) -> None:
        """A sized step was scheduled: its reserved decodes (less those the budget dropped) went out one
        token each; the open prefills and the requests admitted (in admission order) are read again."""
        requests, charged_prefills = scheduler.requests, budget.prefills
        admitted = [requests[r] for r in budget.individually if r in charged_prefills and r in requests]
        dropped = budget.reserved.dropped if budget.reserved is not None else ()
        slots, self._reserved = self._reserved, self._order[:0]
        departures = self._departures
        for request_id in getattr(output, "preempted_req_ids", None) or ():
            self._leave(request_id)
        if len(slots):
            if dropped:
                slots = slots[[request_id not in dropped for request_id in self._ids[slots].tolist()]]
            if self._departures != departures:
                slots = slots[self._used[slots]]  # (a preempted decode's slot was freed)
            self._history[slots] += 1
            if not self.asynchronous:  # its next token needs this one back
                self._ready[slots] = False
                self._wait_for(output, slots)
        for request in admitted:
            if request.request_id not in self._seq:
                self._seq[request.request_id] = self._next_seq
                self._next_seq += 1
                self.prefills.append(request)
        done = [r for r in self.prefills if r.num_tokens - r.num_computed_tokens <= 1]
        if done:
            self.prefills = [r for r in self.prefills if r.num_tokens - r.num_computed_tokens > 1]
            entered = [self._enter(r.request_id, r.num_computed_tokens, decode_new_tokens(r) > 0) for r in done]
            waiting = np.array([s for s, r in zip(entered, done, strict=True) if not self._ready[s]], dtype=np.int64)
            if len(waiting):
                self._wait_for(output, waiting)
        if scheduler.num_spec_tokens:
            self.stale = True  # (draft tokens rejected take a decode's history back: read it again)

    def untracked_step(self, output: Any) -> None:
        """A step that was not sized: nothing of it is tracked but the requests that left before or in it,
        and the output itself until it is back; the next sized step reads the running requests again."""
        for request_id in output.finished_req_ids:
            self._leave(request_id)
        for request_id in getattr(output, "preempted_req_ids", None) or ():
            self._leave(request_id)
        self._untracked[id(output)] = output
        self.stale = True
        if len(self._untracked) > MAX_PENDING_OUTPUTS:  # outputs that never came back: forget them
            self._untracked.clear()

    def output_back(self, output: Any) -> None:
        """A step's output is back: its decodes have their next token (synchronous scheduling)."""
        key = id(output)
        self._untracked.pop(key, None)  # (back before a sized step: the state is stale, and read again then)
        for slots, departures in self._pending.pop(key, ()):
            if departures != self._departures:  # some left since: keep the slots still held by the same request
                slots = slots[self._used[slots] & (self._born[slots] <= departures)]
            self._ready[slots] = True

    def _wait_for(self, output: Any, slots: np.ndarray) -> None:
        """``slots`` have their next token when ``output`` is back (a slot freed and taken again after
        ``_departures`` moved on holds another request: ``output_back`` tells them by ``_born``)."""
        self._pending.setdefault(id(output), []).append((slots, self._departures))
        if len(self._pending) > MAX_PENDING_OUTPUTS:  # outputs that never came back: read everything again
            self._pending.clear()
            self.stale = True

    # ------------------------------------------------------------------ slots
    def _enter(self, request_id: str, history_tokens: int, ready: bool) -> int:
        slot = self._slot.get(request_id)
        if slot is None:
            if not self._free:
                self._grow()
            slot = self._slot[request_id] = self._free.pop()
            self._born[slot] = self._departures
            self._ids[slot], self._used[slot] = request_id, True
            seq = self._seq.setdefault(request_id, self._next_seq)
            self._next_seq = max(self._next_seq, seq + 1)
            at = int(np.searchsorted(self._order_seq, seq))
            self._order = np.insert(self._order, at, slot)
            self._order_seq = np.insert(self._order_seq, at, seq)
        self._history[slot] = history_tokens
        self._ready[slot] = ready
        return slot

    def _leave(self, request_id: str) -> None:
        self._seq.pop(request_id, None)
        slot = self._slot.pop(request_id, None)
        if slot is None:
            if any(r.request_id == request_id for r in self.prefills):
                self.prefills = [r for r in self.prefills if r.request_id != request_id]
            return
        self._ids[slot], self._used[slot], self._ready[slot] = None, False, False
        self._departures += 1
        self._free.append(slot)
        kept = self._order != slot
        self._order, self._order_seq = self._order[kept], self._order_seq[kept]

    def _grow(self) -> None:
        size = len(self._ids)
        grown = max(16, 2 * size)
        self._ids = np.concatenate([self._ids, np.full(grown - size, None, dtype=object)])
        self._history = np.concatenate([self._history, np.zeros(grown - size, dtype=np.int64)])
        self._ready = np.concatenate([self._ready, np.zeros(grown - size, dtype=bool)])
        self._used = np.concatenate([self._used, np.zeros(grown - size, dtype=bool)])
        self._born = np.concatenate([self._born, np.zeros(grown - size, dtype=np.int64)])
        self._free.extend(range(grown - 1, size - 1, -1))

    # ------------------------------------------------------------------ from scratch
    def rebuild(self, running: list) -> None:
        """Everything read again from vLLM's running queue (one walk). Slots of requests still running are
        kept, so what a batch in flight will free still points at them."""
        self.rebuilds += 1
        self.stale = False
        self.prefills, self._seq, order, order_seq = [], {}, [], []
        for request in running:
            request_id = request.request_id
            seq = self._seq[request_id] = self._next_seq
            self._next_seq += 1
            if request.num_tokens - request.num_computed_tokens > 1:
                self.prefills.append(request)
                continue
            order.append(self._enter(request_id, request.num_computed_tokens, decode_new_tokens(request) > 0))
            order_seq.append(seq)
        present = set(order)
        for request_id in [r for r, slot in self._slot.items() if slot not in present]:
            self._leave(request_id)
        self._order, self._order_seq = np.array(order, dtype=np.int64), np.array(order_seq, dtype=np.int64)
        # Outputs of steps not sized still in flight: a decode not ready now waits for the one that carries it.
        outputs, self._untracked = self._untracked, {}
        for output in outputs.values():
            slots = [self._slot[r] for r in output.num_scheduled_tokens if r in self._slot]
            waiting = np.array([s for s in slots if not self._ready[s]], dtype=np.int64)
            if len(waiting):
                self._wait_for(output, waiting)

    def snapshot(self) -> tuple:
        """What a step start reads: the prefills' ids, and each decode's id, history and readiness, in order."""
        order = self._order.tolist()
        decodes = [(self._ids[s], int(self._history[s]), bool(self._ready[s])) for s in order]
        return [r.request_id for r in self.prefills], decodes

    def check(self, running: list) -> str | None:
        """Compare with a state rebuilt from ``running``: None when they agree, else what differs."""
        fresh = RunningState(self.asynchronous)
        fresh.rebuild(running)
        kept, truth = self.snapshot(), fresh.snapshot()
        if kept == truth:
            return None
        return f"kept {kept} != rebuilt {truth}"

    def memory(self) -> dict[str, int]:
        """Entries kept per request (for the test that runs many requests through)."""
        return {
            "requests": len(self._seq),
            "decodes": len(self._slot),
            "prefills": len(self.prefills),
            "pending_outputs": len(self._pending),
            "untracked_outputs": len(self._untracked),
            "slots": len(self._ids),
        }
