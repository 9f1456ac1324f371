"""The measured gate in the real model at TP = 2, run by tp_worker.py on each rank (before its fault phase).

Timings are scripted, not measured: the measured gate's clock is replaced by one that
charges each forward of a probe its rank's scripted seconds (single or dual stream), so
what is tested is the protocol (probes, agreement across ranks, cache, faults), not this
host's speed. The ranks are scripted differently on purpose: they must still hold the
same probes and take the same decisions.

Scenarios, each from a fresh measured gate unless said otherwise:

- ``probe``: a batch of class 128 served three times with 2 probes per class: two probes
  (both ways, outputs equal to single stream's), then the decision, the same on both
  ranks; rank 1's dual runs are slower than rank 0's and the agreed (max) timing decides;
- ``cached``: a new gate on the same deployment reads what ``probe`` saved (rank 0 reads,
  every rank adopts) and probes nothing;
- ``corrupt_cache``: rank 0 finds garbage in the cache file: one warning there, and both
  ranks measure again;
- ``timing_fault``: rank 0's device wait fails during a probe: every rank falls back to
  single stream with one warning, none waits in a collective;
- ``explicit``: a set ``length_threshold`` is trusted: no measurement, dual stream.
"""

from __future__ import annotations

import types
from pathlib import Path

BATCH = "two_prompts_of_130"


def requests():
    from dual_stream.batches import Request

    return [Request(0, 130), Request(0, 130)]


class ScriptedClock:
    """``perf_counter`` for the measured gate: the end of a run adds the run's scripted seconds."""

    def __init__(self, model, single_s: float, dual_s: float):
        self.model, self.single_s, self.dual_s = model, single_s, dual_s
        self.now, self.calls, self._batches = 0.0, 0, model.dual_stream_batches

    def __call__(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # the end of a run: charge it
            dual = self.model.dual_stream_batches > self._batches
            self.now += self.dual_s if dual else self.single_s
        self._batches = self.model.dual_stream_batches
        return self.now


def run_all(model, run, rank: int, group, cache_dir: Path, capture_warnings) -> dict:
    from vllm_ascend.dual_stream import measured, measured_group
    from vllm_ascend.dual_stream.config import DualStreamConfig
    from vllm_ascend.models import qwen3 as ours

    from dual_stream.cpu_backends import GlooAsyncBackend

    batch = requests()
    reference, _cache, _ = run(batch, None, DualStreamConfig(), None)
    config = DualStreamConfig(True, "token_balanced", 1.0, None, 2, str(cache_dir))
    dual_s = 0.92 if rank == 0 else 0.94  # agreed: 0.94 <= WIN_RATIO, both ranks turn dual stream on
    saved_time = measured.time
    results = {}

    def serve(times: int, backend=None, clock=None) -> list[dict]:
        if clock is not None:
            measured.time = types.SimpleNamespace(perf_counter=clock)
        served = []
        for _ in range(times):
            before = model.dual_stream_batches
            out, _caches, _took = run(batch, None, config, backend or GlooAsyncBackend(group.device_group),
                                      keep_switch=True)  # fmt: skip
            mode = model.dual_stream_measured
            served.append({
                "dual_runs": model.dual_stream_batches - before,
                "max_out_diff": float((out - reference).abs().max()),
                "probes": [] if mode is None else [[p.size_class, p.single_s, p.dual_s] for p in mode.gate.probes],
                "reason": model.dual_stream_last_reason,
            })  # fmt: skip
        return served

    def fresh(switch_on=True):
        model.dual_stream_measured = None
        model._dual_stream_on = switch_on

    warnings, detach = capture_warnings(ours)
    group_warnings, detach_group = capture_warnings(measured_group)
    try:
        fresh()
        clock = ScriptedClock(model, 1.0, dual_s)
        results["probe"] = {"served": serve(3, clock=clock), "clock_calls": clock.calls,
                            "crossover": model.dual_stream_measured.gate.crossover(),
                            "cache_files": sorted(p.name for p in cache_dir.glob("*.json"))}  # fmt: skip
        fresh()
        clock = ScriptedClock(model, 1.0, 2.0)  # would turn it off, were anything measured
        results["cached"] = {"served": serve(1, clock=clock), "clock_calls": clock.calls,
                             "crossover": model.dual_stream_measured.gate.crossover()}  # fmt: skip
        if rank == 0:
            for path in cache_dir.glob("*.json"):
                path.write_text("{ not json")
        group.barrier()
        fresh()
        results["corrupt_cache"] = {"served": serve(1, clock=ScriptedClock(model, 1.0, 0.5)),
                                    "warnings": list(group_warnings)}  # fmt: skip
        fresh()
        del warnings[:]
        backend = GlooAsyncBackend(group.device_group)
        if rank == 0:
            backend.synchronize = _lost_device
        served = serve(2, backend=backend, clock=ScriptedClock(model, 1.0, 0.5))
        results["timing_fault"] = {"served": served, "warnings": list(warnings), "still_on": model._dual_stream_on}
        fresh()
        explicit = DualStreamConfig(True, "token_balanced", 1.0, 64, 2, str(cache_dir))
        before = model.dual_stream_batches
        out, _caches, took = run(batch, None, explicit, GlooAsyncBackend(group.device_group))
        results["explicit"] = {"took_dual": took, "dual_runs": model.dual_stream_batches - before,
                               "measured": model.dual_stream_measured is not None,
                               "max_out_diff": float((out - reference).abs().max())}  # fmt: skip
    finally:
        measured.time = saved_time
        detach()
        detach_group()
        model.dual_stream_measured = None
    results["out_scale"] = float(reference.abs().max())
    return results


def _lost_device():
    raise RuntimeError("injected: device wait failed on rank 0")
