"""What a CPP scheduler holds, read from vLLM's scheduler state: the prefills a step sizes.

The scheduler (core/scheduler_profiling_chunk.py) plans and sizes from three reads of
vLLM's own queues, gathered here so that the plan, the step's allotment and admission
see the same thing:

- ``waiting_in_order``: the waiting requests in the order admission takes them (vLLM's
  skipped queue first: requests passed over before, or waiting on remote KV or a LoRA slot;
  under the priority policy the two queues merged by priority, as admission compares their heads);
  ``settle_preempted``: the queues after an output, for the requests preempted with one in flight;
- ``prefix_hit_tokens``: where admission will start a waiting prompt, after its
  prefix-cache hit (a lookup as admission makes it; nothing is held); ``PrefixHits``
  makes it once a step for the plan and the allotment;
- ``allotment_candidates``: the running prefills and the first waiting requests as
  (request, history, remaining, waited, started), for ``StepBudget.allot``;
- ``held_for_plan``: (history, remaining) of what a plan holds, made only when a plan is;
- ``CutWatch``: prefills granted tokens that vLLM's loop cut to nothing, step after step;
  ``fixed_chunk_step_tokens``: the broken-profile fallback's token budget for a step.

``plan_shape`` is what a plan depends on, coarsely, so that a stream of prompts of the
same sizes does not plan again. Nothing here is called per request of the loop.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from typing import Any

from vllm_ascend.core.cpp_planner import PLAN_MAX_PREFILLS

__all__ = [
    "CutWatch",
    "PrefixHits",
    "allotment_candidates",
    "fixed_chunk_step_tokens",
    "held_for_plan",
    "plan_shape",
    "prefix_hit_tokens",
    "settle_preempted",
    "waiting_in_order",
]


def waiting_in_order(scheduler: Any) -> Iterator[Any]:
    """The waiting requests in the order admission takes them: those passed over before first; under the
    priority policy, each time the higher of the two queues' heads (each queue iterates in its order)."""
    policy = getattr(scheduler, "policy", None)  # (vLLM's SchedulingPolicy)
    if getattr(policy, "value", policy) == "priority":
        return heapq.merge(scheduler.skipped_waiting, scheduler.waiting)
    return itertools.chain(scheduler.skipped_waiting, scheduler.waiting)


def held_for_plan(scheduler: Any, running_prefills: list, hits: PrefixHits, traffic: Any, lookahead: int) -> list:
    """(history, remaining) of the running prefills and the first ``lookahead`` waiting requests, for a plan
    (the queue behind the head is read only when a plan is made, never per step). The first
    ``PLAN_MAX_PREFILLS`` start after their prefix-cache hits, as admission will start them, and
    ``traffic`` counts their sizes with the hits out."""
    held = []
    waiting = itertools.islice(waiting_in_order(scheduler), lookahead)
    for index, request in enumerate([*running_prefills, *waiting]):
        history_tokens = request.num_computed_tokens
        if index < PLAN_MAX_PREFILLS and not history_tokens:
            history_tokens = hits.tokens(scheduler, request)
        remaining_tokens = request.num_tokens - history_tokens
        if index < max(PLAN_MAX_PREFILLS, len(running_prefills)):
            traffic.held(request.request_id, history_tokens, remaining_tokens)
        held.append((history_tokens, remaining_tokens))
    return held


def settle_preempted(scheduler: Any, preempted: set, status: Any) -> None:
    """After an output is back: requests preempted with an output in flight (``preempted``, kept
    until their status changes; ``status``: vLLM's RequestStatus) may have stopped while waiting.
    vLLM takes a preempted request that stops out of ``waiting`` only, and passed over (CPP's
    admission does that, so do a LoRA limit and a connector) it waits in the skipped queue: a
    finished one stays there and is scheduled ("Invalid request status"), a streaming one is
    put there a second time, and a streaming one whose next input came already leaves ``waiting``
    as it is put back. So a stopped request leaves the skipped queue and, if not finished, waits
    in one queue once. Nothing is walked unless one of them stopped (an admitted one runs)."""
    if not preempted:  # (every step but after a preemption)
        return
    changed = {request for request in preempted if request.status != status.PREEMPTED}
    if not changed:
        return
    preempted -= changed
    stopped = {request for request in changed if request.status != status.RUNNING}
    if not stopped:
        return
    skipped = scheduler.skipped_waiting
    held = [request for request in skipped if request in stopped]
    wrong = {request for request in held if request.is_finished() or held.count(request) > 1}
    if wrong:  # (the rest keep their place)
        skipped.remove_requests(wrong)
        for request in dict.fromkeys(request for request in held if request in wrong and not request.is_finished()):
            skipped.add_request(request)
    for request in stopped.difference(held, scheduler.waiting):  # in no queue: a blocked status waits in skipped
        if not request.is_finished():
            (scheduler.waiting if request.status == status.WAITING else skipped).add_request(request)


def prefix_hit_tokens(scheduler: Any, request: Any) -> int:
    """Tokens of a waiting prompt the prefix cache holds: a lookup, as admission makes it, nothing held."""
    manager = scheduler.kv_cache_manager
    if not getattr(manager, "enable_caching", False) or getattr(request, "skip_reading_prefix_cache", False):
        return 0
    return int(manager.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)[1])


