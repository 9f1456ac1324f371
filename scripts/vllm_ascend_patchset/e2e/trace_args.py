"""The trace mode's command line (``make bench-e2e BENCH_E2E_ARGS="--trace ..."``): its flags and their checks.

``check_trace_args`` refuses bad input before any server starts (a server takes minutes
to start and profile, and a run clears the profile ours saved before), and the trace
mode's own flags given without ``--trace`` (they would be ignored by the one-prompt
bench); it fills in their defaults. The replay itself is ``trace_replay``.
"""

from __future__ import annotations

import argparse
import math

from ..twin.options import MAX_LOAD, MAX_REQUESTS, MAX_SLO_MS, MIN_LOAD
from ..twin.traces import parse_trace_item, read_slice
from . import servers
from .bench import ArgumentError, within

DEFAULT_COUNT = 20  # requests of a slice given without COUNT
TRACE_DEFAULTS = {"load": 0.8, "output_cap": 64, "fixed_pick": 1}  # the trace mode's own flags, when not given
TRACE_FLAGS = {
    "load": "--load",
    "output_cap": "--output-cap",
    "fixed_pick": "--fixed-pick",
    "target_tpot_ms": "--target-tpot-ms",
}
TRACE_SWITCHES = {"keep_profile": "--keep-profile", "report_only": "--report-only"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        help=f"trace mode: replay PATH[@START[:COUNT]] (Mooncake .jsonl or Azure .csv; START 0, COUNT {DEFAULT_COUNT})",
    )
    p.add_argument(
        "--load",
        type=float,
        help=f"trace mode: offered prefill load, of the capacity (default {TRACE_DEFAULTS['load']})",
    )
    p.add_argument(
        "--output-cap",
        type=int,
        help=f"trace mode: at most this many output tokens (default {TRACE_DEFAULTS['output_cap']})",
    )
    p.add_argument(
        "--keep-profile",
        action="store_true",
        help="trace mode: ours starts from the profile it saved in an earlier run (in --out) instead of profiling",
    )
    p.add_argument(
        "--report-only", action="store_true", help="trace mode: the last run's table again, the twin run anew"
    )
    p.add_argument(
        "--target-tpot-ms",
        type=float,
        help="trace mode: ours keeps decodes to this TPOT (target_tpot_ms); goodput is judged at it, and ours is"
        " compared with the SLO-tuned fixed chunk (the least TTFT of the chunks served whose TPOT P99 meets it)",
    )
    p.add_argument(
        "--fixed-pick",
        type=int,
        help=f"trace mode: serve the twin's N best chunks of --fixed (0: all; default {TRACE_DEFAULTS['fixed_pick']})",
    )


def check_trace_args(args: argparse.Namespace) -> None:
    """Refuse bad trace-mode input before any server starts (a server takes minutes, and the run clears the
    saved profile), and the trace mode's flags without ``--trace``; fill in their defaults. An error is an
    ``ArgumentError`` naming the flag (``run.main`` exits 2)."""
    if not args.trace:
        given = [flag for key, flag in TRACE_FLAGS.items() if getattr(args, key, None) is not None]
        given += [flag for key, flag in TRACE_SWITCHES.items() if getattr(args, key, False)]
        if given:
            raise ArgumentError(
                f"{', '.join(given)}: trace-mode flags; add --trace PATH@START:COUNT (or leave them out)"
            )
        return
    for key, value in TRACE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not (math.isfinite(args.load) and MIN_LOAD <= args.load <= MAX_LOAD):
        raise ArgumentError(
            f"--load must be a number in [{MIN_LOAD:g}, {MAX_LOAD:g}] (a share of the pipeline's prefill capacity,"
            f" as the twin's --load), got {args.load}"
        )
    longest = f"output tokens a request may generate, within the servers' max_model_len {servers.MAX_MODEL_LEN}"
    within(args.output_cap, "--output-cap", 1, servers.MAX_MODEL_LEN - 1, longest)
    target = args.target_tpot_ms
    if target is not None and not (math.isfinite(target) and 0 < target <= MAX_SLO_MS):
        raise ArgumentError(
            f"--target-tpot-ms must be a number of ms > 0 and at most a day, {MAX_SLO_MS:.0f} (ours' target_tpot_ms),"
            f" got {target}"
        )
    chunks = len([c for c in args.fixed.split(",") if c.strip()])  # (checked by bench.check_args)
    within(args.fixed_pick, "--fixed-pick", 0, chunks, "0 serves every chunk of --fixed; at most as many as it names")
    if not args.report_only and "ours" not in {w.strip() for w in args.policies.split(",")}:
        raise ArgumentError("--policies: the trace mode needs ours: its profile sets the arrivals and the twin")
    try:
        read_slice(parse_trace_item(args.trace, DEFAULT_COUNT, MAX_REQUESTS))
    except ValueError as error:
        raise ArgumentError(
            str(error).replace("--workload trace:", "--trace ").replace("e.g. trace:", "e.g. ")
        ) from None
