"""The twin's prediction for the e2e benchmark's cases, from the profile the engine saved.

    python -m vllm_ascend_patchset.e2e.twin_predict --surface PROFILE.json --stages 2 \
        --prompts 16384,32768 --fixed 512,2048 --chunk 2048 --json OUT
    python -m vllm_ascend_patchset.e2e.twin_predict --surface PROFILE.json --stages 2 \
        --trace tests/data/traces/mooncake.jsonl@42:20 --load 0.8 --output-cap 64 \
        --fixed 512,2048 --chunk 2048 --json OUT

Runs with the test environment's Python (the twin's, which has SciPy); prints and writes
``{policy: {prompt_tokens: ttft_mean_s}}`` for fixed chunks, upstream's CPP and ours, the
same policies and settings the real engine served. With ``--trace`` it replays the trace
mode's workload instead (``trace_replay.build_replay``: the same requests and arrivals)
and writes ``{"workload": ..., "policies": {policy: {"request_ttft_ms": {req_id: ms},
"request_tpot_ms": {...}}}}``; with ``--workload-only`` just the replay and its default SLO bounds (``twin/slo.py``)
(the e2e environment has no SciPy, which reading a profile as a surface needs).

``--pace X`` runs the simulated device X times slower than the profile (its samples' times
times X) while the requests, their arrivals and ours' start-up samples stay the profile's.
``--steps FILE`` (``{policy: [[[[chunk, history], ...], measured_ms], ...]}``: the steps
each server timed while it served, ``step_log``) sets each policy's pace apart: its
steps' measured time over the profile's time for the same batches (one stage's, as the
steps are; the twin's batch rule), summed over the steps, so the pace is the machine's
speed where the replay's work was, and a stretch of slow steps or a stall weighs what it
cost. A policy without steps runs at the median of the others' paces (``--pace`` when no
policy has any). Two shared cores serve one replay faster or slower
than the next by several percent, and at a load of 0.8 the queue magnifies that.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from ..twin import policies as pol
from ..twin.command import check_writable
from ..twin.options import (
    LONGEST_REQUEST_TOKENS,
    MAX_LOAD,
    MAX_SLO_MS,
    MAX_STAGES,
    MIN_LOAD,
    check_chunk,
    check_number,
    parse_chunks,
    parse_tokens,
)
from ..twin.report import figures_from_result
from ..twin.slo import default_slo
from ..twin.surface import Surface, batch_ms
from ..twin.surface_files import load_surface, profile_stages
from ..twin.workloads import long_prompt
from . import servers
from .trace_replay import build_replay


def ours_from(profile: str, chunk: int, **options: float) -> pol.Policy:
    """Ours with the e2e settings (and ``options``, e.g. ``target_tpot_ms``), starting from the engine's own
    profile samples: the same samples give the same latency model and the same decisions (a granule, say) as
    the engine's, where profiling the surface made of their medians could see a step in one noisy pair of
    points that the engine's scatter ruled out."""
    return dataclasses.replace(servers.ours(chunk, **options), start_profile=str(Path(profile).resolve()))


def predict(
    surface: str, stages: int, prompts: list[int], fixed: list[int], chunk: int, policies: set[str]
) -> dict[str, dict[int, float]]:
    wanted = [servers.fixed(c) for c in fixed] if "fixed" in policies else []
    if "upstream" in policies:
        wanted.append(servers.upstream(chunk))
    if "ours" in policies:
        wanted.append(ours_from(surface, chunk))
    cases = [(pol.Setup(surface, stages, long_prompt(tokens)), wanted) for tokens in prompts]
    out: dict[str, dict[int, float]] = {}
    for tokens, results in zip(prompts, pol.run_cases(cases), strict=True):
        for policy, result in zip(wanted, results, strict=True):
            if "error" in result:
                raise RuntimeError(f"twin: {policy.name} at {tokens} tokens failed: {result['error']}")
            out.setdefault(policy.name, {})[tokens] = figures_from_result(result, stages).ttft_mean_ms / 1000.0
    return out


def at_pace(profile: str, pace: float, out: Path) -> str:
    """``profile`` with every sample's time times ``pace``, written to ``out``; ``profile`` itself at pace 1."""
    if pace == 1.0:
        return profile
    if not math.isfinite(pace) or pace <= 0:
        raise ValueError(f"--pace must be a positive number, not {pace}")
    data = json.loads(Path(profile).read_text())
    samples = data.get("samples")
    if not isinstance(samples, list) or not samples:
        raise ValueError(f"{profile}: --pace needs a saved profile with 'samples' (a CPP profile cache file)")
    data["samples"] = [[chunk, history, ms * pace] for chunk, history, ms in samples]
    out.write_text(json.dumps(data))
    return str(out)


@dataclasses.dataclass(frozen=True)
class Pace:
    """How fast a server ran against the profile: its timed steps' measured over predicted time."""

    ratio: float  # summed over the steps
    low: float  # quartiles of the steps' own ratios
    high: float
    steps: int


