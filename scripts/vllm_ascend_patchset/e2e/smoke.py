"""The e2e checks of ours alone: the smoke test (CI) and uneven pipeline stages.

- ``smoke``: ours comes up with an empty profile cache, profiles, serves a long prompt;
  a restart adopts the cache; both servers stop cleanly. ``make e2e`` runs it.
- ``uneven_stages``: with layers split unevenly, what the timed steps report against
  the profile's prediction (both must be the slowest stage's time).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import time

from .bench import ArgumentError, parse_whole_numbers, within
from .model import TINY_QWEN3, write_tiny_qwen3
from .servers import (
    CPP_LOG_MARK,
    E2E_CACHE,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    PIPELINE_STAGES,
    WORKER_PROFILE_MARK,
    Server,
    complete,
    ours,
    profile_source,
    prompt_ids,
)

# The smoke checks the path (profile, accept, save, adopt). At its base chunk of 2048 the ladder has
# 13 sizes, so 16 points profile the same runs as the bench's 32 (docs/e2e.md).
SMOKE_PROFILE_POINTS = 16
SMOKE_CONTEXT_SLACK = 1024  # context beyond the prompt: the profile's history range is what the smoke serves
OUTPUT_TOKENS = 4  # tokens each prompt of the smoke and the uneven check generates
TIMED_STEP_RE = re.compile(r"\[CPP\] batch of \d+ requests, (\d+) tokens: predicted ([\d.]+) ms, measured ([\d.]+) ms")
PROFILE_RUN_RE = re.compile(r"start-up profiling run: (\d+) tokens after (\d+), ([\d.]+) ms \(rank (\d+)\)")


def check_args(args: argparse.Namespace) -> None:
    """``smoke`` and ``uneven``: every flag checked before the server starts (vLLM takes a minute to refuse a
    bad one, or serves a prompt for hours); an ``ArgumentError`` names the flag and what to give."""
    chunks = f"max_num_batched_tokens, at least the server's max_num_seqs ({MAX_NUM_SEQS})"
    within(args.chunk, "--chunk", MAX_NUM_SEQS, MAX_MODEL_LEN, chunks)
    if args.command == "smoke":  # its max_model_len is the prompt and the slack, within the model's positions
        longest = TINY_QWEN3["max_position_embeddings"] - SMOKE_CONTEXT_SLACK
        within(args.prompt_tokens, "--prompt-tokens", 1, longest, "tokens, with the profile's slack within the model")
        return
    within(args.prompt_tokens, "--prompt-tokens", 1, MAX_MODEL_LEN - OUTPUT_TOKENS, "tokens, within max_model_len")
    total = TINY_QWEN3["num_hidden_layers"]
    layers = parse_whole_numbers(args.layers, "--layers", 1, total - 1, "layers per stage", "3,1")
    if len(layers) != PIPELINE_STAGES or sum(layers) != total:
        raise ArgumentError(
            f"--layers {args.layers}: one count per stage ({PIPELINE_STAGES} stages) adding up to the model's"
            f" {total} layers (VLLM_PP_LAYER_PARTITION), e.g. 3,1"
        )


def smoke(args: argparse.Namespace) -> int:
    """Ours comes up, profiles, serves a long prompt; a restart adopts the cache; both stop cleanly."""
    started = time.monotonic()
    work = E2E_CACHE / "smoke"
    shutil.rmtree(work, ignore_errors=True)
    model_dir = write_tiny_qwen3(E2E_CACHE / "model")
    profile_dir = work / "profiles"
    policy = ours(args.chunk, profile_points=SMOKE_PROFILE_POINTS)
    max_model_len = args.prompt_tokens + SMOKE_CONTEXT_SLACK  # not the bench's 32k
    failures: list[str] = []
    for attempt, expect in ((1, "profiled"), (2, "cache")):
        server = Server(policy, model_dir, work / f"server-{attempt}.log", profile_dir, max_model_len=max_model_len)
        try:
            with server:
                log = server.log_text()
                source = profile_source(log)
                worker_runs = log.count(WORKER_PROFILE_MARK)
                ids = prompt_ids(args.prompt_tokens, attempt, TINY_QWEN3["vocab_size"])
                result = complete(server.port, ids, OUTPUT_TOKENS)
                print(
                    f"smoke {attempt}: ready in {server.ready_s:.0f} s; latency model from {source}; "
                    f"workers logged {worker_runs} profiling runs; {args.prompt_tokens}-token prompt: "
                    f"TTFT {result['ttft_s']:.2f} s, {result['tokens']} tokens",
                    flush=True,
                )
                if source is None or not source.startswith(expect):
                    failures.append(f"start {attempt}: expected a latency model from {expect}, got {source}")
                if (worker_runs == 0) == (expect == "profiled"):
                    failures.append(f"start {attempt}: {worker_runs} worker profiling runs logged")
        except Exception as error:
            failures.append(f"start {attempt}: {type(error).__name__}: {error}")
        failures += [f"start {attempt}: {leftover}" for leftover in server.leftovers]
        if failures:
            print(f"--- tail of {server.log_path} ---\n{server.log_tail()}", file=sys.stderr)
            cpp_lines = [line for line in server.log_text().splitlines() if CPP_LOG_MARK in line]
            print("--- its CPP lines ---", *cpp_lines, sep="\n", file=sys.stderr)  # why no model, last
            break
    saved = sorted(p.name for p in profile_dir.glob("cpp-profile-*.json"))
    print(f"smoke: profiles saved {saved}; {time.monotonic() - started:.0f} s")
    for failure in failures:
        print(f"smoke: FAIL {failure}", file=sys.stderr)
    print(f"{2 - min(2, len(failures))} passed, {min(2, len(failures))} failed")
    return 1 if failures else 0


def uneven_stages(args: argparse.Namespace) -> int:
    """Ours with uneven stages: what the timed steps report against the profile's prediction.

    The profile records the slowest stage's time; a timed step must report the same
    quantity. Prints each rank's profiled time of the base chunk (how uneven the stages
    are) and measured / predicted over the timed steps (about 1 when both are the
    slowest stage; the heavy stage's share of it if only the last stage were timed).
    """
    work = E2E_CACHE / "uneven"
    shutil.rmtree(work, ignore_errors=True)
    model_dir = write_tiny_qwen3(E2E_CACHE / "model")
    extra_env = {"VLLM_PP_LAYER_PARTITION": args.layers, "VLLM_LOGGING_LEVEL": "DEBUG"}
    server = Server(ours(args.chunk), model_dir, work / "server.log", work / "profiles", extra_env)
    try:
        with server:
            result = complete(server.port, prompt_ids(args.prompt_tokens, 0, TINY_QWEN3["vocab_size"]), OUTPUT_TOKENS)
    except Exception as error:
        print(f"uneven: FAIL {type(error).__name__}: {error}\n{server.log_tail()}", file=sys.stderr)
        return 1
    log = server.log_text()
    base_ms: dict[int, list[float]] = {}
    for chunk, history, ms, rank in PROFILE_RUN_RE.findall(log):
        if int(chunk) == args.chunk and int(history) == 0:
            base_ms.setdefault(int(rank), []).append(float(ms))
    steps = [(int(t), float(p), float(m)) for t, p, m in TIMED_STEP_RE.findall(log)]
    print(f"uneven stages {args.layers}: TTFT {result['ttft_s']:.2f} s for {args.prompt_tokens} tokens")
    for rank, values in sorted(base_ms.items()):
        print(f"  rank {rank}: profiled {args.chunk}-token chunk, median {statistics.median(values):.1f} ms")
    if not steps:
        print("uneven: FAIL no timed step reached the scheduler", file=sys.stderr)
        return 1
    ratios = [measured / predicted for _, predicted, measured in steps if predicted > 0]
    print(f"  {len(steps)} timed steps: measured / predicted median {statistics.median(ratios):.3f}")
    for tokens, predicted, measured in steps[:8]:
        print(f"    {tokens} tokens: predicted {predicted:.1f} ms, measured {measured:.1f} ms")
    return 0
