"""Policy subprocess: ``python -m vllm_ascend_patchset.twin.worker JOB.json RESULT.json``.

A job names one tree and a list of cases (a setup plus its policies); the result holds,
per case, one event log per policy (or the error that stopped it).

Puts the job's vllm_ascend tree first on ``sys.path`` (pristine for vLLM's fixed chunking
and upstream's CPP, the assembled tree for ours), imports vLLM, stubs the NPU-only
modules, runs every policy of the job through ``pipeline.run_pipeline`` and writes the
event logs as JSON. One process per tree because both CPP schedulers are importable
only as ``vllm_ascend.core.scheduler_profiling_chunk``.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from ..npu_stubs import import_vllm, install_npu_stubs, set_cpu_environment
from ..trees import load_module_from_tree

UPSTREAM_TIMING_MODULE = "vllm_ascend.patch.platform.patch_profiling_chunk"
BALANCE_MODULE = "vllm_ascend.patch.platform.patch_balance_schedule"  # ours hooks into its loop


def _upstream_timed(scheduler_output: Any, stage_ms: tuple[float, ...]) -> float | None:
    """Upstream's model runner times every step until the engine patch flags calibration done,
    and reports the last stage's own compute."""
    return None if getattr(scheduler_output, "disable_profiling_timing", False) else stage_ms[-1]


def _ours_timed(scheduler_output: Any, stage_ms: tuple[float, ...]) -> float | None:
    """Ours times only the steps the scheduler marks, and reports the slowest stage's compute."""
    return max(stage_ms) if getattr(scheduler_output, "cpp_time_step", False) else None


TIMING_RULES = {"upstream": _upstream_timed, "ours": _ours_timed}


class PolicyRunner:
    """Builds a policy's scheduler, runs its start-up profiling, and wires its timing feedback."""

    def __init__(self, tree: Path, case: dict[str, Any]) -> None:
        from .surface import StageTimer
        from .surface_files import load_surface
        from .workloads import Workload

        self.tree = tree
        self.num_stages = int(case["num_stages"])
        self.surface = load_surface(case["surface"])
        self.timer = StageTimer.build(
            self.surface,
            self.num_stages,
            case.get("layers"),
            float(case.get("noise_sigma", 0.0)),
            int(case["seed"]),
            float(case.get("drift", 0.0)),
        )
        self.workload = Workload.from_json(case["workload"])
        self.async_scheduling = bool(case.get("async_scheduling", False))

    def run(self, policy: dict[str, Any]) -> dict[str, Any]:
        from .engine import (
            MODEL_LEN_SLACK_TOKENS,
            SurfaceExecutor,
            VllmDriver,
            kv_blocks_for,
            make_scheduler,
            make_vllm_config,
        )
        from .pipeline import run_pipeline

        started = time.perf_counter()
        kind = policy["kind"]
        max_model_len = max(
            self.workload.max_request_tokens + MODEL_LEN_SLACK_TOKENS, int(policy["max_num_batched_tokens"])
        )
        additional_config = policy.get("additional_config") or {}
        start_profile = policy.get("start_profile")
        with tempfile.TemporaryDirectory(prefix="cpp-twin-profile-") as profile_dir:
            if start_profile:
                from vllm_ascend.core.cpp_config import CONFIG_KEY

                cpp = {**additional_config.get(CONFIG_KEY, {}), "cache_dir": profile_dir}
                additional_config = {**additional_config, CONFIG_KEY: cpp}
            vllm_config = make_vllm_config(
                max_num_batched_tokens=int(policy["max_num_batched_tokens"]),
                num_stages=self.num_stages,
                max_model_len=max_model_len,
                additional_config=additional_config,
                async_scheduling=self.async_scheduling,
            )
            if start_profile:
                seed_profile_cache(Path(start_profile), vllm_config, profile_dir)
            scheduler_cls = self._scheduler_class(kind)
            scheduler = make_scheduler(scheduler_cls, vllm_config, kv_blocks_for(self.workload))
            executor = SurfaceExecutor(vllm_config, self.timer)
            setup_s = self._start_up(kind, scheduler, executor)
            profiled_rule = getattr(scheduler, "cpp_rule", None)
            driver = VllmDriver(scheduler, self.workload, TIMING_RULES.get(kind))
            batches = run_pipeline(driver, self.timer, self.num_stages, vllm_config.max_concurrent_batches)
        return {
            "calibration": describe_calibration(scheduler, profiled_rule, self.workload),
            "policy": policy,
            "batches": [b.to_json() for b in batches],
            "requests": [log.to_json() for log in driver.logs.values()],
            "profile_calls": executor.profile_calls,
            "start_up_cpu_s": setup_s,
            "cpu_s": time.perf_counter() - started,
            "scheduler": f"{scheduler_cls.__module__}.{scheduler_cls.__qualname__}",
            "start_up": describe_start_up(kind, scheduler, executor),
            "async_scheduling": self.async_scheduling,
        }

    def _scheduler_class(self, kind: str) -> type:
        if kind == "fixed":
            if self.async_scheduling:
                from vllm.v1.core.sched.async_scheduler import AsyncScheduler

                return AsyncScheduler
            from vllm.v1.core.sched.scheduler import Scheduler

            return Scheduler
        if kind in ("upstream", "ours"):
            if kind == "ours":
                load_module_from_tree(self.tree, BALANCE_MODULE)
            module = importlib.import_module("vllm_ascend.core.scheduler_profiling_chunk")
            if self.async_scheduling and hasattr(module, "AsyncProfilingChunkScheduler"):
                return module.AsyncProfilingChunkScheduler  # ours: what cpp_config picks when async is on
            return module.ProfilingChunkScheduler  # upstream has no asynchronous variant
        raise ValueError(f"unknown policy kind {kind!r} (fixed, upstream, ours)")

    def _start_up(self, kind: str, scheduler: Any, executor: Any) -> float:
        """What the engine does after building the scheduler: profiling, then timing hooks."""
        started = time.perf_counter()
        if kind == "upstream":
            # Upstream's engine patch: profile after init, then wrap update_from_output
            # (records execution_time_ms) and schedule (propagates timing-done).
            timing = load_module_from_tree(self.tree, UPSTREAM_TIMING_MODULE)
            scheduler.run_profiling_chunk_init(executor)
            timing._ensure_update_from_output_wrapped(scheduler)
            timing._ensure_schedule_wrapped(scheduler)
        elif kind == "ours":
            start_ours(scheduler, executor, self.tree)
        return time.perf_counter() - started


