"""Synthetic CPP profiles for the unit tests: the real start-up plan, timed on a known model."""

from __future__ import annotations

import numpy as np
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_profiling import profile_plan

# An accelerator-like step: 5 ms fixed, history reads and attention visible at 64k.
TRUE = LatencyModel(c0_ms=5.0, c1_ms=0.02, c2_ms=0.002, c3_ms=2e-6, c4_ms=3e-7)


def timed(model: LatencyModel, plan, *, noise: float = 0.0, seed: int = 0) -> list[tuple[int, int, float]]:
    """(chunk_tokens, history_tokens, latency_ms) of each planned run, with relative Gaussian noise."""
    rng = np.random.default_rng(seed)
    return [(c, h, model.time_ms(c, h) * (1.0 + noise * rng.standard_normal())) for c, h in plan]


def start_up_samples(
    model: LatencyModel = TRUE,
    *,
    base_chunk_tokens: int = 8192,
    max_history_tokens: int = 65_536,
    points: int = 64,
    repeats: int = 3,
    history_points: int = 4,
    noise: float = 0.01,
    seed: int = 0,
) -> list[tuple[int, int, float]]:
    """A start-up profile as ``initialise_profile`` measures it (the default settings)."""
    plan = profile_plan(
        base_chunk_size=base_chunk_tokens,
        points=points,
        repeats=repeats,
        history_points=history_points,
        max_history_tokens=max_history_tokens,
    )
    return timed(model, plan, noise=noise, seed=seed)
