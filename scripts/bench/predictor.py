#!/usr/bin/env python3
"""Our CPP latency model and chunk predictor next to upstream v0.23.0's, on a measured surface.

Prints tables; asserts nothing. Upstream's ``ChunkSizePredictor`` is loaded by path from
the pristine pinned tree in the build cache (never committed) under another module
name; it imports only math, numpy and ``vllm.logger``.

1. Prediction error: ours is the measured table of the H = 0 samples plus the
   ``--fit-histories`` levels; upstream's start-up model is fitted on the H = 0 samples
   only, as at start-up; upstream's online ``fit_chunk`` sees at most its 30 points;
   each is scored by MAPE on the held-out medians.
2. Chunk time spread over a ``--prompt-tokens`` prefill: each predictor chunks the
   prompt; every chunk's time is taken from a reference model of the whole surface (the
   best estimate of the truth we have; past the measured history it continues the last
   slope), reported as max/min and coefficient of variation.
3. With ``--measure-prompt N``: the same chunkings of an N-token prompt run on the CPU
   model of scripts/measure_cpu_surface.py, every chunk timed (the real spread).
4. Cost of one ``wanted_chunk`` (ours, per step) or ``predict`` (upstream) call, and of one
   ``plan_target`` (ours, once per change of the held prefills), in microseconds.

    .venv/bin/python scripts/bench/predictor.py [--csv tests/data/cpu_surface.csv]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import os
import statistics
import sys
import timeit
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import CPU_SURFACE, PACKAGE, assembled_root  # noqa: E402
from vllm_ascend_patchset.twin.options import (  # noqa: E402
    LONGEST_REQUEST_TOKENS,
    MAX_STAGES,
    TINY_MODEL_MAX_POSITIONS,
    check_chunk,
    check_number,
)

MAX_MEASURED_PROMPT = 131_072  # --measure-prompt: a minute for 32768 tokens on the CPU model, and more than 4x per 4x

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def load_ours():
    sys.path.insert(0, str(assembled_root()))
    from vllm_ascend.core import profiling_chunk_predictor

    return profiling_chunk_predictor


def grid_part(points):
    from vllm_ascend.core.cpp_acceptance import grid_part as part

    return part(points)


def load_upstream():
    from vllm_ascend_patchset.trees import pristine_root

    path = pristine_root() / PACKAGE / "core" / "profiling_chunk_predictor.py"
    spec = importlib.util.spec_from_file_location("upstream_v0_23_0_profiling_chunk_predictor", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_surface(path: Path) -> list[tuple[int, int, float]]:
    with path.open() as handle:
        return [
            (int(r["chunk_tokens"]), int(r["history_tokens"]), float(r["latency_ms"])) for r in csv.DictReader(handle)
        ]


def medians(samples):
    groups = defaultdict(list)
    for chunk, history, ms in samples:
        groups[(chunk, history)].append(ms)
    return {key: statistics.median(values) for key, values in sorted(groups.items())}


def mape(predict, points) -> float:
    return 100.0 * float(np.mean([abs(predict(c, h) - ms) / ms for (c, h), ms in points.items()]))


def chunk_prompt(next_chunk, prompt_tokens: int) -> list[tuple[int, int]]:
    history_tokens, pairs = 0, []
    while history_tokens < prompt_tokens:
        chunk_tokens = max(
            1, min(next_chunk(history_tokens, prompt_tokens - history_tokens), prompt_tokens - history_tokens)
        )
        pairs.append((chunk_tokens, history_tokens))
        history_tokens += chunk_tokens
    return pairs


def spread_row(name, pairs, reference):
    times = [reference.time_ms(c, h) for c, h in pairs]
    body = times[:-1] if len(times) > 1 else times
    return (
        f"{name:<38} {len(pairs):>6} {min(body):>9.1f} {max(body):>9.1f} {max(body) / min(body):>8.2f} "
        f"{100 * statistics.pstdev(body) / statistics.mean(body):>7.1f}% {times[-1]:>9.1f} {sum(times) / 1000:>9.2f}"
    )


def measure_chunkings(chunkings, prompt_tokens: int) -> None:
    """Time every chunk of each chunking on the surface's CPU model (thread CPU time, one thread)."""
    import torch
    from measure_cpu_surface import CLOCKS, TinyQwen3, TinyQwen3Shape, time_point_ms

    torch.manual_seed(0)
    torch.set_num_threads(1)
    shape = TinyQwen3Shape()
    model = TinyQwen3(shape).eval()
    kv_caches = [
        tuple(torch.randn(shape.num_kv_heads, prompt_tokens, shape.head_dim) for _ in range(2))
        for _ in range(shape.num_layers)
    ]
    generator = torch.Generator().manual_seed(0)
    print(f"\n{prompt_tokens}-token prefill run on the CPU model; measured chunk times, last chunk apart")
    print(
        f"{'chunking':<38} {'chunks':>6} {'min ms':>9} {'max ms':>9} {'max/min':>8} {'CV':>8} "
        f"{'last ms':>9} {'total s':>9}"
    )
    with torch.inference_mode():
        time_point_ms(model, 256, 0, kv_caches, generator, CLOCKS["thread"])  # warm-up
        for name, next_chunk in chunkings:
            pairs = chunk_prompt(next_chunk, prompt_tokens)
            times = [time_point_ms(model, c, h, kv_caches, generator, CLOCKS["thread"]) for c, h in pairs]
            body = times[:-1] if len(times) > 1 else times
            print(
                f"{name:<38} {len(pairs):>6} {min(body):>9.1f} {max(body):>9.1f} {max(body) / min(body):>8.2f} "
                f"{100 * statistics.pstdev(body) / statistics.mean(body):>7.1f}% {times[-1]:>9.1f} "
                f"{sum(times) / 1000:>9.2f}"
            )


