"""What CPP decides, owned in one place: the model, the plan, the step budget, the batches in flight.

The scheduler (core/scheduler_profiling_chunk.py) holds one ``CppPolicy`` and does only
vLLM's bookkeeping: which requests are prefills and decodes, which step is which.
Everything CPP decides lives here, each piece with one owner:

- the latency model is the online calibration's (core/cpp_calibration.py): a correction
  it adopts is the model from then on, and the rule follows it;
- the plan (the batch-time target and what it was made with) is made here, from the held
  prefills, the decoding requests and the batches in flight, and handed to the step
  budget; the decode rule (each decoding request's share of a batch: one in P under
  synchronous scheduling, every batch under asynchronous) is applied here. While a batch
  is in flight the plan is made off the step, in the policy's planner thread (a daemon), and
  adopted at the next step's start: the engine waits on the device between the two
  (vLLM keeps P batches in flight under pipeline parallelism and blocks on the oldest),
  and the planner runs in that wait. With nothing in flight the device waits on this step, so
  the plan is made at once and sizes the step it was made for. Either way a step's plan
  is the same whatever the threads' timing: the next step's start waits for it;
- the traffic (``Traffic``: the latest arrivals and the sizes of the latest prefills) is
  kept here for the plan: the expected arrivals and the fixed chunk a user would tune for it;
- each scheduled step's record (``CppBatch``: what was charged, the predicted time,
  whether it is timed) is kept with its SchedulerOutput until that step's output is back.

Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import bisect
import logging
import math
import queue
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from vllm_ascend.core.cpp_calibration import OnlineCalibration
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, Plan
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_planner import plan_target
from vllm_ascend.core.cpp_running import ReservedDecodes, charged_of
from vllm_ascend.core.cpp_step_budget import StepBudget
from vllm_ascend.core.cpp_traffic import Load, Traffic
from vllm_ascend.log_adapter import get_logger

logger = get_logger(__name__)

__all__ = ["MAX_BATCHES_IN_FLIGHT", "PLAN_TIMEOUT_S", "CppBatch", "CppPolicy"]

MAX_BATCHES_IN_FLIGHT = 64  # far more than pipeline stages; a bound in case an output is dropped
PLANNER_IDLE_S = 5.0  # the planner thread ends after this long without a plan to make
PLAN_TIMEOUT_S = 30.0  # a plan takes milliseconds; one not back by then is a fault (CPP off), never a hang
PACE_WINDOW = 16  # timed steps the decode pace is kept over (a TPOT target's bound in measured time)
PACE_MIN_STEPS = 4  # fewer timed steps leave the bound as predicted
PACE_QUANTILE_TENTHS = 9  # the bound follows the slowest steps' measured over predicted time, at nine tenths
MAX_PACE_FACTOR = 2.0  # the measured pace tightens the bound by at most this factor


def decode_step_bound(model: LatencyModel, target_tpot_ms: float, steps_per_token: int) -> float:
    """A step's share of the TPOT target, raised to what a step of one decode takes (one warning when it is:
    the engine then runs at that floor, each step adding at most the floor's prefill tokens to its decodes)."""
    bound_ms, floor_ms = target_tpot_ms / steps_per_token, model.time_ms(1, 0)
    if bound_ms >= floor_ms:
        return bound_ms
    logger.warning(
        "[CPP] profiling_chunk_config.target_tpot_ms=%g is below what decodes alone reach on this deployment: "
        "a round of %d one-decode step(s) takes %.2f ms (%.2f ms a step); running at that floor: while requests "
        "decode, a prefill advances by min_chunk tokens once a round",
        target_tpot_ms,
        steps_per_token,
        steps_per_token * floor_ms,
        floor_ms,
    )
    return floor_ms


def _plan(
    rule: ChunkRule,
    held: Sequence[tuple[int, int]],
    decode_histories: np.ndarray,
    decode_share: float,
    inflight_ms: float,
    load: Load,
    decode_left: Sequence[int] = (),
) -> Plan:
    """The plan for these inputs (core/cpp_planner.py); its decodes cost their share of each batch."""
    decode_ms = decode_share * float(rule.model.decode_ms_many(decode_histories).sum())
    return plan_target(
        rule,
        held,
        fixed_ms=rule.model.fixed_ms + decode_ms,
        inflight_ms=inflight_ms,
        decoding=len(decode_histories),
        load=load,
        decode_left=decode_left,
        steps_per_token=round(1.0 / decode_share),
    )