def describe_start_up(kind: str, scheduler: Any, executor: Any) -> str:
    """One line on what start-up profiling gave the scheduler (fixed chunking has none)."""
    if kind == "fixed":
        return ""
    runs = len(executor.profile_calls)
    if kind == "upstream":
        ready = bool(getattr(getattr(scheduler, "profiling_chunk_manager", None), "is_ready", False))
        return f"{runs} profiling runs; " + ("latency model ready" if ready else "NO latency model: fixed chunking")
    source = getattr(scheduler, "cpp_source", None)
    fixed_chunk = getattr(scheduler, "cpp_fixed_chunk_tokens", None)
    reason = getattr(scheduler, "cpp_verdict", None) or "no profile"
    if getattr(scheduler, "cpp_rule", None) is not None:
        outcome = f"latency model from {source}"
    elif fixed_chunk is not None:
        outcome = f"NO latency model ({reason}): fixed chunks of {fixed_chunk}, the best on what was measured"
    else:
        outcome = f"NO latency model ({reason}): fixed chunks of the token budget"
    return f"{runs} profiling runs; {outcome}"


def describe_calibration(scheduler: Any, profiled_rule: Any, workload: Any) -> dict[str, Any] | None:
    """Ours: timed steps, adopted refits, and the target planned for the first prompt before and after."""
    calibration = getattr(scheduler, "cpp_calibration", None)
    final_rule = getattr(scheduler, "cpp_rule", None)
    if calibration is None or profiled_rule is None or final_rule is None:
        return None
    from vllm_ascend.core.cpp_planner import plan_target

    first = [(0, workload.requests[0].prompt_tokens)]
    return {
        "timed_steps": scheduler.cpp_timed_steps,
        "refits_adopted": calibration.refits_adopted,
        "profiled_target_ms": plan_target(profiled_rule, first).target_ms,
        "final_target_ms": plan_target(final_rule, first).target_ms,
    }


def seed_profile_cache(profile: Path, vllm_config: Any, cache_dir: str) -> None:
    """Put ``profile``'s samples (a profile an engine saved) in ``cache_dir`` under this twin engine's
    fingerprint, so ours starts from them as a restarted server does: the same samples, judged by the
    same acceptance, give the twin's run the engine's latency model (granule included)."""
    from vllm_ascend.core.cpp_profile_store import cache_file, save_profile
    from vllm_ascend.deployment import fingerprint_for

    data = json.loads(profile.read_text())
    fingerprint = fingerprint_for(vllm_config)
    base_chunk_tokens = vllm_config.scheduler_config.max_num_batched_tokens
    found = data.get("base_chunk_size")
    if found != base_chunk_tokens:
        raise ValueError(
            f"{profile}: base_chunk_size {found} is not the policy's max_num_batched_tokens {base_chunk_tokens}"
        )
    save_profile(
        cache_file(cache_dir, fingerprint),
        fingerprint=fingerprint,
        base_chunk_tokens=base_chunk_tokens,
        samples=data["samples"],
    )


def start_ours(scheduler: Any, executor: Any, tree: Path) -> None:
    """Our ProfilingChunkScheduler's engine start-up (its start-up profiling), as the engine would call it."""
    run = getattr(scheduler, "run_profiling_chunk_init", None)
    if run is None:
        raise RuntimeError("our ProfilingChunkScheduler has no start-up profiling entry the twin knows")
    run(executor)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text())
    tree = Path(job["tree"])
    set_cpu_environment()
    sys.path.insert(0, str(tree))
    import_vllm()
    install_npu_stubs()
    cases = []
    for case in job["cases"]:
        runner = PolicyRunner(tree, case)
        results = []
        for policy in case["policies"]:
            try:
                results.append(runner.run(policy))
            except Exception as exc:  # one policy's fault must not lose the others' figures
                traceback.print_exc()
                results.append({"policy": policy, "error": f"{type(exc).__name__}: {exc}"})
        cases.append(results)
    result_path.write_text(json.dumps({"cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
