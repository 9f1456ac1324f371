#!/usr/bin/env python3
"""TTFT with and without dynamic chunked pipeline parallelism (CPP), side by side.

For one model, PP size and prompt length, this starts ``vllm serve`` twice on the same
host, once with fixed chunks (``profiling_chunk_config.enabled`` false) and once with
CPP, waits for ``/health``, drives each with ``vllm bench serve`` on the random dataset
(same seed, long inputs), stops the server, and prints TTFT mean, median and P99 with
the ratio CPP / fixed. Needs Ascend NPUs; ``--dry-run`` prints the exact commands.

    python scripts/bench/cpp_serve.py --model /models/Qwen3-32B --pp 4 --input-len 32768
    python scripts/bench/cpp_serve.py --model /models/Qwen3-32B --pp 4 --input-len 32768 --dry-run

Qwen3's native context is 40,960 tokens: longer inputs need the model served with YaRN
rope scaling (``--serve-arg``, as the model card describes) or vLLM refuses the length.

The first CPP start profiles the model (tens of seconds) and saves the profile under
``--cpp-cache-dir``; later starts reuse it. Compare against a tuned fixed chunk too
(``--max-num-batched-tokens``): most of the PP gain comes from chunking at all.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))  # serve_ab, also when loaded by file path
import serve_ab  # noqa: E402

METRICS = (("Mean TTFT (ms)", "mean_ttft_ms"), ("Median TTFT (ms)", "median_ttft_ms"), ("P99 TTFT (ms)", "p99_ttft_ms"))
VARIANTS = ("fixed", "cpp")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _request_rate(text: str) -> str:
    if text != "inf" and not float(text) > 0:
        raise argparse.ArgumentTypeError(f"must be 'inf' or a positive number, got {text}")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model path or name")
    parser.add_argument("--pipeline-parallel-size", "--pp", type=_positive_int, required=True, dest="pp")
    parser.add_argument("--tensor-parallel-size", "--tp", type=_positive_int, default=1, dest="tp")
    parser.add_argument("--input-len", type=_positive_int, required=True, help="random prompt tokens")
    parser.add_argument("--output-len", type=_positive_int, default=16, help="generated tokens per request")
    parser.add_argument("--num-prompts", type=_positive_int, default=32)
    parser.add_argument("--request-rate", type=_request_rate, default="inf", help="requests/s ('inf': all at once)")
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192, help="the (base) chunk")
    parser.add_argument("--max-model-len", type=_positive_int, default=None, help="default: input + output + 64")
    parser.add_argument("--cpp-config", default="{}", help="extra profiling_chunk_config keys as JSON")
    parser.add_argument("--cpp-cache-dir", default=None, help="profile cache (default: the config's)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_positive_int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling seed, the same for both runs")
    parser.add_argument("--ready-timeout-s", type=_positive_int, default=3600, help="wait for /health this long")
    parser.add_argument("--result-dir", type=Path, default=Path("results/cpp_serve"))
    parser.add_argument("--vllm", default="vllm", help="the vllm executable")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra vllm serve arguments (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.pp < 2:
        parser.error("--pipeline-parallel-size must be >= 2: CPP needs pipeline parallelism")
    serve_ab.within(parser, "--pipeline-parallel-size", args.pp, 2, serve_ab.MAX_PARALLEL)
    serve_ab.within(parser, "--tensor-parallel-size", args.tp, 1, serve_ab.MAX_PARALLEL)
    serve_ab.within(parser, "--max-num-batched-tokens", args.max_num_batched_tokens, 1, serve_ab.MAX_TOKENS)
    if args.max_model_len is not None:
        serve_ab.within(parser, "--max-model-len", args.max_model_len, 1, serve_ab.MAX_TOKENS)
    serve_ab.check_serving_args(parser, args)
    try:
        extra = json.loads(args.cpp_config)
    except json.JSONDecodeError as error:
        parser.error(f"--cpp-config is not JSON: {error}")
    if not isinstance(extra, dict) or "enabled" in extra:
        parser.error('--cpp-config must be a JSON object without "enabled" (the script sets it per run)')
    args.cpp_extra = extra
    if args.max_model_len is None:
        args.max_model_len = args.input_len + args.output_len + 64
    if args.max_model_len < args.input_len + args.output_len:
        parser.error("--max-model-len must hold --input-len + --output-len")
    check_cpp_config(parser, args)
    return args


def check_cpp_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The CPP server's section through the server's own parser, so a key it refuses stops the script here, not
    when the CPP server starts after the whole fixed-chunk run."""
    module = serve_ab.patchset_module("core.cpp_config", "--cpp-config and --cpp-cache-dir")
    if module is None:
        return
    section = additional_config(args, "cpp")["profiling_chunk_config"]
    try:
        module.parse_cpp_config(section, max_num_batched_tokens=args.max_num_batched_tokens)
    except ValueError as error:
        given = args.cpp_cache_dir is not None and f"{module.CONFIG_KEY}.cache_dir=" in str(error)
        flag = f"--cpp-cache-dir {args.cpp_cache_dir}" if given else f"--cpp-config {args.cpp_config}"
        parser.error(f"{flag}: the CPP server would refuse it at its start:\n{error}")


def additional_config(args: argparse.Namespace, variant: str) -> dict:
    config = {"enabled": variant == "cpp", **(args.cpp_extra if variant == "cpp" else {})}
    if variant == "cpp" and args.cpp_cache_dir is not None:
        config["cache_dir"] = args.cpp_cache_dir
    return {"profiling_chunk_config": config}


def serve_command(args: argparse.Namespace, variant: str) -> list[str]:
    return [
        args.vllm,
        "serve",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--pipeline-parallel-size",
        str(args.pp),
        "--tensor-parallel-size",
        str(args.tp),
        "--enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--no-enable-prefix-caching",  # random prompts; keep both runs free of cache effects
        "--additional-config",
        json.dumps(additional_config(args, variant), sort_keys=True),
        *serve_ab.split_serve_args(args.serve_arg),
    ]


def result_file(args: argparse.Namespace, variant: str) -> Path:
    return args.result_dir / f"{variant}-pp{args.pp}-in{args.input_len}.json"


def bench_command(args: argparse.Namespace, variant: str) -> list[str]:
    return serve_ab.bench_serve_command(
        args, result_file(args, variant), percentile_metrics="ttft", extra_flags=("--random-range-ratio", "0")
    )


def comparison_table(fixed: dict, cpp: dict) -> str:
    """TTFT of both runs and the ratio CPP / fixed (below 1: CPP is faster)."""
    rows = [f"{'metric':<18}{'fixed':>14}{'cpp':>14}{'cpp/fixed':>12}"]
    for label, key in METRICS:
        ratio = cpp[key] / fixed[key] if fixed[key] else float("nan")
        rows.append(f"{label:<18}{fixed[key]:>14.1f}{cpp[key]:>14.1f}{ratio:>12.3f}")
    return "\n".join(rows)


def run_variant(args: argparse.Namespace, variant: str) -> dict:
    return serve_ab.serve_and_bench(
        args, serve_command(args, variant), bench_command(args, variant), result_file(args, variant), signal.SIGINT
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        serve_ab.print_dry_run((v, serve_command(args, v), bench_command(args, v)) for v in VARIANTS)
        return 0
    args.result_dir.mkdir(parents=True, exist_ok=True)
    results = {variant: run_variant(args, variant) for variant in VARIANTS}
    print(f"model {args.model}, PP {args.pp}, TP {args.tp}, input {args.input_len} tokens, {args.num_prompts} prompts")
    print(comparison_table(results["fixed"], results["cpp"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
