"""Hook points of the scheduling loop, so a policy can shape batches without a copy of it.

``BalanceScheduler.schedule()`` (patch/platform/patch_balance_schedule.py) calls these
methods where it sets the step's token budget and where it decides each request's
number of new tokens. Every default below returns exactly what the loop computed
before the hook existed, so a scheduler that does not override them behaves as
upstream does, step for step (a test runs both side by side and compares every batch).

The contract, in the order the loop calls them within one ``schedule()``:

- ``schedule_step_starts(token_budget)`` once, after the token budget is set;
  returns the token budget to use.
- ``cap_running_tokens(request, num_new_tokens)`` for each RUNNING request, after the
  long-prefill threshold, the token budget and max_model_len have capped it. Returning
  0 skips the request for this step (the loop moves on to the next one).
- ``cap_waiting_tokens(request, history_tokens, num_new_tokens)`` for each WAITING
  request, after the long-prefill threshold; ``history_tokens`` counts every token
  already computed for it, prefix-cache hits included. Returning 0 stops admitting
  waiting requests for this step, so first-come-first-served order holds; returning a
  negative number passes over this request for this step (it waits in the loop's
  skipped queue, ahead of the requests that arrived after it, as vLLM keeps a request
  it cannot schedule yet) and the loop goes on to the next one.
- ``charge_scheduled_tokens(request, history_tokens, num_new_tokens)`` once a request
  is in the batch with its final number of new tokens.
- ``refund_scheduled_tokens(request)`` when a request charged in this step is preempted
  again within the same step (priority policy).

``uses_schedule_hooks = True`` makes ``BalanceScheduler.schedule()`` run its own loop
(the one that calls the hooks) also when balance scheduling is off; the default
False keeps vLLM's own ``Scheduler.schedule()`` in that case, as upstream does.
"""

from __future__ import annotations

from typing import Any


class ScheduleHooks:
    """Mixin with the identity hooks; a scheduling policy overrides what it needs."""

    uses_schedule_hooks: bool = False

    def schedule_step_starts(self, token_budget: int) -> int:
        return token_budget

    def cap_running_tokens(self, request: Any, num_new_tokens: int) -> int:
        return num_new_tokens

    def cap_waiting_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> int:
        return num_new_tokens

    def charge_scheduled_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> None:
        return None

    def refund_scheduled_tokens(self, request: Any) -> None:
        return None