class PrefixHits:
    """Waiting prompts' prefix-cache hits, each looked up once a step.

    A lookup walks the prompt's block hashes. The plan and the allotment of one step read
    the same waiting prompts, and nothing is cached or evicted between them, so they share
    the lookup; the next step looks again (other prompts fill the cache meanwhile, and a
    hit read a step ago may be wrong).
    """

    def __init__(self) -> None:
        self._hits: dict[str, int] = {}  # request -> hit tokens, this step

    def next_step(self) -> None:
        self._hits = {}

    def tokens(self, scheduler: Any, request: Any) -> int:
        """``prefix_hit_tokens``, as looked up in this step."""
        hit = self._hits.get(request.request_id)
        if hit is None:
            hit = self._hits[request.request_id] = prefix_hit_tokens(scheduler, request)
        return hit


def allotment_candidates(
    scheduler: Any, running_prefills: list, waiting_limit: int, now_s: float, hits: PrefixHits
) -> list[tuple[str, int, int, float, bool]]:
    """(request, history_tokens, remaining_tokens, waited_s, started) of the running prefills (started)
    and the first ``waiting_limit`` waiting requests (a waiting one from its prefix-cache hit); empty
    when there is at most one (a lone prefill is sized as vLLM visits it, the same chunk)."""
    waiting = list(itertools.islice(waiting_in_order(scheduler), waiting_limit))
    if len(running_prefills) + len(waiting) < 2:
        return []
    prefills = [
        (r.request_id, r.num_computed_tokens, r.num_tokens - r.num_computed_tokens, now_s - r.arrival_time, True)
        for r in running_prefills
    ]
    for request in waiting:
        history_tokens = hits.tokens(scheduler, request)
        remaining_tokens = request.num_tokens - history_tokens
        prefills.append((request.request_id, history_tokens, remaining_tokens, now_s - request.arrival_time, False))
    return prefills


def plan_shape(held: list[tuple[int, int]], decoding: int) -> tuple:
    """What a plan depends on, each within a factor of sqrt(2): the first prefill's history and
    remaining tokens, how many prefills are held, their remaining and longest tokens, the decodes."""

    def bucket(value: int) -> int:
        return int(2.0 * math.log2(value + 1))

    remaining = [r for _, r in held]
    head_history, head_remaining = held[0]
    return tuple(bucket(v) for v in (head_history, head_remaining, len(held), sum(remaining), max(remaining), decoding))


class CutWatch:
    """Sized steps whose prefills were granted tokens and advanced none, with no KV allocation refused: a
    rule of vLLM's loop cut the grant to nothing (an image not to be cut, ``disable_chunked_mm_input``).
    After two in a row, one step leaves the prefills' sizes to vLLM, which would otherwise stall for good.
    Where the loop cuts every chunk short of a prompt's end to whole blocks (a hybrid model's mamba cache),
    a grant is cut so here first (``block``), so a part of a block is no grant, and no cut either. A refused
    allocation (``watch``: the KV cache manager's answer, read as it is given) is KV pressure, not a cut."""

    def __init__(self) -> None:
        self.block = 1  # the loop's block, where it cuts chunks to whole ones
        self.granted = 0  # the largest grant of this step
        self.refused = False  # an allocation of KV blocks was refused in this step
        self.cut = 0  # such steps in a row
        self.unsized = False  # this step leaves the prefills' sizes to vLLM

    def watch(self, kv_cache_manager: Any) -> None:
        """Note each refused allocation of ``kv_cache_manager`` (vLLM's; its method is wrapped, not changed)."""
        allocate = kv_cache_manager.allocate_slots

        def allocate_slots(*args: Any, **kwargs: Any) -> Any:
            blocks = allocate(*args, **kwargs)
            self.refused = self.refused or blocks is None
            return blocks

        kv_cache_manager.allocate_slots = allocate_slots

    def step_starts(self) -> bool:
        self.unsized, self.granted, self.refused = self.cut >= 2, 0, False
        return self.unsized

    def grant(self, tokens: int, remaining_tokens: int) -> int:
        if 0 < tokens < remaining_tokens:
            tokens -= tokens % self.block
        self.granted = max(self.granted, tokens)
        return tokens

    def step_ends(self, advanced: bool) -> None:
        self.cut = self.cut + 1 if not advanced and self.granted > 0 and not self.refused else 0


def fixed_chunk_step_tokens(scheduler: Any, fixed_tokens: int, token_budget: int) -> int:
    """The broken-profile fallback's token budget for a step: the fixed chunk for its prefills, and a token
    (with its speculative ones) for each decode with one to schedule now; a decode whose last token is still
    in the pipeline gets none, and its share would go to a prefill."""
    decodes = sum(
        r.num_computed_tokens >= r.num_prompt_tokens
        and r.num_tokens_with_spec + r.num_output_placeholders > r.num_computed_tokens
        for r in scheduler.running
    )
    return min(token_budget, fixed_tokens + decodes * (1 + scheduler.num_spec_tokens))