class _Planner:
    """The daemon thread that makes the plans asked for off the step, one at a time.

    One thread serves a policy's plans: handing it one costs a queue put, where starting a
    thread per plan costs the step a hand-over of the GIL and back. A daemon, so a plan that
    never ends holds up neither the engine nor the process's exit; it ends after
    ``PLANNER_IDLE_S`` without work, and a new one starts with the next plan (also in a
    forked child, which has no threads of its parent)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, *inputs: Any) -> Future:
        """``_plan(*inputs)`` in the planner thread; the future gets its plan or its exception."""
        future: Future = Future()
        with self._lock:
            self._jobs.put((future, inputs))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="cpp-planner", daemon=True)
                self._thread.start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                future, inputs = self._jobs.get(timeout=PLANNER_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # (a plan handed over meanwhile is served first)
                        self._thread = None
                        return
                continue
            try:
                future.set_result(_plan(*inputs))
            except BaseException as error:  # (any fault goes to the step that adopts the plan)
                future.set_exception(error)


@dataclass(frozen=True)
class CppBatch:
    """What the scheduler planned for one step (the step budget's charges, kept as they were)."""

    individually: dict[str, tuple[int, int, float]]  # request -> chunk_tokens, history_tokens, ms
    predicted_ms: float
    timed: bool
    paced: bool = False  # made within a TPOT target's bound (requests decoding)
    reserved: ReservedDecodes | None = None  # the step's reserved decodes
    model: LatencyModel | None = None  # the model that predicted it (a correction may come before it is back)

    @property
    def charged(self) -> dict[str, tuple[int, int, float]]:
        """Every request of the step, reserved decodes first: request -> chunk_tokens, history_tokens, ms."""
        return charged_of(self.reserved, self.individually)

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The step's (chunk_tokens, history_tokens) pairs."""
        return tuple((chunk, history) for chunk, history, _ in self.charged.values())


class CppPolicy:
    """The model, the plan and the step budget of one scheduler (see the module docstring)."""

    def __init__(
        self,
        model: LatencyModel,
        limits: ChunkLimits,
        num_stages: int,
        *,
        asynchronous: bool,
        calibration_window: int,
        target_tpot_ms: float | None = None,
    ) -> None:
        # A decode's next token needs its last one back, one batch in P, unless asynchronous
        # scheduling counts that token as a placeholder and schedules it in every batch.
        steps_per_token = 1 if asynchronous else max(1, num_stages)
        self.decode_share = 1.0 / steps_per_token
        if target_tpot_ms is not None:  # the steps between two of a decode's tokens share the target
            limits = replace(limits, decode_step_ms=decode_step_bound(model, target_tpot_ms, steps_per_token))
        self.calibration = OnlineCalibration(model, window_size=calibration_window)
        self.budget = StepBudget(ChunkRule(model, limits, num_stages))
        self.budget.floor_every = steps_per_token
        self._in_flight: list[tuple[Any, CppBatch]] = []  # (SchedulerOutput, its record), oldest first
        self._planner = _Planner()
        self._pending: tuple[Future, ChunkRule] | None = None  # a plan made off the step, and the rule it used
        self.traffic = Traffic()
        # log(measured / predicted) of the latest paced timed steps, and their (chunk, history) pairs
        self._pace_errors: deque[tuple[float, tuple[tuple[int, int], ...]]] = deque(maxlen=PACE_WINDOW)

    @property
    def rule(self) -> ChunkRule:
        return self.budget.rule

    @property
    def plan(self) -> Plan:
        return self.budget.plan

    def replan(
        self, held: Sequence[tuple[int, int]], decode_histories: Sequence[int], decode_left: Sequence[int] = ()
    ) -> None:
        """Plan the target for the held prefills ((history, remaining) in FCFS order) and the decoding
        requests' histories: at once with nothing in flight, else in a planner thread, adopted at the
        next step's start (``adopt_plan``; this step keeps the plan it has). The inputs are this
        step's, taken now."""
        rule = self.rule
        inputs = (
            rule,
            list(held),
            np.array(decode_histories, dtype=np.float64),
            self.decode_share,
            max((batch.predicted_ms for _, batch in self._in_flight), default=0.0),
            self.traffic.load(),
            list(decode_left),
        )
        self._pending = None
        if not self._in_flight:
            self.budget.plan = _plan(*inputs)
            logger.debug("[CPP] %d prefill(s) held: batch-time target %.2f ms", len(held), self.plan.target_ms)
            return
        self._pending = (self._planner.submit(*inputs), rule)

    def adopt_plan(self) -> Plan | None:
        """A step starts: the plan made off the last step, if any, is the step budget's from now on
        (None when there was none, or the model changed since: a plan of the new model comes next)."""
        if self._pending is None:
            return None
        future, rule = self._pending
        self._pending = None
        plan = future.result(timeout=PLAN_TIMEOUT_S)  # (a fault in the planner is raised here)
        if rule is not self.rule:
            return None
        self.budget.plan = plan
        logger.debug("[CPP] batch-time target %.2f ms, planned off the last step", plan.target_ms)
        return plan

    # ------------------------------------------------------------------ steps in flight
    def scheduled(self, scheduler_output: Any, timed: bool) -> None:
        """Keep the step's record until its output is back."""
        budget = self.budget
        record = CppBatch(
            budget.individually, budget.predicted_ms(), timed, budget.paced, budget.reserved, budget.rule.model
        )
        self._in_flight.append((scheduler_output, record))
        if len(self._in_flight) > MAX_BATCHES_IN_FLIGHT:  # outputs that never came back
            del self._in_flight[0]

    @property
    def in_flight(self) -> int:
        """Records of scheduled steps whose output has not come back."""
        return len(self._in_flight)

    def batch_of(self, scheduler_output: Any) -> CppBatch | None:
        """The record of a scheduled step whose output has not come back yet."""
        return next((batch for output, batch in self._in_flight if output is scheduler_output), None)

    def finished(self, scheduler_output: Any, measured_ms: float | None) -> CppBatch | None:
        """A step's output is back: its record leaves (and is returned); a timed one refines the model,
        and a correction it adopts is the rule's model from then on."""
        index = next((i for i, (output, _) in enumerate(self._in_flight) if output is scheduler_output), None)
        if index is None:
            return None
        _, batch = self._in_flight.pop(index)
        if batch.timed and measured_ms:
            pairs = batch.pairs
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "[CPP] batch of %d requests, %d tokens: predicted %.2f ms, measured %.2f ms",
                    len(pairs),
                    sum(chunk for chunk, _ in pairs),
                    batch.predicted_ms,
                    measured_ms,
                )
            if batch.paced and batch.predicted_ms > 0 and measured_ms > 0:
                error, now = math.log(measured_ms / batch.predicted_ms), self.rule.model
                if batch.model is not None and batch.model is not now:  # in flight when a correction came
                    error -= math.log(now.batch_time_ms(pairs) / batch.model.batch_time_ms(pairs))
                self._pace_errors.append((error, pairs))
            model = self.calibration.record(pairs, float(measured_ms))
            if model is not None:
                # The new model predicts those steps otherwise: their errors move by as much, and the pace
                # is kept from them (a device slower than its profile stays paced while it is corrected).
                old = self.rule.model
                self._pace_errors = deque(
                    (
                        (error - math.log(model.batch_time_ms(p) / old.batch_time_ms(p)), p)
                        for error, p in self._pace_errors
                    ),
                    maxlen=PACE_WINDOW,
                )
                self.budget.rule = self.rule.with_model(model)
            if batch.paced or model is not None:
                self._keep_pace()
        return batch

    def _keep_pace(self) -> None:
        """The decode step bound in measured time: scaled by predicted over measured time of the latest
        ``PACE_WINDOW`` timed steps made within it (from ``PACE_MIN_STEPS`` of them), at the ratio that nine
        in ten of them reach: a decode's tokens wait for the steps as they run, and the target is the user's
        bound, so the bound leaves room for the steps the model predicts short, not only for its mean error."""
        errors = sorted(error for error, _ in self._pace_errors)
        # Steps over MAX_PACE_FACTOR times their prediction, while a minority, are stalls (a host hiccup, an
        # operator compiled for a new shape): no bound the pace can set keeps them within the target, and of
        # few steps the quantile would be one of them, for the hundreds of steps it stays here. A majority
        # is the device: the pace then tightens all it can while the model is corrected.
        within = bisect.bisect_right(errors, math.log(MAX_PACE_FACTOR))  # (sorted: the stalls are its tail)
        if 2 * within > len(errors):
            errors = errors[:within]
        if len(errors) < PACE_MIN_STEPS:
            self.budget.pace(1.0)
        else:
            # Only ever tighter than the user's bound: steps that run faster than predicted leave it as set
            # (planned up to it, mixed traffic on a measured CPU surface got 1-11% more mean TTFT at 2x the
            # decode-only round: longer batches delay the first token of what arrives meanwhile).
            scale = math.exp(-errors[(PACE_QUANTILE_TENTHS * len(errors)) // 10])
            self.budget.pace(min(max(scale, 1.0 / MAX_PACE_FACTOR), 1.0))
