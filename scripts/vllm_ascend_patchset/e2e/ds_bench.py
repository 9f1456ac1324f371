"""Dual stream in vLLM's CPU engine, timed: prefill on / off at TP = 2 (``run ds-bench``, ``make bench-e2e-ds``).

The servers are the smoke's (``ds_smoke``): the same tiny Qwen3, dual stream's workers,
gloo between the ranks, optionally slowed to an emulated link (docs/e2e.md).
"""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import Any

from ..dsbench.command import ALPHA_US_RANGE, BETA_GBPS_RANGE
from . import servers as e2e
from .bench import MAX_RUNS, ArgumentError, within
from .ds_smoke import complete_batch, read_reports, serve_command, server_env
from .model import TINY_QWEN3, write_tiny_qwen3

MODEL_LEN_SLACK = 64  # max_model_len beyond --prompt-tokens


def check_args(args: Any) -> None:
    """Every flag checked before a server starts; an ``ArgumentError`` names the flag and what to give."""
    within(args.repeats, "--repeats", 1, MAX_RUNS, "timed rounds per server")
    most = e2e.MAX_NUM_SEQS  # every prompt of a round in one batch
    if not (2 <= args.prompts <= most and args.prompts % 2 == 0):
        raise ArgumentError(
            f"--prompts must be an even number in [2, {most}] (two micro-batches of whole prompts, in one batch"
            f" of the servers' max_num_seqs {most}), got {args.prompts}"
        )
    longest = TINY_QWEN3["max_position_embeddings"] - MODEL_LEN_SLACK
    within(args.prompt_tokens, "--prompt-tokens", 1, longest, "tokens a prompt, within the model's positions")
    budget = args.prompts * args.prompt_tokens
    if budget < most:
        raise ArgumentError(
            f"--prompts {args.prompts} x --prompt-tokens {args.prompt_tokens}: the batch's {budget} tokens are the"
            f" servers' max_num_batched_tokens, which vLLM needs >= max_num_seqs ({most}); give longer prompts"
        )
    for flag, value, (low, high), unit in (
        ("--alpha-us", args.alpha_us, ALPHA_US_RANGE, "us per message"),
        ("--beta-gbps", args.beta_gbps, BETA_GBPS_RANGE, "GB/s"),
    ):
        if not low <= value <= high:  # NaN fails both
            raise ArgumentError(f"{flag} must be a number in [{low:g}, {high:g}] ({unit}, as bench-ds), got {value}")


def run(args: Any) -> int:
    """The engine's prefill time at TP = 2, dual stream off and on, over an emulated link; their ratio.

    Each round sends ``--prompts`` fresh prompts of ``--prompt-tokens`` in one request for one
    token each: one batch of prefills (the budget holds them all), timed by the client. The
    figure is the fastest round of each server (other jobs only ever slow a round down).
    """
    work = e2e.E2E_CACHE / "ds-bench"
    model_dir = write_tiny_qwen3(e2e.E2E_CACHE / "model")
    budget = args.prompts * args.prompt_tokens
    link = "" if args.bare else f"{args.alpha_us}:{args.beta_gbps}"
    times: dict[bool, list[float]] = {}
    for on in (False, True):
        run_dir = work / ("on" if on else "off")
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        command = functools.partial(_bench_command, model_dir, on, work, budget, args.prompt_tokens)
        server = e2e.ServerProcess(command, run_dir / "server.log", server_env(2, run_dir, link))
        try:
            with server:
                complete_batch(server.port, _bench_prompts(args, -1), 1)  # warm-up
                times[on] = []
                for round_index in range(args.repeats):
                    started = time.perf_counter()
                    complete_batch(server.port, _bench_prompts(args, round_index), 1)
                    times[on].append(time.perf_counter() - started)
            batches = sum(r["dual_stream_batches"] for r in read_reports(run_dir)) // 2
        except Exception as error:
            print(f"ds-bench: FAIL {'on' if on else 'off'}: {type(error).__name__}: {error}\n{server.log_tail()}")
            return 1
        print(f"ds-bench dual stream {'on' if on else 'off'}: rounds {[round(t, 3) for t in times[on]]} s; "
              f"{batches} dual-stream batches per rank")  # fmt: skip
    off, on = min(times[False]), min(times[True])
    print(f"ds-bench: TP=2, {args.prompts} x {args.prompt_tokens}-token prompts in one batch, link "
          f"{'bare (gloo as it is)' if args.bare else f'alpha {args.alpha_us} us, beta {args.beta_gbps} GB/s'}: "
          f"prefill {off * 1e3:.0f} ms off, {on * 1e3:.0f} ms on, on/off {on / off:.3f}")  # fmt: skip
    return 0


def _bench_command(model_dir: Path, on: bool, work: Path, budget: int, prompt_tokens: int, port: int) -> list[str]:
    return serve_command(model_dir, port, 2, 1, on, None, work / "cache", budget=budget,
                         length_threshold=prompt_tokens, max_model_len=prompt_tokens + MODEL_LEN_SLACK)  # fmt: skip


def _bench_prompts(args: Any, round_index: int) -> list[list[int]]:
    return [
        e2e.prompt_ids(args.prompt_tokens, 1000 * (round_index + 2) + i, TINY_QWEN3["vocab_size"], seed=5)
        for i in range(args.prompts)
    ]


def add_arguments(parser: Any) -> None:
    parser.add_argument("--prompts", type=int, default=4, help="prompts per batch (even: two per micro-batch)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per server")
    parser.add_argument("--alpha-us", type=float, default=20.0, help="emulated link: per-message latency, us")
    parser.add_argument("--beta-gbps", type=float, default=0.1, help="emulated link: bandwidth, GB/s")
    parser.add_argument("--bare", action="store_true", help="no emulated link: gloo over loopback as it is")
