"""End-to-end CPP and dual stream on the CPU engine, the command line (docs/e2e.md).

    python -m vllm_ascend_patchset.e2e.run smoke     # CI: ours profiles, serves, restarts from the cache
    python -m vllm_ascend_patchset.e2e.run uneven    # uneven stages: timed steps report the slowest stage
    python -m vllm_ascend_patchset.e2e.run bench     # fixed chunks, upstream's CPP and ours, side by side
    python -m vllm_ascend_patchset.e2e.run ds-smoke  # CI: dual stream at TP=2 and, with CPP, PP=2 x TP=2
    python -m vllm_ascend_patchset.e2e.run ds-bench  # dual stream's prefill time on / off at TP=2
    python -m vllm_ascend_patchset.e2e.run bench --trace PATH@START:COUNT  # a replayed trace slice (trace_replay)

Run with the e2e environment's Python (scripts/setup_e2e_env.sh). The checks live in
``smoke`` (smoke, uneven), ``bench``, ``ds_smoke`` and ``ds_bench``, the servers they
start in ``servers``. A failure prints the tail of the server's log.
"""

from __future__ import annotations

import argparse
import sys

from . import bench, ds_bench, ds_smoke, smoke, trace_args, trace_replay


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm_ascend_patchset.e2e.run", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_smoke = sub.add_parser("smoke", help="CI smoke test: profile, serve, restart from the cache, stop cleanly")
    p_smoke.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens / CPP base chunk")
    p_smoke.add_argument("--prompt-tokens", type=int, default=16384)
    p_uneven = sub.add_parser("uneven", help="uneven stages: timed steps report the slowest stage")
    p_uneven.add_argument("--layers", default="3,1", help="layers per stage (VLLM_PP_LAYER_PARTITION)")
    p_uneven.add_argument("--chunk", type=int, default=2048)
    p_uneven.add_argument("--prompt-tokens", type=int, default=16384)
    p_ds = sub.add_parser("ds-smoke", help="dual stream at TP=2 and, with CPP, at PP=2 x TP=2: outputs, counters")
    p_ds.add_argument("--cases", default="tp2,pp2-tp2", help="comma-separated: " + ", ".join(ds_smoke.CASES))
    p_ds_bench = sub.add_parser("ds-bench", help="dual stream's prefill time on / off at TP=2 over an emulated link")
    ds_bench.add_arguments(p_ds_bench)
    p_bench = sub.add_parser("bench", help="fixed chunks, upstream's CPP and ours side by side, with the twin")
    bench.add_arguments(p_bench)
    trace_args.add_arguments(p_bench)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """The command's flags, before any server starts; an ``ArgumentError`` names the bad one. Trace-mode
    flags without ``--trace`` are refused, not ignored."""
    if args.command in ("smoke", "uneven"):
        smoke.check_args(args)
    elif args.command == "ds-smoke":
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = [c for c in cases if c not in ds_smoke.CASES]
        if unknown or not cases:
            what = f"unknown {unknown}" if unknown else "none given"
            raise bench.ArgumentError(f"--cases {args.cases!r}: {what}; choose from {', '.join(ds_smoke.CASES)}")
    elif args.command == "ds-bench":
        ds_bench.check_args(args)
    else:
        bench.check_args(args)
        trace_args.check_trace_args(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except bench.ArgumentError as error:
        print(f"{args.command}: error: {error}", file=sys.stderr)
        return 2
    if args.command == "smoke":
        return smoke.smoke(args)
    if args.command == "uneven":
        return smoke.uneven_stages(args)
    if args.command == "ds-smoke":
        return ds_smoke.smoke([c.strip() for c in args.cases.split(",") if c.strip()])
    if args.command == "ds-bench":
        return ds_bench.run(args)
    return trace_replay.run(args) if args.trace else bench.run(args)


if __name__ == "__main__":
    sys.exit(main())
