#!/usr/bin/env python3
"""TTFT and TPOT of a Qwen3 dense model at TP=2 with and without dual stream, side by side.

For an Ascend host with the patched wheel installed. For each variant (dual stream off,
then on) it starts ``vllm serve MODEL --tensor-parallel-size 2`` with the variant's
``--additional-config``, waits for ``/health``, drives it with ``vllm bench serve`` at
a fixed reference setting (random prompts of 2600 input tokens, 400 requests, all sent at
once), stops the server, and finally prints mean, median and P99 TTFT and TPOT of both runs
and the change in percent. Both runs serve eagerly (``--enforce-eager``): dual stream splits
only eager batches, and the single-stream run is served the same way, so the two differ in
the dual-stream config alone.

    python scripts/bench/dual_stream_ttft.py --model /models/Qwen3-32B
    python scripts/bench/dual_stream_ttft.py --model /models/Qwen3-32B --dry-run   # commands only

The two runs are measured one after the other on the same machine; the ratio is the
result, not either absolute number.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # serve_ab, also when loaded by file path
import serve_ab  # noqa: E402

METRICS = (
    ("Mean TTFT (ms)", "mean_ttft_ms"),
    ("Median TTFT (ms)", "median_ttft_ms"),
    ("P99 TTFT (ms)", "p99_ttft_ms"),
    ("Mean TPOT (ms)", "mean_tpot_ms"),
    ("Median TPOT (ms)", "median_tpot_ms"),
    ("P99 TPOT (ms)", "p99_tpot_ms"),
)
STRATEGIES = ("half_batch", "token_balanced")
BUDGET_FLAG = "--max-num-batched-tokens"  # vllm serve's; a --serve-arg gives it
CONFIG_FLAGS = {
    key: f"--{key.replace('_', '-')}" for key in ("split_strategy", "balance_threshold", "length_threshold")
}
SMALLEST_DEFAULT_BUDGET = 2048  # vllm serve's default budget on devices under 70 GiB (8192 above)


@dataclass(frozen=True)
class Variant:
    name: str  # also the result file stem
    label: str
    dual_stream: bool


VARIANTS = (Variant("single_stream", "single stream", False), Variant("dual_stream", "dual stream", True))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Qwen3 dense model path or name")
    parser.add_argument("--tensor-parallel-size", "--tp", type=int, default=2, dest="tp")
    parser.add_argument("--input-len", type=_positive_int, default=2600, help="prompt tokens a request (default 2600)")
    parser.add_argument("--output-len", type=_positive_int, default=128, help="generated tokens per request")
    parser.add_argument("--num-prompts", type=_positive_int, default=400, help="requests (default: 400, sent at once)")
    parser.add_argument("--request-rate", default="inf", help="requests/s for vllm bench serve (inf: all at once)")
    parser.add_argument("--split-strategy", choices=STRATEGIES, default="token_balanced")
    parser.add_argument("--balance-threshold", type=_positive_float, default=None, help="default: the config's")
    parser.add_argument("--length-threshold", type=_positive_int, default=None, help="default: the config's")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_positive_int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling seed, the same for both runs")
    parser.add_argument("--ready-timeout-s", type=_positive_int, default=1800, help="wait for /health this long")
    parser.add_argument("--result-dir", type=Path, default=Path("results/dual_stream_ttft"))
    parser.add_argument("--vllm", default="vllm", help="the vllm executable")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra argument for vllm serve, both runs (repeatable)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.tp < 2:
        parser.error("--tensor-parallel-size must be >= 2: dual stream overlaps the TP all-reduce, none at TP=1")
    serve_ab.within(parser, "--tensor-parallel-size", args.tp, 2, serve_ab.MAX_PARALLEL)
    if args.request_rate != "inf":
        try:
            if not float(args.request_rate) > 0:  # NaN too
                raise ValueError
        except ValueError:
            parser.error(f"--request-rate must be 'inf' or a number > 0, got {args.request_rate!r}")
    if args.balance_threshold is not None and not math.isfinite(args.balance_threshold):
        parser.error(f"--balance-threshold must be a finite number > 0, got {args.balance_threshold}")
    if args.length_threshold is not None:
        serve_ab.within(parser, "--length-threshold", args.length_threshold, 1, serve_ab.MAX_TOKENS)
    serve_ab.check_serving_args(parser, args)
    check_dual_stream_config(parser, args)
    return args


def serve_budget(args: argparse.Namespace) -> int | None:
    """The ``--max-num-batched-tokens`` a ``--serve-arg`` gives the servers (the last one, as vLLM reads it), or
    None when none does (vLLM's default then, which depends on the device) or it is not a plain number."""
    words = serve_ab.split_serve_args(args.serve_arg)
    value = None
    for i, word in enumerate(words):
        if word == BUDGET_FLAG and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(f"{BUDGET_FLAG}="):
            value = word.partition("=")[2]
    return int(value) if value is not None and value.isdigit() else None


def check_dual_stream_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The dual-stream server's section through the server's own parser, and against the batch budget as the
    server checks it, so what it refuses stops the script here, not after the whole single-stream run."""
    budget = serve_budget(args)
    if args.length_threshold is not None and budget is None and 2 * args.length_threshold > SMALLEST_DEFAULT_BUDGET:
        print(
            f"warning: --length-threshold {args.length_threshold} is above half of {SMALLEST_DEFAULT_BUDGET}, the "
            f"{BUDGET_FLAG} vLLM serves with by default on devices under 70 GiB; the dual-stream server refuses "
            f"it there. Give the budget with --serve-arg '{BUDGET_FLAG} N' to have it checked now",
            file=sys.stderr,
        )
    module = serve_ab.patchset_module("dual_stream.config", "--split-strategy, --balance-threshold and the budget")
    if module is None:
        return
    section = additional_config(args, VARIANTS[1])["dual_stream_config"]
    try:
        module.DualStreamConfig.from_dict(section)
    except ValueError as error:
        named = [flag for key, flag in CONFIG_FLAGS.items() if f"{module.CONFIG_KEY}.{key}=" in str(error)]
        parser.error(f"{', '.join(named or CONFIG_FLAGS.values())}: the dual-stream server refuses it:\n{error}")
    for why in module.budget_problems(args.length_threshold, budget) if budget is not None else []:
        given = f"--length-threshold {args.length_threshold}" if args.length_threshold else "without --length-threshold"
        parser.error(f"{given} and --serve-arg '{BUDGET_FLAG} {budget}': the dual-stream server refuses it: {why}")


def additional_config(args: argparse.Namespace, variant: Variant) -> dict:
    config: dict = {"enabled": variant.dual_stream}
    if variant.dual_stream:
        config["split_strategy"] = args.split_strategy
        if args.balance_threshold is not None:
            config["balance_threshold"] = args.balance_threshold
        if args.length_threshold is not None:
            config["length_threshold"] = args.length_threshold
    return {"dual_stream_config": config}


def serve_command(args: argparse.Namespace, variant: Variant) -> list[str]:
    return [
        args.vllm,
        "serve",
        args.model,
        "--tensor-parallel-size",
        str(args.tp),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--enforce-eager",  # both runs: dual stream splits eager batches only (a captured graph is one stream)
        "--additional-config",
        json.dumps(additional_config(args, variant), separators=(",", ":")),
        *serve_ab.split_serve_args(args.serve_arg),
    ]


def result_path(args: argparse.Namespace, variant: Variant) -> Path:
    return args.result_dir / f"{variant.name}.json"


def bench_command(args: argparse.Namespace, variant: Variant) -> list[str]:
    return serve_ab.bench_serve_command(args, result_path(args, variant), percentile_metrics="ttft,tpot")


def change_percent(single: float, dual: float) -> float:
    return (dual - single) / single * 100.0


def comparison_table(single: dict, dual: dict) -> str:
    """Each metric for both runs and the change in percent."""
    rows = [f"{'metric':<18}{'single stream':>15}{'dual stream':>15}{'change':>10}"]
    for label, key in METRICS:
        a, b = float(single[key]), float(dual[key])
        change = f"{change_percent(a, b):+.2f}%" if a else "n/a"
        rows.append(f"{label:<18}{a:>15.2f}{b:>15.2f}{change:>10}")
    return "\n".join(rows)


def run_variant(args: argparse.Namespace, variant: Variant) -> dict:
    return serve_ab.serve_and_bench(
        args, serve_command(args, variant), bench_command(args, variant), result_path(args, variant), signal.SIGTERM
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        serve_ab.print_dry_run((v.label, serve_command(args, v), bench_command(args, v)) for v in VARIANTS)
        return 0
    args.result_dir.mkdir(parents=True, exist_ok=True)
    results = {variant.name: run_variant(args, variant) for variant in VARIANTS}
    print(
        f"{args.model}, TP={args.tp}, input {args.input_len} tokens, output {args.output_len}, "
        f"{args.num_prompts} requests, dual stream {args.split_strategy}"
    )
    print(comparison_table(results["single_stream"], results["dual_stream"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