@functools.lru_cache(maxsize=4)
def _stage_surface(profile: str) -> tuple[Surface, int]:
    """``profile`` as the twin's surface (the whole model) and the PP size its samples were taken at."""
    return load_surface(profile), profile_stages(json.loads(Path(profile).read_text()))


def serving_pace(profile: str, steps: list) -> Pace | None:
    """The pace of ``steps`` (``[[[chunk, history], ...], measured_ms]``) against ``profile`` (module doc); None
    without any."""
    surface, stages = _stage_surface(profile)
    timed = []
    for pairs, measured_ms in steps:
        predicted_ms = batch_ms(surface, [(int(c), int(h)) for c, h in pairs]) / stages
        if predicted_ms > 0 and measured_ms > 0:
            timed.append((predicted_ms, measured_ms))
    if not timed:
        return None
    ratios = [m / p for p, m in timed]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return Pace(sum(m for _, m in timed) / sum(p for p, _ in timed), low, high, len(ratios))


def policy_paces(measured: dict[str, Pace], names: list[str], default: float) -> dict[str, float]:
    """Each policy's device pace: its own steps', else the median of the others' (``default`` if none has)."""
    rest = statistics.median(p.ratio for p in measured.values()) if measured else default
    return {name: measured[name].ratio if name in measured else rest for name in names}


def trace_policies(
    surface: str, fixed: list[int], chunk: int, policies: set[str], target_tpot_ms: float | None = None
) -> list[pol.Policy]:
    """The trace mode's policies the twin replays: the fixed chunks served, upstream's CPP and ours."""
    wanted = [servers.fixed(c) for c in fixed] if "fixed" in policies else []
    if "upstream" in policies:
        wanted.append(servers.upstream(chunk))
    if "ours" in policies:
        wanted.append(ours_from(surface, chunk, **({"target_tpot_ms": target_tpot_ms} if target_tpot_ms else {})))
    return wanted


def predict_trace(
    surface: str,
    trace: str,
    load: float,
    output_cap: int | None,
    fixed: list[int],
    chunk: int,
    policies: set[str],
    paces: dict[str, float] | None = None,
    scratch: Path | None = None,
    target_tpot_ms: float | None = None,
) -> dict:
    """Every policy's per-request TTFT and TPOT (ms) on the trace mode's replay, with the replay itself.

    ``paces``: a policy's device runs at that pace (``at_pace`` of ``surface``, written under ``scratch``);
    without one, at ``surface``, the profile the requests and ours' start-up samples come from."""
    wanted = trace_policies(surface, fixed, chunk, policies, target_tpot_ms)
    workload = build_replay(surface, trace, load, output_cap, chunk)
    paces = paces or {}
    if paces and scratch is None:
        scratch = Path(tempfile.mkdtemp(prefix="twin-devices-"))
    devices = {
        p.name: at_pace(surface, paces[p.name], scratch / f"device-{p.name}.json") if p.name in paces else surface
        for p in wanted
    }
    cases = [(pol.Setup(devices[p.name], servers.PIPELINE_STAGES, workload), [p]) for p in wanted]
    results = [result for [result] in pol.run_cases(cases)]
    out: dict[str, dict] = {}
    for policy, result in zip(wanted, results, strict=True):
        if "error" in result:
            raise RuntimeError(f"twin: {policy.name} on {workload.name} failed: {result['error']}")
        figures = figures_from_result(result, servers.PIPELINE_STAGES)
        if figures.problems:
            raise RuntimeError(f"twin: {policy.name} on {workload.name} ran incomplete: {figures.problems[0]}")
        ids = [r["req_id"] for r in result["requests"]]
        out[policy.name] = {
            "request_ttft_ms": dict(zip(ids, figures.request_ttft_ms, strict=True)),
            "request_tpot_ms": dict(zip(ids, figures.request_tpot_ms, strict=True)),
            "request_cached_tokens": {r["req_id"]: r["cached_tokens"] for r in result["requests"]},
        }
    return {"workload": workload.to_json(), "notes": list(workload.notes), "policies": out}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm_ascend_patchset.e2e.twin_predict",
        description="The twin's prediction of the e2e bench's cases (or its trace replay) from a saved CPP profile.",
    )
    p.add_argument("--surface", required=True, help="the profile the engine saved (cpp-profile-*.json), or a surface")
    p.add_argument(
        "--stages", type=int, required=True, help=f"pipeline stages (the trace mode: {servers.PIPELINE_STAGES})"
    )
    p.add_argument("--prompts", default="", help="prompt lengths (one prompt each); or give --trace")
    p.add_argument("--trace", help="PATH@START:COUNT: replay the e2e trace mode's workload")
    p.add_argument("--load", type=float, default=0.8, help="with --trace: offered prefill load, of the capacity")
    p.add_argument("--output-cap", type=int, default=None, help="with --trace: at most this many output tokens")
    p.add_argument(
        "--workload-only", action="store_true", help="with --trace: write the replay's requests, run nothing"
    )
    p.add_argument(
        "--pace", type=float, default=1.0, help="with --trace: the device at this many times the profile's times"
    )
    p.add_argument(
        "--steps",
        type=Path,
        help="with --trace: JSON of each server's timed steps; each policy's device at their pace (module doc)",
    )
    p.add_argument("--fixed", default="", help="fixed chunk sizes served, comma-separated")
    p.add_argument("--target-tpot-ms", type=float, default=None, help="with --trace: ours' target_tpot_ms")
    p.add_argument("--chunk", type=int, required=True, help="CPP base chunk (max_num_batched_tokens)")
    p.add_argument("--policies", default="fixed,upstream,ours", help="subset of fixed,upstream,ours")
    p.add_argument("--json", type=Path, required=True, help="where the prediction is written")
    return p


