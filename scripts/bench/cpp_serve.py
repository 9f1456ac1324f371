#!/usr/bin/env python3
"""TTFT with and without dynamic chunked pipeline parallelism (CPP), side by side.

For one model, PP size and prompt length, this starts ``vllm serve`` twice on the same
host, once with fixed chunks (``profiling_chunk_config.enabled`` false) and once with
CPP, waits for ``/health``, drives each with ``vllm bench serve`` on the random dataset
(same seed, long inputs), stops the server, and prints TTFT mean, median and P99 with
the ratio CPP / fixed. Needs Ascend NPUs; ``--dry-run`` prints the exact commands.

    python scripts/bench/cpp_serve.py --model /models/Qwen3-32B --pp 4 --input-len 65536
    python scripts/bench/cpp_serve.py --model /models/Qwen3-32B --pp 4 --input-len 65536 --dry-run

The first CPP start profiles the model (tens of seconds) and saves the profile under
``--cpp-cache-dir``; later starts reuse it. Compare against a tuned fixed chunk too
(``--max-num-batched-tokens``): most of the PP gain comes from chunking at all.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

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
    return args


def additional_config(args: argparse.Namespace, variant: str) -> dict:
    config = {"enabled": variant == "cpp", **(args.cpp_extra if variant == "cpp" else {})}
    if variant == "cpp" and args.cpp_cache_dir is not None:
        config["cache_dir"] = args.cpp_cache_dir
    return {"profiling_chunk_config": config}


def serve_command(args: argparse.Namespace, variant: str) -> list[str]:
    command = [
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
    ]
    for extra in args.serve_arg:
        command += shlex.split(extra)
    return command


def result_file(args: argparse.Namespace, variant: str) -> Path:
    return args.result_dir / f"{variant}-pp{args.pp}-in{args.input_len}.json"


def bench_command(args: argparse.Namespace, variant: str) -> list[str]:
    result = result_file(args, variant)
    return [
        args.vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        args.request_rate,
        "--seed",
        str(args.seed),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def comparison_table(fixed: dict, cpp: dict) -> str:
    """TTFT of both runs and the ratio CPP / fixed (below 1: CPP is faster)."""
    rows = [f"{'metric':<18}{'fixed':>14}{'cpp':>14}{'cpp/fixed':>12}"]
    for label, key in METRICS:
        ratio = cpp[key] / fixed[key] if fixed[key] else float("nan")
        rows.append(f"{label:<18}{fixed[key]:>14.1f}{cpp[key]:>14.1f}{ratio:>12.3f}")
    return "\n".join(rows)


def _wait_ready(args: argparse.Namespace, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + args.ready_timeout_s
    url = f"http://{args.host}:{args.port}/health"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(5)
    raise TimeoutError(f"vllm serve not ready after {args.ready_timeout_s} s")


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_variant(args: argparse.Namespace, variant: str) -> dict:
    server = subprocess.Popen(serve_command(args, variant))
    try:
        _wait_ready(args, server)
        subprocess.run(bench_command(args, variant), check=True)
    finally:
        _stop(server)
    return json.loads(result_file(args, variant).read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for variant in VARIANTS:
            print(f"# {variant}")
            print(shlex.join(serve_command(args, variant)))
            print(shlex.join(bench_command(args, variant)))
        return 0
    args.result_dir.mkdir(parents=True, exist_ok=True)
    results = {variant: run_variant(args, variant) for variant in VARIANTS}
    print(f"model {args.model}, PP {args.pp}, TP {args.tp}, input {args.input_len} tokens, {args.num_prompts} prompts")
    print(comparison_table(results["fixed"], results["cpp"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
