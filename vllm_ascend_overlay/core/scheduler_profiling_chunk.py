"""ProfilingChunkScheduler: dynamic chunked pipeline parallelism through the scheduler hooks.

This scheduler holds no copy of vLLM's loop: upstream's loop (BalanceScheduler.schedule)
calls the hooks of core/schedule_hooks.py, and this class answers them with one
``StepBudget`` per step (core/cpp_chunk_rule.py, where the rule is stated). Here is
only the bookkeeping:

- start-up: ``run_profiling_chunk_init(executor)`` gets an accepted latency model
  (core/cpp_profiling.py); without one the hooks stay off and vLLM's own loop schedules
  fixed chunks of max_num_batched_tokens;
- each step that holds or may admit a prefill: running decodes are reserved at their
  true history, then every prefill, running or waiting, is granted its chunk at its true
  history (prefix-cache hits included); a grant of 0 skips a running request and stops
  admission of waiting ones, so FCFS order holds. A step with no prefill left and none
  waiting holds decodes only and is not sized (nor looked at per request);
- the batch-time target is planned again only when the set of held prefills changes
  (an arrival, a prompt finished, a preemption), from the prefills in FCFS order, the
  decodes' share of a batch and the largest batch still in flight;
- timing: a step that holds a prefill chunk is marked for timing
  (``scheduler_output.cpp_time_step``): every such step until ``max_fit_chunk`` were
  timed, then one in ``timing_every``; unmarked steps cost the workers nothing. A marked
  step's ``execution_time_ms`` (the slowest stage's compute) feeds online calibration.

Driving it without an engine (tests, the pipeline twin): construct it like any vLLM
scheduler, call ``run_profiling_chunk_init(executor)`` once, where
``executor.collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns per-worker latencies in ms (or pass ``measure=fn``), then
alternate ``schedule()`` and ``update_from_output(output, model_runner_output)``.
``planned_batch(output)`` gives a step's (chunk_tokens, history_tokens) pairs and
predicted time until its model output is back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_ascend.core.cpp_calibration import OnlineCalibration
from vllm_ascend.core.cpp_chunk_rule import DEFAULT_FLOOR_TOKENS, PLAN_MAX_PREFILLS, ChunkLimits, ChunkRule, StepBudget
from vllm_ascend.core.cpp_config import CONFIG_KEY, parse_cpp_config
from vllm_ascend.core.cpp_profile_store import fingerprint_for
from vllm_ascend.core.cpp_profiling import initialise_profile, measure_with_executor
from vllm_ascend.patch.platform.patch_balance_schedule import BalanceScheduler

logger = init_logger(__name__)

MAX_BATCHES_IN_FLIGHT = 64  # far more than pipeline stages; a bound in case an output is dropped


@dataclass(frozen=True)
class CppBatch:
    """What the scheduler planned for one step (the step budget's ``charged``, kept as it was)."""

    charged: dict[str, tuple[int, int, float]]  # request -> chunk_tokens, history_tokens, ms
    predicted_ms: float
    timed: bool

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The step's (chunk_tokens, history_tokens) pairs."""
        return tuple((chunk, history) for chunk, history, _ in self.charged.values())


class ProfilingChunkScheduler(BalanceScheduler):
    """Per-step time budget for prefill chunks; see the module docstring."""

    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        additional = getattr(vllm_config, "additional_config", None) or {}
        self.cpp_config = parse_cpp_config(
            additional.get(CONFIG_KEY), max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens
        )
        self.cpp_source: str | None = None
        self.cpp_calibration: OnlineCalibration | None = None
        self._cpp_budget: StepBudget | None = None
        self._cpp_profiled = False
        self.cpp_timed_steps = 0
        self._cpp_prefill_steps = 0
        self._cpp_plan_key: tuple | None = None
        self._cpp_batches: dict[int, CppBatch] = {}  # id(SchedulerOutput) -> its plan, until its output
        self._cpp_sizing = False  # this step holds or may admit a prefill
        self._cpp_open_prefills: list = []  # running requests that were prefills after the last sized step

    # ------------------------------------------------------------------ start-up
    def run_profiling_chunk_init(self, model_executor: Any = None, *, measure=None) -> None:
        """Adopt a cached profile or profile the workers once; on failure keep fixed chunking."""
        if self._cpp_profiled:
            return
        self._cpp_profiled = True
        config = self.cpp_config
        base_tokens = self.max_num_scheduled_tokens
        try:
            if measure is None and model_executor is not None:
                measure = measure_with_executor(model_executor)
            kv_capacity_tokens = self.kv_cache_config.num_blocks * self.cache_config.block_size
            max_history_tokens = max(0, min(self.max_model_len, kv_capacity_tokens) - base_tokens)
            model, samples, self.cpp_source = initialise_profile(
                config,
                fingerprint=fingerprint_for(self.vllm_config),
                base_chunk_tokens=base_tokens,
                measure=measure,
                max_history_tokens=max_history_tokens,
                max_chunk_tokens=base_tokens,
            )
        except Exception as error:  # never let CPP take the engine down: fixed chunking instead
            logger.warning("[CPP] start-up failed (%s: %s); fixed chunking for this run", type(error).__name__, error)
            self.cpp_source = None
            return
        if model is None:
            return
        limits = ChunkLimits(
            max_chunk_tokens=base_tokens,
            max_model_len=self.max_model_len,
            min_chunk_tokens=DEFAULT_FLOOR_TOKENS if config.min_chunk is None else config.min_chunk,
            smooth_factor=config.smooth_factor,
            tail_tolerance=config.tail_tolerance,
            max_batch_ms=config.max_batch_ms,
        )
        rule = ChunkRule(model, limits, self.parallel_config.pipeline_parallel_size)
        self._cpp_budget = StepBudget(rule)
        self.cpp_calibration = OnlineCalibration(
            model,
            samples,
            reference_chunk_tokens=base_tokens,
            window_size=config.calibration_window,
        )
        logger.info(
            "[CPP] latency model t = c0 + c1*C + c2*H + c3*C^2 + c4*C*H, c = (%s) ms, fit error %.1f%%, "
            "from %s; batch-time target planned per set of prefills for %d pipeline stages",
            ", ".join(f"{c:.4g}" for c in model.coefficients),
            100 * model.mape,
            self.cpp_source,
            rule.num_stages,
        )

    @property
    def uses_schedule_hooks(self) -> bool:
        return self._cpp_budget is not None

    @property
    def cpp_rule(self) -> ChunkRule | None:
        """The chunk rule of the accepted latency model (None: fixed chunking)."""
        return None if self._cpp_budget is None else self._cpp_budget.rule

    @property
    def cpp_target_ms(self) -> float | None:
        """The batch-time target of the current plan (None: fixed chunking)."""
        return None if self._cpp_budget is None else self._cpp_budget.target_ms

    # ------------------------------------------------------------------ hooks
    def schedule_step_starts(self, token_budget: int) -> int:
        budget = self._cpp_budget
        if budget is None:
            return token_budget
        budget.start()
        # A running request becomes a prefill only by admission from the waiting queue, so
        # with none waiting and no prefill left from the last sized step, the step holds
        # decodes only: nothing to size, and the per-request bookkeeping is skipped.
        self._cpp_sizing = bool(self._cpp_open_prefills or self.waiting)
        if not self._cpp_sizing:
            return token_budget
        prefills = []
        decodes = []
        for request in self.running:
            history_tokens = request.num_computed_tokens
            num_tokens = request.num_tokens
            if num_tokens - history_tokens > 1:
                prefills.append(request)
                continue
            # A decode; none while its last token is in flight, unless asynchronous
            # scheduling already counts that token as a placeholder.
            new_tokens = num_tokens - history_tokens + request.num_output_placeholders
            if request.spec_token_ids:
                new_tokens += len(request.spec_token_ids)
            if new_tokens > 0:
                decodes.append((request.request_id, new_tokens, history_tokens))
        budget.reserve_decodes(decodes)
        self._cpp_open_prefills = prefills  # and, after the step, the prefills it admitted
        self._plan_if_prefills_changed(prefills)
        return token_budget

    def _plan_if_prefills_changed(self, running_prefills: list) -> None:
        """Plan the target again when the held prefills differ from the last plan's.

        Every decoding request, in flight or not, counts: without asynchronous scheduling a
        decode rides in one batch of every P (its next token needs the last one back), so
        a batch carries 1/P of their cost.
        """
        waiting = [r for _, r in zip(range(PLAN_MAX_PREFILLS), self.waiting, strict=False)]
        key = tuple([r.request_id for r in running_prefills] + [r.request_id for r in waiting])
        if key == self._cpp_plan_key:
            return  # the same prefills in the same order (admission moves one from waiting to running)
        self._cpp_plan_key = key
        held = [(r.num_computed_tokens, r.num_tokens - r.num_computed_tokens) for r in running_prefills]
        held += [(r.num_computed_tokens, r.num_tokens - r.num_computed_tokens) for r in waiting]
        if not held:
            return
        budget = self._cpp_budget
        rule = budget.rule
        inflight_ms = max((batch.predicted_ms for batch in self._cpp_batches.values()), default=0.0)
        decoding = [r.num_computed_tokens for r in self.running if r.num_tokens - r.num_computed_tokens <= 1]
        share = 1.0 if isinstance(self, AsyncScheduler) else 1.0 / rule.num_stages
        decode_ms = share * sum(rule.model.decode_ms(history) for history in decoding)
        budget.target_ms = rule.plan_target(
            held, fixed_ms=rule.model.c0_ms + decode_ms, inflight_ms=inflight_ms, decoding=len(decoding)
        )
        logger.debug("[CPP] %d prefill(s) held: batch-time target %.2f ms", len(held), budget.target_ms)

    def cap_running_tokens(self, request: Any, num_new_tokens: int) -> int:
        budget = self._cpp_budget
        if budget is None or not self._cpp_sizing or request.request_id in budget.charged:
            return num_new_tokens  # a decode reserved at step start: never cut
        remaining_tokens = request.num_tokens - request.num_computed_tokens
        if remaining_tokens <= 1:
            return num_new_tokens  # decodes are reserved at step start and never cut
        return budget.grant(request.num_computed_tokens, remaining_tokens, num_new_tokens)

    def cap_waiting_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> int:
        budget = self._cpp_budget
        if budget is None:  # (a waiting request makes the step a sized one)
            return num_new_tokens
        return budget.grant(history_tokens, request.num_tokens - history_tokens, num_new_tokens)

    def charge_scheduled_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> None:
        budget = self._cpp_budget
        if budget is not None and self._cpp_sizing:
            budget.charge(request.request_id, num_new_tokens, history_tokens)

    def refund_scheduled_tokens(self, request: Any) -> None:
        if self._cpp_budget is not None:
            self._cpp_budget.refund(request.request_id)

    # ------------------------------------------------------------------ per step
    def schedule(self, *args: Any, **kwargs: Any):
        scheduler_output = super().schedule(*args, **kwargs)
        budget = self._cpp_budget
        timed = False
        if budget is not None and self._cpp_sizing:
            budget.settle(scheduler_output.num_scheduled_tokens)
            # The prefills still short of their prompt after this step; admitted ones included.
            requests, charged = self.requests, budget.prefills
            candidates = [r for r in self._cpp_open_prefills if r.request_id not in charged]
            candidates += [requests[r] for r in charged if r in requests]
            self._cpp_open_prefills = [r for r in candidates if r.num_tokens - r.num_computed_tokens > 1]
        if budget is not None and budget.charged:
            config = self.cpp_config
            if budget.prefills and config.need_timing:
                self._cpp_prefill_steps += 1
                calibrating = self.cpp_timed_steps < config.max_fit_chunk
                timed = calibrating or self._cpp_prefill_steps % config.timing_every == 0
                self.cpp_timed_steps += timed
            batches = self._cpp_batches
            batches[id(scheduler_output)] = CppBatch(budget.charged, budget.predicted_ms(), timed)
            if len(batches) > MAX_BATCHES_IN_FLIGHT:  # outputs that never came back
                del batches[next(iter(batches))]
        scheduler_output.cpp_time_step = timed  # the one flag the workers read
        return scheduler_output

    def planned_batch(self, scheduler_output) -> CppBatch | None:
        """The plan of a scheduled step whose model output has not come back yet."""
        return self._cpp_batches.get(id(scheduler_output))

    def update_from_output(self, scheduler_output, model_runner_output):
        batch = self._cpp_batches.pop(id(scheduler_output), None)
        measured_ms = getattr(model_runner_output, "execution_time_ms", None)
        if batch is not None and batch.timed and measured_ms and self.cpp_calibration is not None:
            logger.debug(
                "[CPP] batch of %d requests, %d tokens: predicted %.2f ms, measured %.2f ms",
                len(batch.pairs),
                sum(chunk for chunk, _ in batch.pairs),
                batch.predicted_ms,
                measured_ms,
            )
            model = self.cpp_calibration.record(batch.pairs, float(measured_ms))
            if model is not None:
                budget = self._cpp_budget
                budget.rule = budget.rule.with_model(model)
                self._cpp_plan_key = None  # plan the target again with the new model
        return super().update_from_output(scheduler_output, model_runner_output)


class AsyncProfilingChunkScheduler(ProfilingChunkScheduler, AsyncScheduler):
    """The same policy under vLLM's asynchronous scheduling (decodes carry output placeholders).

    core/cpp_config.py picks this class when ``async_scheduling`` is on, so turning CPP on
    does not silently turn asynchronous scheduling off.
    """
