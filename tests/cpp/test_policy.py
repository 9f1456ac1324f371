"""CppPolicy's plans: made at once with nothing in flight, else in a planner thread for the next step."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cpp_samples import TRUE, measured_model
from vllm_ascend.core import cpp_policy
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_planner import plan_target
from vllm_ascend.core.cpp_policy import CppPolicy

LIMITS = ChunkLimits(base_chunk_tokens=4096, max_model_len=131_072)
HELD = [(0, 30_000), (0, 2_000)]
DECODING = [500, 9_000, 20_000]


@pytest.fixture(scope="module")
def model():
    return measured_model(TRUE, noise=0.0, max_history_tokens=LIMITS.max_model_len)


def policy_of(model, num_stages=4):
    return CppPolicy(model, LIMITS, num_stages, asynchronous=False, calibration_window=32)


def put_in_flight(policy, ms_of_chunk=(2048, 1000)):
    """A scheduled step whose output is not back: a prefill chunk charged to the budget."""
    policy.budget.start()
    policy.budget.charge("in-flight", *ms_of_chunk)
    output = SimpleNamespace()
    policy.scheduled(output, timed=False)
    return output


def planning_threads(monkeypatch):
    """The thread each plan is made on."""
    threads = []
    plan_target = cpp_policy.plan_target

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread())
        return plan_target(*args, **kwargs)

    monkeypatch.setattr(cpp_policy, "plan_target", recorded)
    return threads


def test_with_nothing_in_flight_the_plan_is_made_at_once_on_the_callers_thread(model, monkeypatch):
    threads = planning_threads(monkeypatch)
    policy = policy_of(model)
    before = policy.plan
    policy.replan(HELD, DECODING)
    assert threads == [threading.current_thread()]
    assert policy.plan is not before and policy.adopt_plan() is None  # nothing pending


def test_with_a_batch_in_flight_the_plan_is_made_off_the_step_and_is_the_same_plan(model, monkeypatch):
    """Made in the planner thread, adopted at the next step's start: the same plan as made at once
    from the same inputs (the batch in flight counted in both)."""
    threads = planning_threads(monkeypatch)
    at_once = policy_of(model)
    put_in_flight(at_once)
    off_step = policy_of(model)
    put_in_flight(off_step)
    old = off_step.plan
    off_step.replan(HELD, DECODING)
    assert off_step.plan is old, "the step that asked for the plan keeps the plan it started with"
    adopted = off_step.adopt_plan()
    assert threads[0] is not threading.current_thread()
    assert adopted is off_step.plan and adopted is not old
    # The same inputs planned on this thread: with the batch in flight counted as largest batch.
    inflight_ms = at_once._in_flight[0][1].predicted_ms
    expected = plan_target(
        at_once.rule,
        HELD,
        fixed_ms=model.fixed_ms + float(model.decode_ms_many(DECODING).sum()) / 4,
        inflight_ms=inflight_ms,
        decoding=len(DECODING),
        load=at_once.traffic.load(),
    )
    assert adopted == expected
    assert inflight_ms > 0


def test_one_planner_thread_serves_the_plans_and_ends_when_idle(model, monkeypatch):
    """Plans asked for one after another are made on the same thread (no thread started per plan);
    without work it ends, and the next plan starts another (as in a forked child, which has none)."""
    monkeypatch.setattr(cpp_policy, "PLANNER_IDLE_S", 0.2)
    threads = planning_threads(monkeypatch)
    policy = policy_of(model)
    put_in_flight(policy)
    for _ in range(3):
        policy.replan(HELD, DECODING)
        assert policy.adopt_plan() is not None
    assert len(threads) == 3 and len(set(threads)) == 1 and threads[0] is not threading.current_thread()
    threads[0].join(timeout=5.0)
    assert not threads[0].is_alive(), "an idle planner thread ends"
    policy.replan(HELD, DECODING)
    assert policy.adopt_plan() is not None
    assert threads[-1] is not threads[0] and threads[-1] is not threading.current_thread()


def test_a_plan_made_with_a_model_since_replaced_is_dropped(model):
    policy = policy_of(model)
    put_in_flight(policy)
    old = policy.plan
    policy.replan(HELD, DECODING)
    policy.budget.rule = policy.rule.with_model(measured_model(TRUE, noise=0.0, max_history_tokens=65_536))
    assert policy.adopt_plan() is None and policy.plan is old


def test_a_fault_in_the_planner_thread_is_raised_when_the_plan_is_adopted(model, monkeypatch):
    def faulty(*args, **kwargs):
        raise ZeroDivisionError("a fault in the planner")

    monkeypatch.setattr(cpp_policy, "plan_target", faulty)
    policy = policy_of(model)
    put_in_flight(policy)
    policy.replan(HELD, DECODING)
    with pytest.raises(ZeroDivisionError, match="a fault in the planner"):
        policy.adopt_plan()
    assert policy.adopt_plan() is None  # raised once; nothing left pending


def test_a_plan_that_does_not_come_back_is_a_fault_not_a_hang(model, monkeypatch):
    release = threading.Event()
    plan_target = cpp_policy.plan_target

    def stuck(*args, **kwargs):
        release.wait(10.0)
        return plan_target(*args, **kwargs)

    monkeypatch.setattr(cpp_policy, "plan_target", stuck)
    monkeypatch.setattr(cpp_policy, "PLAN_TIMEOUT_S", 0.05)
    policy = policy_of(model)
    put_in_flight(policy)
    policy.replan(HELD, DECODING)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            policy.adopt_plan()
    finally:
        release.set()
    assert time.monotonic() - start < 5.0


STUCK_PLAN = """
import importlib.machinery, importlib.util, sys, threading

# vllm_ascend as the tests import it (the assembled tree, or the overlay in the fast tier), without its
# package set-up: only these numpy modules are needed.
spec = importlib.machinery.ModuleSpec("vllm_ascend", None, is_package=True)
spec.submodule_search_locations = [{package!r}]
sys.modules["vllm_ascend"] = importlib.util.module_from_spec(spec)
from vllm_ascend.core import cpp_policy
from test_policy import HELD, DECODING, policy_of, put_in_flight
from cpp_samples import TRUE, measured_model

cpp_policy.plan_target = lambda *args, **kwargs: threading.Event().wait()  # never returns
cpp_policy.PLAN_TIMEOUT_S = 0.05
policy = policy_of(measured_model(TRUE, noise=0.0, max_history_tokens=131_072))
put_in_flight(policy)
policy.replan(HELD, DECODING)
try:
    policy.adopt_plan()
except TimeoutError:
    print("timed out")
"""


def test_a_plan_that_never_ends_holds_up_neither_the_step_nor_the_process_exit():
    """The planner is a daemon thread: the step gives up on it (a fault: CPP off) and the process
    still exits at once, as vLLM's engine core must when it shuts down."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    script = STUCK_PLAN.format(package=str(Path(cpp_policy.__file__).parents[1]))
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "timed out"