def check_args(args: argparse.Namespace) -> None:
    """Every flag before the predictors are loaded; a ValueError names the flag and what to give."""
    if not args.csv.is_file():
        raise ValueError(f"--csv {args.csv}: not a file; give a latency surface CSV (tests/data/cpu_surface.csv)")
    for history in args.fit_histories:
        check_number(history, "--fit-histories", 0, TINY_MODEL_MAX_POSITIONS, why="history tokens of the CSV's rows")
    check_chunk(args.base_chunk, "--base-chunk")
    check_number(args.page_size, "--page-size", 1, args.base_chunk, why="tokens, at most --base-chunk")
    for prompt in args.prompt_tokens:
        check_number(prompt, "--prompt-tokens", 1, LONGEST_REQUEST_TOKENS, why="tokens the twin's model takes")
    check_number(args.smooth_factor, "--smooth-factor", 0, 1, low_open=True)
    check_number(args.stages, "--stages", 2, MAX_STAGES, why="ours plans for pipeline parallelism")
    check_number(args.min_chunk, "--min-chunk", 1, args.base_chunk, why="tokens, at most --base-chunk")
    check_number(args.measure_prompt, "--measure-prompt", 0, MAX_MEASURED_PROMPT, why="tokens; 0: off")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CPU_SURFACE)
    parser.add_argument("--fit-histories", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--base-chunk", type=int, default=4096)
    parser.add_argument("--page-size", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[32_768, 131_072])
    parser.add_argument("--smooth-factor", type=float, default=1.0)
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages ours plans its target for")
    parser.add_argument("--min-chunk", type=int, default=256, help="floor for ours and upstream's predictors")
    parser.add_argument(
        "--measure-prompt",
        type=int,
        default=0,
        help="also run each chunking of a prompt of this many tokens on the CPU model and time every chunk "
        "(about a minute for 32768 tokens; 0: off)",
    )
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        parser.error(str(error))

    ours, upstream = load_ours(), load_upstream()
    samples = read_surface(args.csv)
    fit_levels = {0, *args.fit_histories}
    fit_samples = [s for s in samples if s[1] in fit_levels]
    held_out = {k: v for k, v in medians(samples).items() if k[1] not in fit_levels}
    startup = [s for s in samples if s[1] == 0]

    def measured(rows):
        """Ours: the model of the grid the samples measured (every size at every history)."""
        points, scatter = ours.group_points(rows)
        return ours.LatencyModel.from_points(grid_part(points), scatter)

    our_model = measured(fit_samples)
    our_startup = measured(startup)
    reference = measured(samples)

    up_startup = upstream.ChunkSizePredictor(smooth_factor=args.smooth_factor, min_chunk=args.min_chunk)
    up_startup.fit([c for c, _, _ in startup], [ms for _, _, ms in startup])
    up_startup.set_target_latency(args.base_chunk)
    up_startup.is_ready = True
    up_c = up_startup.constant_coeff_c
    up_online = upstream.ChunkSizePredictor(smooth_factor=args.smooth_factor, min_chunk=args.min_chunk)
    up_online.fit([c for c, _, _ in startup], [ms for _, _, ms in startup])
    up_online.set_target_latency(args.base_chunk)
    up_online.is_ready = True
    fit_points = list(medians(fit_samples).items())
    step = max(1, math.ceil(len(fit_points) / up_online.max_fit_chunk))
    rows = [[(h + c) * c, h + c, 1, ms] for (c, h), ms in fit_points[::step]]
    up_online.with_history_ready = up_online.fit_chunk(rows)

    print(f"surface {args.csv} : {len(samples)} samples, {len(medians(samples))} points")
    print(
        f"fit on H in {sorted(fit_levels)}; held out {len(held_out)} points at H in "
        f"{sorted({h for _, h in held_out})}\n"
    )
    print(f"{'model':<48} {'held-out MAPE':>14}")
    table = [
        ("ours, measured table (H=0 + fit levels)", our_model.time_ms),
        ("ours, H=0 only (continued flat in H)", our_startup.time_ms),
        ("upstream start-up f(H+C)-f(H)  (its get_time)", lambda c, h: up_startup.get_time(c, h)),
        ("upstream start-up f(H+C)-f(H)+c", lambda c, h: up_startup.get_time(c, h) + up_c),
        (f"upstream online a*C(C+H)+b(C+H)+c ({len(rows)} pts)", lambda c, h: up_online.get_time_with_history(c, h)),
        ("reference (ours on every level)", reference.time_ms),
    ]
    for name, predict in table:
        print(f"{name:<48} {mape(predict, held_out):>13.1f}%")

    page = args.page_size
    longest_prompt = max(args.prompt_tokens)
    limits = ours.ChunkLimits(
        base_chunk_tokens=args.base_chunk,
        max_model_len=longest_prompt + args.base_chunk,
        min_chunk_tokens=args.min_chunk,
        smooth_factor=args.smooth_factor,
    )
    our_rule = ours.ChunkRule(our_model, limits, args.stages)

    def our_chunking(prompt_tokens):
        plan = ours.plan_target(our_rule, [(0, prompt_tokens)])
        return lambda history_tokens, remaining_tokens: our_rule.wanted_chunk(history_tokens, remaining_tokens, plan)

    def upstream_next(predictor, with_history):
        predict = predictor.predict_with_history if with_history else predictor.predict

        def next_chunk(history_tokens, remaining_tokens):
            chunk = predict(history_tokens, args.base_chunk, page)
            return min(args.base_chunk if chunk is None else chunk, remaining_tokens)

        return next_chunk

    def chunkings(prompt_tokens):
        listed = [
            ("fixed base chunk", lambda h, r: min(args.base_chunk, r)),
            (f"ours (P={args.stages})", our_chunking(prompt_tokens)),
            ("upstream start-up predict", upstream_next(up_startup, False)),
        ]
        if up_online.with_history_ready:
            listed.append(("upstream online predict_with_history", upstream_next(up_online, True)))
        return listed

    measured_history = max(h for _, h, _ in samples)
    for prompt_tokens in args.prompt_tokens:
        where = "within" if prompt_tokens <= measured_history else "beyond"
        print(
            f"\n{prompt_tokens}-token prefill ({where} the measured history {measured_history}), base chunk "
            f"{args.base_chunk}, page {page}, floor {args.min_chunk}; chunk times from the reference model, "
            "last chunk apart"
        )
        print(
            f"{'chunking':<38} {'chunks':>6} {'min ms':>9} {'max ms':>9} {'max/min':>8} {'CV':>8} "
            f"{'last ms':>9} {'total s':>9}"
        )
        for name, next_chunk in chunkings(prompt_tokens):
            print(spread_row(name, chunk_prompt(next_chunk, prompt_tokens), reference))

    if args.measure_prompt:
        measure_chunkings(chunkings(args.measure_prompt), args.measure_prompt)

    histories = list(range(0, longest_prompt, 997))
    calls = len(histories)

    def per_call_us(fn):
        best = min(timeit.repeat(lambda: [fn(h) for h in histories], number=20, repeat=5))
        return best / (20 * calls) * 1e6

    print(f"\ncost of one call (best of 5 x 20 x {calls} calls)")
    plan = ours.plan_target(our_rule, [(0, longest_prompt)])
    print(f"{'ours wanted_chunk':<48} {per_call_us(lambda h: our_rule.wanted_chunk(h, 50_000, plan)):>8.2f} us")
    print(f"{'ours chunk_within':<48} {per_call_us(lambda h: our_rule.chunk_within(h, 100.0, 50_000)):>8.2f} us")
    longest = [(0, longest_prompt)]
    plan_us = min(timeit.repeat(lambda: ours.plan_target(our_rule, longest), number=5, repeat=3)) / 5 * 1e6
    print(f"{'ours plan_target (once per change of prefills)':<48} {plan_us:>8.1f} us")
    print(
        f"{'upstream predict':<48} " f"{per_call_us(lambda h: up_startup.predict(h, args.base_chunk, page)):>8.2f} us"
    )
    if up_online.with_history_ready:
        print(
            f"{'upstream predict_with_history':<48} "
            f"{per_call_us(lambda h: up_online.predict_with_history(h, args.base_chunk, page)):>8.2f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
