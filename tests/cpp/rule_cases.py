"""Hypothesis strategies of CPP rules: measured tables of many shapes, and vLLM-like limits."""

from __future__ import annotations

import numpy as np
from cpp_samples import Bent, Quadratic, Tiles
from hypothesis import strategies as st
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_profiling import chunk_ladder, history_levels
from vllm_ascend.core.cpp_samples import Point


def log_uniform(low_exponent: float, high_exponent: float, zero: bool = True):
    values = st.floats(low_exponent, high_exponent).map(lambda exponent: 10.0**exponent)
    return (st.just(0.0) | values) if zero else values


# Built once: hypothesis strategies are costly to build per draw.
C0_MS, C1_MS, C2_MS = log_uniform(-2, 3, zero=False), log_uniform(-5, 0), log_uniform(-7, -2)
C3_MS, C4_MS = log_uniform(-10, -4), log_uniform(-10, -4)
SMOOTH_FACTORS, TAIL_TOLERANCES = st.floats(0.05, 1.0), st.sampled_from([0.0, 0.15, 0.5])
DECODE_STEP_MS = st.none() | log_uniform(-1, 4, zero=False)
TARGET_EXPONENTS = st.floats(-0.3, 1.2)  # position of a target in (or a little outside) the planner's range


@st.composite
def truths(draw):
    """A quadratic of any mix (attention-dominated ones included), a bent one, or a tiled one."""
    kind = draw(st.sampled_from(["quadratic", "quadratic", "bent", "tiles"]))
    if kind == "bent":
        return Bent(draw(C0_MS), draw(log_uniform(-3, -1, zero=False)), draw(st.sampled_from([256.0, 1024.0, 3000.0])))
    if kind == "tiles":
        return Tiles(draw(st.sampled_from([64, 128, 256])), draw(C0_MS), draw(log_uniform(-3, -1, zero=False)))
    c4 = draw(C4_MS)
    c3 = draw(C3_MS if c4 > 0 else log_uniform(-10, -4, zero=False))
    return Quadratic(draw(C0_MS), draw(C1_MS), draw(C2_MS), c3, c4)


def table(truth, base_chunk_tokens: int, max_history_tokens: int) -> LatencyModel:
    """The truth measured at the profile's grid, without noise."""
    points = [
        Point(c, h, float(truth.time_ms(c, h)), 1)
        for h in history_levels(max_history_tokens, 3)
        for c in chunk_ladder(base_chunk_tokens, 24)
    ]
    return LatencyModel.from_points(points)


@st.composite
def rules(draw, smooth_factor=None, tail_tolerance=None, decode_step_ms=False, granule=False):
    base_chunk_tokens = draw(st.integers(4, 32_768))
    max_model_len = draw(st.integers(1, 1_000_000))
    limits = ChunkLimits(
        base_chunk_tokens=base_chunk_tokens,
        max_model_len=max_model_len,
        min_chunk_tokens=draw(st.integers(0, base_chunk_tokens)),
        smooth_factor=draw(SMOOTH_FACTORS) if smooth_factor is None else smooth_factor,
        tail_tolerance=draw(TAIL_TOLERANCES) if tail_tolerance is None else tail_tolerance,
        decode_step_ms=draw(DECODE_STEP_MS) if decode_step_ms else None,
        granule_tokens=draw(st.sampled_from([1, 64, 128, 256])) if granule else 1,
    )
    model = table(draw(truths()), base_chunk_tokens, max(0, max_model_len - base_chunk_tokens))
    return ChunkRule(model, limits, draw(st.integers(1, 64)))


def draw_position(draw, max_model_len):
    """(history_tokens, remaining_tokens) of a request that fits max_model_len."""
    history_tokens = draw(st.integers(0, max_model_len - 1))
    return history_tokens, draw(st.integers(1, max_model_len - history_tokens))


@st.composite
def requests(draw, **rule_options):
    """A rule, a request position that fits max_model_len, and a plan whose target is around the planner's range."""
    from vllm_ascend.core.cpp_planner import target_bounds

    rule = draw(rules(**rule_options))
    history_tokens, remaining_tokens = draw_position(draw, rule.limits.max_model_len)
    low, high = target_bounds(rule, [(history_tokens, remaining_tokens)], rule.model.fixed_ms)
    plan = rule.plan(low * (high / low) ** draw(TARGET_EXPONENTS))
    return rule, history_tokens, remaining_tokens, plan


def rounds_of(array):
    return np.asarray(array, dtype=np.float64)
