#!/usr/bin/env python3
"""Measure a prefill latency surface t(C, H) on this CPU with a small Qwen3-shaped model.

The model is a stack of Qwen3-style decoder layers written in plain torch: RMSNorm,
grouped-query attention with per-head q/k RMSNorm and rotary embedding, real
softmax scores of the C new queries over all H + C keys (history keys come from a
KV cache, the causal mask is aligned to the lower right as in chunked prefill), and a
SwiGLU MLP. Sizes are small so the surface runs in minutes on two shared cores, with
few enough weights that attention's C*H term dominates at long history, as it does on
a real accelerator at 128k context.

Every (C, H) point is timed ``--repeats`` times in an interleaved order (so a burst of
load from another process hits different points, not all repeats of one), after one
untimed warm-up pass per point. The CSV keeps every repeat; fits take the median. By
default a latency is the CPU time of the single compute thread: on a shared two-core
machine wall time mostly measures the other processes.

    .venv/bin/python scripts/measure_cpu_surface.py --out tests/data/cpu_surface.csv

The other two committed surfaces change the model's width and depth, on a full grid
(every chunk size at every history, 3 repeats; about 12 and 22 minutes):

    SIZES="64 96 128 192 256 384 512 768 1024 1280 1536 1792 2048"
    .venv/bin/python scripts/measure_cpu_surface.py --out tests/data/cpu_surface_wide.csv \
        --startup-chunks $SIZES --chunks $SIZES --histories 1024 2048 4096 6144 8192 12288 16384 \
        --repeats 3 --hidden-size 1024 --num-layers 2 --num-heads 8 --num-kv-heads 2 --head-dim 128 \
        --intermediate-size 3072
    .venv/bin/python scripts/measure_cpu_surface.py --out tests/data/cpu_surface_deep.csv \
        --startup-chunks $SIZES --chunks $SIZES --histories 1024 2048 4096 6144 8192 12288 16384 \
        --repeats 3 --hidden-size 384 --num-layers 6 --num-heads 6 --num-kv-heads 2 --head-dim 64 \
        --intermediate-size 1024
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

# H = 0 is what a start-up profile sees (cheap, so sampled densely); the history levels
# are what online calibration and the held-out checks use.
DEFAULT_STARTUP_CHUNKS = tuple(range(256, 4096 + 1, 256))
DEFAULT_CHUNKS = (256, 512, 1024, 1536, 2048, 3072, 4096)
DEFAULT_HISTORIES = (2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class TinyQwen3Shape:
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 1024
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary embedding to x of shape [heads, tokens, head_dim] at the given positions."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=torch.float32) / half))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DecoderLayer(torch.nn.Module):
    def __init__(self, shape: TinyQwen3Shape) -> None:
        super().__init__()
        s = shape
        self.shape = s
        self.input_norm = RMSNorm(s.hidden_size, s.rms_eps)
        self.post_attn_norm = RMSNorm(s.hidden_size, s.rms_eps)
        self.qkv = torch.nn.Linear(s.hidden_size, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_eps)
        self.o_proj = torch.nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)
        self.gate_up = torch.nn.Linear(s.hidden_size, 2 * s.intermediate_size, bias=False)
        self.down = torch.nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        s = self.shape
        chunk_tokens = hidden.shape[0]
        residual = hidden
        x = self.input_norm(hidden)
        q, k, v = self.qkv(x).split(
            [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], dim=-1
        )
        q = self.q_norm(q.view(chunk_tokens, s.num_heads, s.head_dim)).transpose(0, 1)
        k = self.k_norm(k.view(chunk_tokens, s.num_kv_heads, s.head_dim)).transpose(0, 1)
        v = v.view(chunk_tokens, s.num_kv_heads, s.head_dim).transpose(0, 1)
        q = rotary(q, positions, s.rope_theta)
        k = rotary(k, positions, s.rope_theta)
        # Keys and values of the whole sequence so far: cached history, then this chunk.
        keys = torch.cat([k_cache, k], dim=1)
        values = torch.cat([v_cache, v], dim=1)
        attn = F.scaled_dot_product_attention(
            q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=causal_mask, enable_gqa=True
        )
        attn = attn.squeeze(0).transpose(0, 1).reshape(chunk_tokens, s.num_heads * s.head_dim)
        hidden = residual + self.o_proj(attn)
        residual = hidden
        gate, up = self.gate_up(self.post_attn_norm(hidden)).chunk(2, dim=-1)
        return residual + self.down(F.silu(gate) * up)


class TinyQwen3(torch.nn.Module):
    def __init__(self, shape: TinyQwen3Shape) -> None:
        super().__init__()
        self.shape = shape
        self.layers = torch.nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.final_norm = RMSNorm(shape.hidden_size, shape.rms_eps)

    def forward(self, hidden: torch.Tensor, history_tokens: int, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        chunk_tokens = hidden.shape[0]
        positions = torch.arange(history_tokens, history_tokens + chunk_tokens)
        # Query i sits at position H + i and sees keys 0..H + i (causal, aligned to the lower right).
        causal_mask = torch.ones(chunk_tokens, history_tokens + chunk_tokens, dtype=torch.bool).tril(history_tokens)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, positions, k_cache[:, :history_tokens], v_cache[:, :history_tokens], causal_mask)
        return self.final_norm(hidden)


CLOCKS = {
    # CPU time of the calling thread: with one torch thread it is the compute's own time and
    # is not inflated when other processes take the core (the analogue of device time).
    "thread": time.thread_time,
    "process": time.process_time,  # all threads of this process (for --threads > 1)
    "wall": time.perf_counter,
}


def time_point_ms(
    model: TinyQwen3, chunk_tokens: int, history_tokens: int, kv_caches, generator: torch.Generator, clock
) -> float:
    hidden = torch.randn(chunk_tokens, model.shape.hidden_size, generator=generator)
    start = clock()
    model(hidden, history_tokens, kv_caches)
    return (clock() - start) * 1000.0


MAX_POINT_TOKENS = 1 << 18  # a chunk or history: the deepest history's KV caches are made up front, per layer
MAX_WIDTH = 16_384  # --hidden-size, --head-dim, --intermediate-size: past a 70B model's; the "tiny" model then is not
MAX_LAYERS = 128


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every flag before the model is built or anything written; ``parser.error`` names the flag (exit 2)."""

    def within(flag: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            parser.error(f"{flag} must be in [{low}, {high}], got {value}")

    within("--repeats", args.repeats, 1, 1000)
    within("--threads", args.threads, 1, os.cpu_count() or 1)
    within("--seed", args.seed, 0, 2**32 - 1)
    for flag, values in (("--startup-chunks", args.startup_chunks), ("--chunks", args.chunks)):
        for value in values:
            within(flag, value, 1, MAX_POINT_TOKENS)
    for value in args.histories:
        within("--histories", value, 1, MAX_POINT_TOKENS)
    for flag in ("--hidden-size", "--head-dim", "--intermediate-size", "--num-heads", "--num-kv-heads"):
        within(flag, getattr(args, flag[2:].replace("-", "_")), 1, MAX_WIDTH)
    within("--num-layers", args.num_layers, 1, MAX_LAYERS)
    if args.num_heads % args.num_kv_heads:
        parser.error(f"--num-kv-heads {args.num_kv_heads} must divide --num-heads {args.num_heads} (grouped queries)")
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread measures one thread; use --clock process with --threads > 1")
    nearest = next(p for p in (args.out.parent, *args.out.parents) if p.exists() or p == Path(p.anchor))
    if args.out.is_dir() or not nearest.is_dir() or not os.access(nearest, os.W_OK):
        parser.error(f"--out {args.out}: cannot write a file there; give a CSV path in a writable folder")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/cpu_surface.csv"))
    parser.add_argument("--startup-chunks", type=int, nargs="+", default=list(DEFAULT_STARTUP_CHUNKS))
    parser.add_argument("--chunks", type=int, nargs="+", default=list(DEFAULT_CHUNKS))
    parser.add_argument("--histories", type=int, nargs="+", default=list(DEFAULT_HISTORIES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="thread", help="what a latency is (see CLOCKS)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)")
    parser.add_argument("--seed", type=int, default=0)
    defaults = TinyQwen3Shape()
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--num-layers", type=int, default=defaults.num_layers)
    parser.add_argument("--num-heads", type=int, default=defaults.num_heads)
    parser.add_argument("--num-kv-heads", type=int, default=defaults.num_kv_heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    args = parser.parse_args(argv)
    check_args(parser, args)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    shape = TinyQwen3Shape(
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size,
    )
    model = TinyQwen3(shape).eval()
    max_history = max(args.histories)
    kv_caches = [
        (
            torch.randn(shape.num_kv_heads, max_history, shape.head_dim),
            torch.randn(shape.num_kv_heads, max_history, shape.head_dim),
        )
        for _ in range(shape.num_layers)
    ]
    generator = torch.Generator().manual_seed(args.seed)
    clock = CLOCKS[args.clock]
    points = [(chunk_tokens, 0) for chunk_tokens in args.startup_chunks]
    points += [p for p in itertools.product(args.chunks, args.histories) if p[1] > 0]
    rows: list[tuple[int, int, float]] = []
    started = time.perf_counter()
    with torch.inference_mode():
        for chunk_tokens, history_tokens in points:  # warm-up: allocator and kernel choice per shape
            time_point_ms(model, chunk_tokens, history_tokens, kv_caches, generator, clock)
        order = random.Random(args.seed)
        for repeat in range(args.repeats):
            shuffled = points[:]
            order.shuffle(shuffled)
            for chunk_tokens, history_tokens in shuffled:
                latency_ms = time_point_ms(model, chunk_tokens, history_tokens, kv_caches, generator, clock)
                rows.append((chunk_tokens, history_tokens, latency_ms))
            print(f"repeat {repeat + 1}/{args.repeats} done at {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows.sort()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["chunk_tokens", "history_tokens", "latency_ms"])
        for chunk_tokens, history_tokens, latency_ms in rows:
            writer.writerow([chunk_tokens, history_tokens, f"{latency_ms:.3f}"])
    print(f"wrote {len(rows)} rows to {args.out} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
