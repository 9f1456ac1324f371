"""ProfilingChunkScheduler: dynamic chunked pipeline parallelism through the scheduler hooks.

This scheduler holds no copy of vLLM's loop: upstream's loop (BalanceScheduler.schedule)
calls the hooks of core/schedule_hooks.py, and this class answers them with one
``StepBudget`` per step (core/cpp_step_budget.py; the rule is stated in core/cpp_chunk_rule.py).
Here is only the bookkeeping:

- start-up: ``run_profiling_chunk_init(executor)`` gets a verdict on a cached or fresh
  profile (core/cpp_profiling.py, core/cpp_acceptance.py): a latency model to schedule
  with; or, when the data is broken, the fixed chunk that is best for this pipeline on
  what was measured, as the step's prefill tokens (decodes ride on top); or, when nothing
  valid was measured, vLLM's own loop (one log line says which); whole blocks where vLLM cuts to them;
- each step that holds or may admit a prefill: running decodes are reserved at their true
  history (kept from step to step, core/cpp_running.py), then the running prefills and the
  first waiting requests are allotted their chunks, running ones first, waiting ones in
  response-ratio order (core/cpp_held.py, waited time on ``cpp_clock``), and every prefill
  vLLM visits gets its allotment or else its chunk of what is left, at its true history
  (prefix-cache hits included); a grant of 0 skips a running request, and passes over a
  waiting one or stops admission. After a sized step that advanced no prefill (no KV
  blocks), one is sized as vLLM visits; after two granted and cut to nothing by the loop,
  one is vLLM's. A step with no prefill left and none waiting is not sized (identity hooks);
- the batch-time target is planned again (core/cpp_planner.py) only when the held prefills
  change or decodes start or stop, from the prefills in FCFS order (a waiting one from its
  prefix-cache hit), the decodes and the largest batch in flight; with a batch in flight,
  off the step (core/cpp_policy.py);
- timing: a step that holds a prefill chunk is marked (``scheduler_output.cpp_time_step``):
  each until ``max_fit_chunk`` were timed, then one in ``timing_every``; a marked step's
  ``execution_time_ms`` (the slowest stage's compute) feeds online calibration;
- faults: an exception in any of this never reaches vLLM's engine loop: the hook answers
  what upstream's loop would have done, one warning names the fault, and CPP is off for
  the rest of the process (vLLM's own loop from the next step).

Without an engine (tests, offline simulation): construct it like any vLLM scheduler, call
``run_profiling_chunk_init(executor)`` once (``collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns per-worker ms; or ``measure=fn``), then alternate ``schedule()`` and
``update_from_output(...)``; ``planned_batch(output)`` is a step's record.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import RequestStatus
from vllm_ascend.core import cpp_held
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, Plan
from vllm_ascend.core.cpp_config import CONFIG_KEY, parse_cpp_config
from vllm_ascend.core.cpp_held import PrefixHits, allotment_candidates, held_for_plan, plan_shape, waiting_in_order
from vllm_ascend.core.cpp_planner import PLAN_MAX_PREFILLS
from vllm_ascend.core.cpp_policy import CppBatch, CppPolicy
from vllm_ascend.core.cpp_profiling import initialise_profile, measure_with_executor
from vllm_ascend.core.cpp_running import RunningState
from vllm_ascend.core.cpp_step_budget import PASS_OVER_LIMIT
from vllm_ascend.core.schedule_hooks import ScheduleHooks
from vllm_ascend.deployment import fingerprint_for
from vllm_ascend.log_adapter import get_logger
from vllm_ascend.patch.platform.patch_balance_schedule import BalanceScheduler

logger = get_logger(__name__)

PLAN_LOOKAHEAD = 256  # waiting requests a plan sees: the first ones one by one, the rest as a queue


class ProfilingChunkScheduler(BalanceScheduler):
    """Per-step time budget for prefill chunks; see the module docstring."""

    cpp_keep_state = True  # False: the running requests are read again at every sized step (the reference)
    cpp_check_state = False  # True: each sized step compares the kept state with one read again (tests)

    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        additional = getattr(vllm_config, "additional_config", None) or {}
        self.cpp_config = parse_cpp_config(
            additional.get(CONFIG_KEY), max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens
        )
        self.cpp_source: str | None = None
        self.cpp_verdict: str | None = None
        self.cpp_fixed_chunk_tokens: int | None = None  # the fallback's fixed chunk, when there is no model
        self.cpp_policy: CppPolicy | None = None  # the model, the plan and the step budget (None: no model)
        self._cpp_profiled = False
        self.cpp_timed_steps = self._cpp_prefill_steps = 0
        self._cpp_plan_key: tuple | None = None  # the held prefills (ids) and any decodes the plan saw ...
        self._cpp_plan_shape: tuple | None = None  # ... and their sizes, within a factor of sqrt(2)
        self._cpp_steps_since_plan = 0
        self._cpp_sizing = False  # this step holds or may admit a prefill
        self._cpp_step_budget = None  # the step budget while the step is a sized one
        self.cpp_running = RunningState(asynchronous=isinstance(self, AsyncScheduler))  # kept from step to step
        hooks = ("cap_running_tokens", "charge_scheduled_tokens")  # a step not sized answers with these
        self._cpp_identity_hooks = {name: getattr(ScheduleHooks, name).__get__(self) for name in hooks}
        self._cpp_identity = False  # the identity hooks are in place (set on the first step not sized)
        self._cpp_stalled = False  # the last sized step advanced no prefill: this one is not allotted
        self._cpp_cuts = cpp_held.CutWatch()  # grants vLLM's loop cut to nothing (then one step is vLLM's)
        self._cpp_cuts.watch(self.kv_cache_manager)  # (no KV blocks for a grant is no cut)
        self.cpp_clock = time.time  # the clock of requests' arrival_time (a simulator sets its own)
        self._cpp_prefix_hits = PrefixHits()  # looked up once a step
        self._cpp_preempted: set = set()  # preempted requests not admitted again (cpp_held.settle_preempted)

    # ------------------------------------------------------------------ start-up
    def _cpp_limits(self) -> ChunkLimits:
        config = self.cpp_config
        return ChunkLimits(
            base_chunk_tokens=min(self.max_num_scheduled_tokens, self.max_model_len),  # one request's most
            max_model_len=self.max_model_len,
            min_chunk_tokens=config.min_chunk,
            smooth_factor=config.smooth_factor,
            tail_tolerance=config.tail_tolerance,
        )

    def run_profiling_chunk_init(self, model_executor: Any = None, *, measure=None) -> None:
        """Adopt a cached profile or profile the workers once; on failure keep fixed chunking."""
        if self._cpp_profiled:
            return
        self._cpp_profiled = True
        base_tokens = self.max_num_scheduled_tokens
        num_stages = self.parallel_config.pipeline_parallel_size
        try:
            limits = self._cpp_limits()
            if measure is None and model_executor is not None:
                measure = measure_with_executor(model_executor)
            kv_capacity_tokens = (self.kv_cache_config.num_blocks - 1) * self.cache_config.block_size  # 0: null
            max_history_tokens = max(0, min(self.max_model_len, kv_capacity_tokens) - limits.cap_tokens)
            start_up = initialise_profile(
                self.cpp_config, limits, num_stages,
                fingerprint=fingerprint_for(self.vllm_config), measure=measure, max_history_tokens=max_history_tokens,
            )  # fmt: skip
        except Exception as error:  # never let CPP take the engine down: fixed chunking instead
            logger.warning("[CPP] start-up failed (%s: %s); fixed chunking for this run", type(error).__name__, error)
            return
        verdict = start_up.verdict
        self.cpp_source, self.cpp_verdict = start_up.source, verdict.reason
        aligned = getattr(self, "need_mamba_block_aligned_split", False)  # the loop cuts chunks to whole blocks
        self._cpp_cuts.block = self.cache_config.block_size if aligned else 1  # (a hybrid model's mamba cache)
        granule = math.lcm(verdict.granule_tokens, self._cpp_cuts.block)
        if verdict.model is None:
            fixed = verdict.fixed_chunk_tokens and -(-verdict.fixed_chunk_tokens // granule) * granule
            self.cpp_fixed_chunk_tokens = fixed
            why = f"the best for {num_stages} pipeline stages on what was measured" if fixed else "upstream's behaviour"
            logger.warning("[CPP] %s; fixed chunks of %d tokens (%s)", verdict.reason, fixed or base_tokens, why)
            return
        self.cpp_policy = CppPolicy(
            verdict.model, replace(limits, granule_tokens=granule), num_stages,
            asynchronous=isinstance(self, AsyncScheduler), calibration_window=self.cpp_config.calibration_window,
            target_tpot_ms=self.cpp_config.target_tpot_ms,
        )  # fmt: skip
        bound_ms = self.cpp_policy.rule.limits.decode_step_ms
        pace = f"; while requests decode, steps of at most {bound_ms:.2f} ms (target_tpot_ms)" if bound_ms else ""
        logger.info(
            "[CPP] latency model from %s: %s; batch-time target planned per set of prefills for %d pipeline stages%s",
            self.cpp_source, verdict.reason, num_stages, pace,
        )  # fmt: skip

    @property
    def uses_schedule_hooks(self) -> bool:
        return self.cpp_policy is not None or self.cpp_fixed_chunk_tokens is not None

    # The current latency model's chunk rule, the plan (its batch-time target and what it was planned with),
    # and the online calibration that owns the model; each None under fixed chunking.
    @property
    def cpp_rule(self) -> ChunkRule | None:
        return None if self.cpp_policy is None else self.cpp_policy.rule

    @property
    def cpp_plan(self) -> Plan | None:
        return None if self.cpp_policy is None else self.cpp_policy.plan

    @property
    def cpp_target_ms(self) -> float | None:
        return None if self.cpp_policy is None else self.cpp_policy.plan.target_ms

    @property
    def cpp_calibration(self):
        return None if self.cpp_policy is None else self.cpp_policy.calibration

    def _cpp_fault(self, where: str, error: BaseException) -> None:
        """A fault in CPP's own code: one warning, CPP off for the process (vLLM's loop from the next step)."""
        if self.cpp_policy is None and self.cpp_fixed_chunk_tokens is None:
            return
        logger.warning(
            "[CPP] %s raised %s: %s; CPP is off for the rest of this process (vLLM's own scheduling)",
            where, type(error).__name__, error, exc_info=True,
        )  # fmt: skip
        self.cpp_policy = self.cpp_fixed_chunk_tokens = self._cpp_step_budget = None
        self._cpp_sizing = False

    # ------------------------------------------------------------------ hooks
    def schedule_step_starts(self, token_budget: int) -> int:
        try:
            return self._step_starts(token_budget)
        except Exception as error:
            self._cpp_fault("the step start", error)
            return token_budget

    def _step_starts(self, token_budget: int) -> int:
        if self.cpp_fixed_chunk_tokens is not None:  # the prefills' tokens; every decode rides on top
            return cpp_held.fixed_chunk_step_tokens(self, self.cpp_fixed_chunk_tokens, token_budget)
        if self.cpp_policy is None:
            return token_budget
        budget = self.cpp_policy.budget
        self.cpp_policy.adopt_plan()  # made off the last step, while the device ran
        # A running request becomes a prefill only by admission, so with none waiting and no prefill left
        # from the last sized step, the step holds decodes only: nothing to size, nothing of it tracked.
        state = self.cpp_running
        self._cpp_sizing = bool(state.prefills or self.waiting or self.skipped_waiting)
        self._cpp_step_budget = budget if self._cpp_sizing else None
        if not self._cpp_sizing:  # the loop's per-request hooks are the identity ones for this step
            if not self._cpp_identity:
                self.__dict__.update(self._cpp_identity_hooks)
                self._cpp_identity = True
            return token_budget
        if self._cpp_identity:
            for name in self._cpp_identity_hooks:
                self.__dict__.pop(name, None)
            self._cpp_identity = False
        budget.start()
        self._cpp_prefix_hits.next_step()
        state.step_start(self, keep=self.cpp_keep_state, check=self.cpp_check_state)
        prefills = state.prefills
        budget.decoding(state.num_decodes > 0)  # (in flight or not, each waits for this step)
        state.reserve(self, budget)
        self._plan_if_prefills_changed(prefills)
        # After a step that advanced no prefill (no KV blocks for the one allotted), the prefills are sized as
        # vLLM visits them; after two that were granted tokens and advanced none (the loop cut them to nothing:
        # a multimodal input not to be cut), vLLM sizes them, once.
        unsized = self._cpp_cuts.step_starts()
        if not (unsized or self._cpp_stalled):
            self._allot(budget, prefills, token_budget)
        return token_budget

    def _allot(self, budget: Any, running_prefills: list, token_budget: int) -> None:
        """The step's prefills, for the budget to size: started first, then by response ratio (cpp_step_budget.py)."""
        now_s, hits = self.cpp_clock(), self._cpp_prefix_hits
        prefills = allotment_candidates(self, running_prefills, PASS_OVER_LIMIT, now_s, hits)
        if prefills:
            threshold = self.scheduler_config.long_prefill_token_threshold
            budget.allot(prefills, token_budget, threshold if threshold > 0 else math.inf)

    def _plan_if_prefills_changed(self, running_prefills: list) -> None:
        """Plan the target again when the held prefills differ from the last plan's, or decodes
        start or stop (rule 4 bounds batches for them); every decode, in flight or not, counts."""
        head = itertools.islice(waiting_in_order(self), PLAN_MAX_PREFILLS)
        ids = tuple([r.request_id for r in running_prefills] + [r.request_id for r in head])
        key = (ids, len(self.running) > len(running_prefills))  # and whether any request decodes
        self._cpp_steps_since_plan += 1
        if key == self._cpp_plan_key:
            return  # the same prefills in the same order (admission moves one from waiting to running)
        held_before = bool(self._cpp_plan_key and self._cpp_plan_key[0])
        if held_before and self._cpp_steps_since_plan < self.cpp_policy.rule.num_stages:
            return  # at most one plan per pipeline round while prefills are held: the plan stays off the step
        self._cpp_plan_key, self._cpp_steps_since_plan = key, 0
        held = held_for_plan(self, running_prefills, self._cpp_prefix_hits, self.cpp_policy.traffic, PLAN_LOOKAHEAD)
        if not held:
            return
        shape = plan_shape(held, self.cpp_running.num_decodes)  # (decodes counted as kept: no walk)
        if shape == self._cpp_plan_shape:
            # Other prefills, but of the same sizes (a stream of short prompts): the same plan would
            # come out, and planning stays off the step.
            return
        self._cpp_plan_shape = shape
        decodes = [r for r in self.running if r.num_tokens - r.num_computed_tokens <= 1]
        histories = [r.num_computed_tokens for r in decodes]
        left = [max(1, r.max_tokens - r.num_output_tokens) for r in decodes]  # (at most: a stop may come first)
        self.cpp_policy.replan(held, histories, left)  # now, or off the step while a batch is in flight

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        try:
            arrival = getattr(request, "arrival_time", None)
            if self.cpp_policy is not None and isinstance(arrival, int | float) and math.isfinite(arrival):
                self.cpp_policy.traffic.arrived(arrival)
        except Exception as error:
            self._cpp_fault("counting an arrival", error)

    def cap_running_tokens(self, request: Any, num_new_tokens: int) -> int:
        try:
            budget = self._cpp_step_budget
            if budget is None or num_new_tokens <= 0 or self._cpp_cuts.unsized:
                return num_new_tokens  # nothing to size (a decode in flight)
            remaining_tokens = request.num_tokens - request.num_computed_tokens
            if remaining_tokens <= 1:
                return num_new_tokens  # decodes are reserved at step start and never cut
            granted = budget.grant(request.num_computed_tokens, remaining_tokens, num_new_tokens, request.request_id)
            return self._cpp_cuts.grant(granted, remaining_tokens)
        except Exception as error:
            self._cpp_fault("sizing a running request", error)
            return num_new_tokens

    def cap_waiting_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> int:
        try:
            if self.cpp_policy is None or self._cpp_cuts.unsized:  # (a waiting request makes the step a sized one)
                return num_new_tokens
            left = request.num_tokens - history_tokens
            admitted = self.cpp_policy.budget.admit(history_tokens, left, num_new_tokens, request.request_id)
            return self._cpp_cuts.grant(admitted, left)
        except Exception as error:
            self._cpp_fault("sizing a waiting request", error)
            return num_new_tokens

    def charge_scheduled_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> None:
        try:
            budget = self._cpp_step_budget
            if budget is None:
                return
            if request.num_tokens - history_tokens > 1 or request.status != RequestStatus.RUNNING:
                budget.charge(request.request_id, num_new_tokens, history_tokens, reserved=False)  # a prefill
            elif not (num_new_tokens == 1 and budget.reserved is not None and budget.reserved.unit):
                budget.charge(request.request_id, num_new_tokens, history_tokens)  # (the budget's own check)
            # else: a decode scheduled as reserved (every decode with a token to schedule is), already in
        except Exception as error:
            self._cpp_fault("charging a scheduled request", error)

    def refund_scheduled_tokens(self, request: Any) -> None:
        try:
            if self.cpp_policy is not None:
                self.cpp_policy.budget.refund(request.request_id)
        except Exception as error:
            self._cpp_fault("refunding a preempted request", error)

    # ------------------------------------------------------------------ per step
    def schedule(self, *args: Any, **kwargs: Any):
        scheduler_output = super().schedule(*args, **kwargs)
        timed = False
        if self.cpp_policy is not None:
            try:
                if self._cpp_sizing:
                    timed = self._after_step(scheduler_output)
                else:  # decodes only: nothing of the step is tracked
                    self.cpp_running.untracked_step(scheduler_output)
            except Exception as error:
                self._cpp_fault("the step's bookkeeping", error)
                timed = False
        scheduler_output.cpp_time_step = timed  # the one flag the workers read
        return scheduler_output

    def _after_step(self, scheduler_output) -> bool:
        policy = self.cpp_policy
        budget, timed = policy.budget, False
        budget.settle(scheduled := scheduler_output.num_scheduled_tokens)
        if len(budget.individually) + len(budget.reserved or ()) != len(scheduled):
            self.cpp_running.stale = True  # a request went out uncharged (not reserved): read them all again
        self._cpp_stalled = not budget.prefill_tokens  # it held or could admit a prefill, and advanced none
        self._cpp_cuts.step_ends(not self._cpp_stalled)
        self.cpp_running.after_step(self, scheduler_output, budget)
        if budget.any_charged:
            config = self.cpp_config
            if budget.prefills and config.need_timing:
                self._cpp_prefill_steps += 1
                calibrating = self.cpp_timed_steps < config.max_fit_chunk
                timed = calibrating or self._cpp_prefill_steps % config.timing_every == 0
                self.cpp_timed_steps += timed
            policy.scheduled(scheduler_output, timed)
        return timed

    def planned_batch(self, scheduler_output) -> CppBatch | None:
        """The plan of a scheduled step whose model output has not come back yet."""
        return None if self.cpp_policy is None else self.cpp_policy.batch_of(scheduler_output)

    def update_from_output(self, scheduler_output, model_runner_output):
        try:
            self._calibrate(scheduler_output, model_runner_output)
        except Exception as error:
            self._cpp_fault("online calibration", error)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        try:  # (a request preempted with an output in flight may have stopped in a queue: cpp_held)
            cpp_held.settle_preempted(self, self._cpp_preempted, RequestStatus)
        except Exception as error:
            self._cpp_fault("settling the preempted requests", error)
        return outputs

    def _preempt_request(self, request: Any, timestamp: float) -> None:
        super()._preempt_request(request, timestamp)
        self._cpp_preempted.add(request)  # (its output in flight may stop it while it waits)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        self.cpp_running.stale = True  # (running requests may be preempted, with no step to say so)
        return super().reset_prefix_cache(*args, **kwargs)

    def _calibrate(self, scheduler_output, model_runner_output) -> None:
        policy = self.cpp_policy
        if policy is None:
            return
        connector = getattr(model_runner_output, "kv_connector_output", None)
        self.cpp_running.stale |= bool(connector and connector.invalid_block_ids)  # (computed tokens go back)
        self.cpp_running.output_back(scheduler_output)
        if not policy.in_flight:  # (a step not sized keeps no record)
            return
        rule = policy.rule
        policy.finished(scheduler_output, getattr(model_runner_output, "execution_time_ms", None))
        if policy.rule is not rule:
            self._cpp_plan_key = self._cpp_plan_shape = None  # plan the target again with the new model


class AsyncProfilingChunkScheduler(ProfilingChunkScheduler, AsyncScheduler):
    """The same policy under vLLM's asynchronous scheduling (core/cpp_config.py picks it; CPP keeps it on)."""