MAX_PACE = 1000.0  # --pace: a device a thousand times slower than its profile is no longer the same machine


def check_args(args: argparse.Namespace) -> None:
    """Every flag, before the twin's workers start; a ValueError names the flag and what to give."""
    if args.trace and args.stages != servers.PIPELINE_STAGES:
        raise ValueError(f"--stages {args.stages}: the trace mode's servers run {servers.PIPELINE_STAGES} stages")
    wanted = {w.strip() for w in args.policies.split(",") if w.strip()}
    if not wanted or wanted - {"fixed", "upstream", "ours"}:
        raise ValueError(f"--policies {args.policies!r}: give some of fixed,upstream,ours, comma-separated")
    cpp = wanted & {"upstream", "ours"}
    check_number(args.stages, "--stages", 2 if cpp else 1, MAX_STAGES, why="CPP (upstream, ours) needs P >= 2")
    check_chunk(args.chunk, "--chunk")
    if args.fixed.strip():
        parse_chunks(args.fixed, "--fixed")
    longest = f"tokens; the twin's model takes requests of at most {LONGEST_REQUEST_TOKENS}"
    for item in (v for v in args.prompts.split(",") if v.strip()):
        check_number(parse_tokens(item, "--prompts item"), "--prompts", 1, LONGEST_REQUEST_TOKENS, why=longest)
    check_number(args.load, "--load", MIN_LOAD, MAX_LOAD, why="a share of the pipeline's prefill capacity")
    if args.output_cap is not None:
        check_number(args.output_cap, "--output-cap", 1, LONGEST_REQUEST_TOKENS, why=longest)
    if args.target_tpot_ms is not None:
        check_number(args.target_tpot_ms, "--target-tpot-ms", 0, MAX_SLO_MS, low_open=True, why="ms; a day at most")
    check_number(args.pace, "--pace", 0, MAX_PACE, low_open=True, why="the device's times over the profile's")
    if args.steps is not None and not args.steps.is_file():
        raise ValueError(f"--steps {args.steps}: not a file; give the JSON of the servers' timed steps")
    check_writable(args.json, "--json", folder=False)  # written once the twin has run


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        check_args(args)
        return _run(args, p)
    except (ValueError, OSError) as error:  # bad input: named, without a traceback
        p.exit(2, f"{p.prog}: error: {error}\n")


def _run(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    args.json.parent.mkdir(parents=True, exist_ok=True)  # (checked writable: made only for a run that goes ahead)
    if args.trace and args.workload_only:
        workload = build_replay(args.surface, args.trace, args.load, args.output_cap, args.chunk)
        slo = default_slo(load_surface(args.surface), args.stages)
        args.json.write_text(
            json.dumps({"workload": workload.to_json(), "notes": list(workload.notes), "slo": slo.to_json()})
        )
        return 0
    if args.trace:
        fixed = [int(v) for v in args.fixed.split(",") if v]
        policies = set(args.policies.split(","))
        steps = json.loads(args.steps.read_text()) if args.steps else {}
        measured = {name: pace for name, pace in ((n, serving_pace(args.surface, s)) for n, s in steps.items()) if pace}
        names = [p.name for p in trace_policies(args.surface, fixed, args.chunk, policies)]
        paces = policy_paces(measured, names, args.pace)  # every policy at --pace without steps
        traced = predict_trace(
            args.surface, args.trace, args.load, args.output_cap, fixed, args.chunk, policies, paces, args.json.parent,
            args.target_tpot_ms,
        )  # fmt: skip
        traced["paces"] = {name: dataclasses.asdict(pace) for name, pace in measured.items()}
        args.json.write_text(json.dumps(traced))
        print(json.dumps({name: len(times["request_ttft_ms"]) for name, times in traced["policies"].items()}))
        return 0
    if not args.prompts:
        p.error("give --prompts or --trace")
    prediction = predict(
        args.surface,
        args.stages,
        [int(v) for v in args.prompts.split(",")],
        [int(v) for v in args.fixed.split(",") if v],
        args.chunk,
        set(args.policies.split(",")),
    )
    args.json.write_text(json.dumps(prediction))
    print(json.dumps(prediction))
    return 0


if __name__ == "__main__":
    sys.exit(main())
