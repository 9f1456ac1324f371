"""ProfilingChunkScheduler: dynamic chunked pipeline parallelism through the scheduler hooks.

Under pipeline parallelism a batch's time is what a pipeline stage spends on it, and
stages stay busy only when batches take equal time. This scheduler holds no copy of
vLLM's loop: upstream's loop (BalanceScheduler.schedule) calls the hooks of
core/schedule_hooks.py, and this class answers them.

The budget rule, per step:

    budget_ms = target_ms - [c0 + sum over running decodes of decode_ms(H)
                             + sum over prefill chunks admitted so far of request_ms(C, H)]

target_ms is the model's time of one base chunk (max_num_batched_tokens) with no
history. Decodes are reserved first, at their true history, and are never cut. Each
prefill, running or waiting, in vLLM's own order, then gets

    C = min(next_chunk(H, R), max_chunk_within(H, budget_ms, R), vLLM's own cap)

where H is its true history (prefix-cache hits included) and R its tokens left; a
tail that the predictor would merge is taken whole when the batch stays within
target_ms * (1 + tail_tolerance). C = 0 means "not this step": a running prefill is
skipped, and a waiting one stops admission, so waiting requests keep FCFS order. The
step's first prefill gets at least min(floor, R) whatever the budget, where floor is
min_chunk aligned: prefills never starve behind decodes, and at long histories the floor
wins over the target (the predictor's rule; the batch then exceeds target_ms). When
nothing else is in the batch, the prefill gets next_chunk(H, R). With no accepted
latency model (profiling failed or was rejected), the hooks are off and vLLM's own
loop schedules fixed chunks of max_num_batched_tokens.

Timing: the scheduler marks a step for timing (``scheduler_output.cpp_time_step``)
only if it holds a prefill chunk, and then every such step until ``max_fit_chunk``
steps have been timed, afterwards one in ``timing_every``. Unmarked steps cost the
workers no device synchronisation. A marked step's ``execution_time_ms`` comes back on
the model output and is fed, with the step's (C, H) pairs, to the online calibration.

Driving it without an engine (tests, the pipeline twin): construct it like any vLLM
scheduler, call ``run_profiling_chunk_init(executor)`` once, where
``executor.collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns per-worker latencies in ms (or pass ``measure=fn`` with
``fn(chunk_tokens, history_tokens) -> ms``), then alternate ``schedule()`` and
``update_from_output(output, model_runner_output)``; set
``model_runner_output.execution_time_ms`` for steps whose ``cpp_time_step`` is True.
``planned_batch(output)`` gives a step's (chunk_tokens, history_tokens) pairs and
predicted time until its model output is back; the plan stays in the scheduler and
only the flag travels to the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_ascend.core.cpp_config import CONFIG_KEY, parse_cpp_config
from vllm_ascend.core.cpp_profiling import fingerprint_for, initialise_profile, measure_with_executor
from vllm_ascend.core.profiling_chunk_predictor import ProfilingChunkManager
from vllm_ascend.patch.platform.patch_balance_schedule import BalanceScheduler

logger = init_logger(__name__)

MAX_BATCHES_IN_FLIGHT = 64  # far more than pipeline stages; a bound in case an output is dropped


@dataclass(frozen=True)
class CppBatch:
    """What the scheduler planned for one step: its (chunk_tokens, history_tokens) pairs."""

    pairs: tuple[tuple[int, int], ...]
    predicted_ms: float
    timed: bool


class ProfilingChunkScheduler(BalanceScheduler):
    """Per-step time budget for prefill chunks; see the module docstring."""

    def __init__(self, vllm_config, *args: Any, fingerprint: dict | None = None, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        additional = getattr(vllm_config, "additional_config", None) or {}
        self.cpp_config = parse_cpp_config(
            additional.get(CONFIG_KEY), max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens
        )
        self.profiling_chunk_manager = ProfilingChunkManager(
            base_chunk_size=self.max_num_scheduled_tokens,
            page_size=self.cache_config.block_size,
            max_model_len=self.max_model_len,
            max_num_scheduled_tokens=self.max_num_scheduled_tokens,
            smooth_factor=self.cpp_config.smooth_factor,
            min_chunk=self.cpp_config.min_chunk,
            tail_tolerance=self.cpp_config.tail_tolerance,
            fingerprint=fingerprint if fingerprint is not None else fingerprint_for(vllm_config),
            window_size=self.cpp_config.max_fit_chunk,
            warmup_samples=0,
        )
        self.cpp_source: str | None = None
        self._cpp_predictor = None
        self._cpp_profiled = False
        self._cpp_timed_steps = 0
        self._cpp_prefill_steps = 0
        self._cpp_batches: dict[int, CppBatch] = {}  # id(SchedulerOutput) -> its plan, until its output
        self._reset_step()

    # ------------------------------------------------------------------ start-up
    def run_profiling_chunk_init(self, model_executor: Any = None, *, measure=None) -> None:
        """Adopt a cached profile or profile the workers once; on failure keep fixed chunking."""
        if self._cpp_profiled:
            return
        self._cpp_profiled = True
        manager = self.profiling_chunk_manager
        try:
            if measure is None and model_executor is not None:
                measure = measure_with_executor(model_executor)
            kv_capacity_tokens = self.kv_cache_config.num_blocks * self.cache_config.block_size
            room_tokens = min(self.max_model_len, kv_capacity_tokens) - manager.base_chunk_size
            align = manager.predictor_kwargs["page_size"]
            self.cpp_source = initialise_profile(
                manager, self.cpp_config, measure=measure, max_history_tokens=max(0, room_tokens), align=align
            )
            self._cpp_predictor = manager.predictor
        except Exception as error:  # never let CPP take the engine down: fixed chunking instead
            logger.warning("[CPP] start-up failed (%s: %s); fixed chunking for this run", type(error).__name__, error)
            self.cpp_source, self._cpp_predictor = None, None
            return
        model = manager.model
        if model is not None:
            logger.info(
                "[CPP] latency model t = c0 + c1*C + c2*H + c3*C^2 + c4*C*H, c = (%s) ms, fit error %.1f%%; "
                "target %.2f ms per batch (a %d-token chunk without history); from %s",
                ", ".join(f"{c:.4g}" for c in model.coefficients),
                100 * model.mape,
                manager.target_ms,
                manager.base_chunk_size,
                self.cpp_source,
            )

    @property
    def uses_schedule_hooks(self) -> bool:
        return self._cpp_predictor is not None

    # ------------------------------------------------------------------ hooks
    def _reset_step(self) -> None:
        self._step_used_ms = 0.0  # c0 + reserved decodes + charged requests
        self._step_charged_ms = 0.0  # charged requests only
        self._step_pairs: dict[str, tuple[int, int, float]] = {}  # chunk_tokens, history_tokens, cost_ms
        self._step_reserved_ms: dict[str, tuple[int, float]] = {}  # decodes: new_tokens, cost_ms
        self._step_prefills: set[str] = set()

    def schedule_step_starts(self, token_budget: int) -> int:
        self._reset_step()
        predictor = self._cpp_predictor
        if predictor is None:
            return token_budget
        used_ms = predictor.model.c0_ms
        reserved = self._step_reserved_ms
        for request in self.running:
            if request.num_tokens - request.num_computed_tokens > 1:
                continue  # a prefill: sized by the hooks below
            # A decode; none while its last token is in flight, unless asynchronous
            # scheduling already counts that token as a placeholder.
            new_tokens = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            if new_tokens > 0:
                cost_ms = predictor.request_ms(new_tokens, request.num_computed_tokens)
                reserved[request.request_id] = (new_tokens, cost_ms)
                used_ms += cost_ms
        self._step_used_ms = used_ms
        return token_budget

    def _prefill_tokens(self, history_tokens: int, remaining_tokens: int, num_new_tokens: int) -> int:
        predictor = self._cpp_predictor
        # The relative 1e-9 absorbs rounding: a base chunk alone must fit its own target.
        budget_ms = predictor.target_ms * (1.0 + 1e-9) - self._step_used_ms
        wanted = predictor.next_chunk(history_tokens, remaining_tokens)
        chunk = min(wanted, predictor.max_chunk_within(history_tokens, budget_ms, remaining_tokens))
        if (
            wanted == remaining_tokens
            and chunk < remaining_tokens
            and self._step_used_ms + predictor.request_ms(remaining_tokens, history_tokens) <= predictor.tail_limit_ms
        ):
            chunk = remaining_tokens  # merge the tail: no tiny last chunk costing a pipeline round
        if not self._step_prefills:
            # The step's first prefill always advances by at least the floor (min_chunk, or
            # its whole tail), even when decodes fill the budget: no prefill starves behind
            # decodes, and min_chunk means what it says at long histories.
            chunk = max(chunk, min(wanted, predictor.floor_tokens))
            if not self._step_pairs and not self._step_reserved_ms:
                chunk = max(chunk, wanted)  # nothing else in this batch: the predictor's own chunk
        return min(chunk, num_new_tokens)

    def cap_running_tokens(self, request: Any, num_new_tokens: int) -> int:
        if self._cpp_predictor is None:
            return num_new_tokens
        remaining_tokens = request.num_tokens - request.num_computed_tokens
        if remaining_tokens <= 1:
            return num_new_tokens  # decodes are reserved at step start and never cut
        return self._prefill_tokens(request.num_computed_tokens, remaining_tokens, num_new_tokens)

    def cap_waiting_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> int:
        if self._cpp_predictor is None:
            return num_new_tokens
        return self._prefill_tokens(history_tokens, request.num_tokens - history_tokens, num_new_tokens)

    def charge_scheduled_tokens(self, request: Any, history_tokens: int, num_new_tokens: int) -> None:
        predictor = self._cpp_predictor
        if predictor is None:
            return
        request_id = request.request_id
        reservation = self._step_reserved_ms.pop(request_id, None)
        if reservation is not None and reservation[0] == num_new_tokens:
            cost_ms = reservation[1]  # a decode as reserved: already in the budget
        else:
            cost_ms = predictor.request_ms(num_new_tokens, history_tokens)
            self._step_used_ms += cost_ms - (reservation[1] if reservation is not None else 0.0)
            if request.num_tokens - history_tokens > 1:
                self._step_prefills.add(request_id)
        self._step_charged_ms += cost_ms
        self._step_pairs[request_id] = (num_new_tokens, history_tokens, cost_ms)

    def refund_scheduled_tokens(self, request: Any) -> None:
        charged = self._step_pairs.pop(request.request_id, None)
        if charged is not None:
            self._step_used_ms -= charged[2]
            self._step_charged_ms -= charged[2]
        self._step_prefills.discard(request.request_id)

    # ------------------------------------------------------------------ per step
    def schedule(self, *args: Any, **kwargs: Any):
        scheduler_output = super().schedule(*args, **kwargs)
        predictor = self._cpp_predictor
        timed = False
        if predictor is not None and self._step_pairs:
            pairs = tuple((chunk, history) for chunk, history, _ in self._step_pairs.values())
            batch = CppBatch(pairs, predictor.model.c0_ms + self._step_charged_ms, False)
            if self._step_prefills and self.cpp_config.need_timing:
                self._cpp_prefill_steps += 1
                calibrating = self._cpp_timed_steps < self.cpp_config.max_fit_chunk
                timed = calibrating or self._cpp_prefill_steps % self.cpp_config.timing_every == 0
                if timed:
                    self._cpp_timed_steps += 1
                    batch = CppBatch(pairs, batch.predicted_ms, True)
            batches = self._cpp_batches
            batches[id(scheduler_output)] = batch
            if len(batches) > MAX_BATCHES_IN_FLIGHT:  # outputs that never came back
                del batches[next(iter(batches))]
        else:
            self._cpp_batches.pop(id(scheduler_output), None)
        scheduler_output.cpp_time_step = timed  # the one flag the workers read
        return scheduler_output

    def planned_batch(self, scheduler_output) -> CppBatch | None:
        """The plan of a scheduled step whose model output has not come back yet."""
        return self._cpp_batches.get(id(scheduler_output))

    def update_from_output(self, scheduler_output, model_runner_output):
        batch = self._cpp_batches.pop(id(scheduler_output), None)
        measured_ms = getattr(model_runner_output, "execution_time_ms", None)
        if batch is not None and batch.timed and measured_ms:
            logger.debug(
                "[CPP] batch of %d requests, %d tokens: predicted %.2f ms, measured %.2f ms",
                len(batch.pairs),
                sum(chunk for chunk, _ in batch.pairs),
                batch.predicted_ms,
                measured_ms,
            )
            if self.profiling_chunk_manager.record_batch(list(batch.pairs), float(measured_ms)):
                self._cpp_predictor = self.profiling_chunk_manager.predictor
        return super().update_from_output(scheduler_output, model_runner_output)


class AsyncProfilingChunkScheduler(ProfilingChunkScheduler, AsyncScheduler):
    """The same policy under vLLM's asynchronous scheduling (decodes carry output placeholders).

    core/cpp_config.py picks this class when ``async_scheduling`` is on, so turning CPP on
    does not silently turn asynchronous scheduling off.
    """
