"""Known latency surfaces for the CPP unit tests, and start-up profiles measured on them.

A *truth* answers ``time_ms(C, H)``: the time of a step running one chunk of C tokens
after H tokens of history. The profiles are the real start-up plan
(core/cpp_profiling.py ``profile_plan``) timed on a truth, with seeded relative noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from vllm_ascend.core.cpp_acceptance import grid_part, judge
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_profiling import locate_runs, profile_plan
from vllm_ascend.core.cpp_samples import group_points


@dataclass(frozen=True)
class Quadratic:
    """c0 + c1*C + c2*H + c3*C^2 + c4*C*H milliseconds."""

    c0: float
    c1: float
    c2: float
    c3: float
    c4: float

    def time_ms(self, chunk_tokens, history_tokens):
        c, h = chunk_tokens, history_tokens
        return self.c0 + self.c1 * c + self.c2 * h + self.c3 * c * c + self.c4 * c * h


@dataclass(frozen=True)
class Bent:
    """A working set that outgrows a buffer: per-token cost flat up to ``knee_tokens``, then climbing."""

    fixed_ms: float = 3.0
    token_ms: float = 0.05
    knee_tokens: float = 1024.0
    pair_ms: float = 2e-6

    def time_ms(self, chunk_tokens, history_tokens):
        c, h = chunk_tokens, history_tokens
        spill = np.maximum(np.asarray(c, dtype=np.float64) - self.knee_tokens, 0.0)
        value = self.fixed_ms + self.token_ms * (c + 2.0 * spill**2 / self.knee_tokens) + self.pair_ms * c * (h + c / 2)
        return float(value) if np.ndim(value) == 0 else value


@dataclass(frozen=True)
class Tiles:
    """Rows processed in tiles: a chunk costs the tokens of the tiles it fills."""

    tile_tokens: int = 256
    fixed_ms: float = 40.0
    token_ms: float = 0.05
    pair_ms: float = 3e-7

    def time_ms(self, chunk_tokens, history_tokens):
        c = math.ceil(chunk_tokens / self.tile_tokens) * self.tile_tokens
        h = math.ceil(history_tokens / self.tile_tokens) * self.tile_tokens
        return self.fixed_ms + self.token_ms * c + self.pair_ms * c * (h + c / 2)


@dataclass(frozen=True)
class Waves:
    """Tiles spread over a device's cores: time steps by a whole wave every ``span_tokens`` (tile x cores),
    flat between, so a chunk one token past a wave costs a whole wave more."""

    span_tokens: int = 3072
    fixed_ms: float = 40.0
    wave_ms: float = 120.0
    token_ms: float = 0.005
    pair_ms: float = 3e-7

    def time_ms(self, chunk_tokens, history_tokens):
        c, h = chunk_tokens, history_tokens
        waves = math.ceil(c / self.span_tokens)
        return self.fixed_ms + self.wave_ms * waves + self.token_ms * c + self.pair_ms * c * (h + c / 2)


# An accelerator-like step: 5 ms fixed, history reads and attention visible at 64k.
TRUE = Quadratic(5.0, 0.02, 0.002, 2e-6, 3e-7)
NPU_LIKE = Quadratic(30.0, 0.01, 1e-4, 5e-7, 2e-7)  # fixed cost dominates
CPU_LIKE = Quadratic(0.5, 0.05, 0.0, 1e-5, 1.5e-5)  # attention dominates
BENT = Bent()


def timed(truth, plan, *, noise: float = 0.0, seed: int = 0) -> list[tuple[int, int, float]]:
    """(chunk_tokens, history_tokens, latency_ms) of each planned run, with log-normal relative noise."""
    rng = np.random.default_rng(seed)
    return [(c, h, float(truth.time_ms(c, h)) * math.exp(noise * rng.standard_normal())) for c, h in plan]


def start_up_samples(
    truth=TRUE,
    *,
    base_chunk_tokens: int = 8192,
    max_history_tokens: int = 65_536,
    points: int = 24,
    repeats: int = 2,
    history_points: int = 4,
    noise: float = 0.01,
    seed: int = 0,
) -> list[tuple[int, int, float]]:
    """A start-up profile as ``initialise_profile`` measures it (the default settings)."""
    plan = profile_plan(
        base_chunk_tokens=base_chunk_tokens,
        points=points,
        repeats=repeats,
        history_points=history_points,
        max_history_tokens=max_history_tokens,
    )
    return timed(truth, plan, noise=noise, seed=seed)


def model_of(samples) -> LatencyModel:
    """The latency model of a profile's grid (no acceptance)."""
    points, scatter = group_points(samples)
    return LatencyModel.from_points(grid_part(points), scatter)


def measured_model(truth=TRUE, **kwargs) -> LatencyModel:
    return model_of(start_up_samples(truth, **kwargs))


def located_model(truth, limits: ChunkLimits, num_stages: int, max_history_tokens: int) -> LatencyModel:
    """The accepted model of a noiseless start-up profile with its steps placed, as ``initialise_profile`` makes it
    (the profile, then the runs that locate the steps between profiled sizes)."""
    samples = start_up_samples(truth, noise=0.0, max_history_tokens=max_history_tokens)
    first = judge(samples, limits, num_stages, max_history_tokens=max_history_tokens, last_round=True)
    located = locate_runs(truth.time_ms, first.model, repeats=2)
    return judge(samples + located, limits, num_stages, max_history_tokens=max_history_tokens, last_round=True).model
