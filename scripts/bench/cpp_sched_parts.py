"""CPP's own pieces of a scheduling step, timed for scripts/bench/cpp_sched_overhead.py (``--parts``), and
the time spent planning, on the engine's thread and off it. Imported once vLLM and the assembled tree are set up."""

from __future__ import annotations

import threading
import time


def timing_plans(policy_module) -> dict[str, float]:
    """Seconds spent planning (``plan_target`` as core/cpp_policy.py calls it): ``step`` on the engine's thread,
    ``off`` in another."""
    spent = {"step": 0.0, "off": 0.0}
    plan_target = getattr(policy_module, "plan_target", None)
    if plan_target is None:  # (a tree from before the policy called the planner by name: not timed)
        return spent

    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return plan_target(*args, **kwargs)
        finally:
            where = "step" if threading.current_thread() is threading.main_thread() else "off"
            spent[where] += time.thread_time() - start

    policy_module.plan_target = timed
    return spent


# CPP's own pieces of a step, timed by ``--parts``: (owner: the scheduler class, the step budget or
# cpp_held's function the scheduler module imported, name, label).
PARTS = (
    ("scheduler", "_step_starts", "step start (all of it)"),
    ("held", "allotment_candidates", "  waiting prompts' prefix-cache lookups"),
    ("running", "step_start", "  running requests brought to the step"),
    ("budget", "reserve_unit_decodes", "  decodes' reservation"),
    ("budget", "allot", "  allotment's sizing"),
    ("scheduler", "_plan_if_prefills_changed", "  check whether to plan"),
    ("scheduler", "_after_step", "step's record after it"),
    ("scheduler", "_calibrate", "output's return to the policy"),
)


def timing_parts(scheduler_cls: type) -> dict[str, float]:
    """Wraps CPP's pieces of a step (``PARTS``) in wall-clock timers: seconds spent in each.

    A piece's own time only; the loop over the running requests is what the step start
    spends outside its timed pieces. Each timer costs about a microsecond a call, so a run
    with ``--parts`` prints the pieces, not ratios to quote."""
    import importlib

    from vllm_ascend.core import cpp_held, cpp_step_budget, scheduler_profiling_chunk

    try:  # (a tree from before the running requests were kept has no such piece: not timed)
        running = importlib.import_module("vllm_ascend.core.cpp_running").RunningState
    except ImportError:
        running = None
    spent: dict[str, float] = {label: 0.0 for _, _, label in PARTS}
    owners = {"scheduler": scheduler_cls, "budget": cpp_step_budget.StepBudget, "running": running}

    def timed(function, label):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start

        return wrapper

    for owner, name, label in PARTS:
        if owners.get(owner, cpp_held) is None or not hasattr(owners.get(owner, cpp_held), name):
            del spent[label]
        elif owner == "held":  # a function the scheduler module imported by name
            setattr(scheduler_profiling_chunk, name, timed(getattr(cpp_held, name), label))
        else:
            setattr(owners[owner], name, timed(getattr(owners[owner], name), label))
    return spent
