"""Latency model and chunk-size predictor for dynamic chunked pipeline parallelism (CPP).

With pipeline parallelism every stage should take the same time per chunk; a fixed
chunk size takes longer and longer as a prompt's history grows (attention reads every
earlier token), and the differences become pipeline bubbles. CPP sizes each chunk so
that its predicted time equals one target. This module is the model and the rule:
pure Python + numpy, needing neither vLLM (whose logger it uses when present) nor
torch nor torch_npu, with no I/O outside ``ProfilingChunkManager``.

The latency model
-----------------
One model serves start-up profiling and run-time calibration. A step that runs, for
requests i, chunks of C_i new tokens after H_i tokens of history costs::

    t = c0 + sum_i (c1*C_i + c2*H_i + c3*C_i^2 + c4*C_i*H_i)   [ms]

c0 is the step's fixed cost (paid once per batch), c1*C the linear work (projections,
MLP), c2*H reading the history's KV cache, c3*C^2 attention among the new tokens and
c4*C*H attention of the new tokens over the history. All coefficients are >= 0. The
seed's forms are special cases:

- start-up f(l) = a*l^2 + b*l + c with a chunk costing f(H+C) - f(H):
  c3 = a, c4 = 2a, c1 = b, c2 = 0 (and c0 = c, counted once per step);
- online f(C, H) = a*C*(C+H) + b*(C+H) + c: c3 = c4 = a, c1 = c2 = b, c0 = c.

Fit (``LatencyModel.fit`` / ``fit_features``): repeats of one feature vector are
reduced to their median; the columns are scaled to unit maximum (well conditioned for
C, H up to 1e6); the fit minimises the relative error (rows weighted by 1/latency)
with every coefficient >= 0 (exact NNLS: the least-squares optimum when it is
non-negative, else the best of the active sets of at most five columns); then points
whose relative residual is both > 10% and > 5 robust sigmas are dropped (at most a
quarter of them) and the fit is repeated once, so one wild sample
cannot move the model. While no sample has history, c2 = 0 and c4 = 2*c3 are imposed
(the start-up form). A fit is accepted only with >= 8 distinct points, finite
coefficients, c3 + c4 > 0 (the quadratic terms at least 1e-4 of some sample's time,
not rounding noise) and MAPE <= 15% on its points; otherwise ``FitError`` says
which rule failed.

The chunk rule (``ChunkSizePredictor.next_chunk``)
---------------------------------------------------
target_ms T = t(base_chunk_size, 0): the model's time of a base chunk with no history,
defined here once (``ChunkSizePredictor.target_ms``) and used everywhere. For a request
at history H with R tokens left:

1. raw  = the positive root C of t(C, H) = T (closed form, stable when c3 -> 0; 0 when
   the history cost alone exceeds T);
2. blend = base + s*(raw - base), s = smooth_factor in (0, 1] (SGLang's form; s = 1
   keeps raw; raw <= base always, so blend lies in [raw, base]);
3. round blend down to a multiple of ``align`` = the smallest multiple of page_size
   that is >= 64;
4. floor at ``floor_tokens`` (min_chunk rounded down to align, at least align);
5. cap at max_num_scheduled_tokens and max_model_len - H (both rounded down to align);
   if R fits under the result, the chunk is R (the request's final tail, unaligned);
6. tail merge: if the R - chunk tokens that would be left are fewer than
   max(chunk/4, floor_tokens) and the whole R fits the caps with
   t(R, H) <= (1 + tail_tolerance)*T, take R now: no request ends with a tiny chunk
   that costs a whole pipeline round.

With s = 1 the chunk's predicted time is <= T, or <= (1 + tail_tolerance)*T after a
tail merge, unless the floor forces more. Chunks never grow as history grows.

Budget API for a scheduler (per step, in ms)
--------------------------------------------
- ``LatencyModel.batch_time_ms(pairs)``: c0 once plus each (chunk_tokens,
  history_tokens) pair's terms; an empty list costs c0 (the step's fixed cost), so
  ``target_ms - batch_time_ms(scheduled)`` is always the budget left for more tokens.
- ``LatencyModel.request_ms(C, H)``: one request's terms without c0 (its cost in a batch).
- ``ChunkSizePredictor.max_chunk_within(H, budget_ms, remaining_tokens)``: the largest
  chunk whose ``request_ms`` fits ``budget_ms``, aligned (or all remaining tokens),
  capped like ``next_chunk``; 0 if nothing fits. No floor and no tail merge.
- ``decode_ms(H)``: the cost of one decode token at history H (``request_ms(1, H)``).
  ``batch_time_ms``, ``request_ms`` and ``decode_ms`` are on both classes.

``ProfilingChunkManager`` (holds predictor, calibration window and persistence)
-----------------------------------------------------------------------------
- ``ProfilingChunkManager(base_chunk_size=..., page_size=..., max_model_len=...,
  max_num_scheduled_tokens=..., smooth_factor=1.0, min_chunk=None, tail_tolerance=0.15,
  fingerprint={...})``; ``make_fingerprint(...)`` builds the fingerprint dict.
- ``fit_profile(samples) -> bool``: samples are (chunk_tokens, history_tokens,
  latency_ms) in measurement order, repeats allowed; the first ``warmup_samples``
  (default 1) are dropped as warm-up. On failure: one warning, ``predictor`` stays None.
- ``predictor``: the ``ChunkSizePredictor`` of the accepted model, or None (the caller
  then keeps fixed chunking).
- ``record_batch(pairs, measured_ms) -> bool``: a timed step as its (chunk_tokens,
  history_tokens) pairs (or its 5-term feature vector) into a window of the last
  ``window_size`` (64) steps; every ``refit_every`` (8) records the accepted model is
  refitted, with the same guards, on the profile samples plus the window and on the
  window alone; the candidate that predicts the window best is adopted only if it beats
  the current model there (lower MAPE) and keeps the target within 25%. True when a new
  model was adopted. Without an accepted model nothing is adopted (the window alone
  never sets a target), and the profile samples anchor H = 0, so a handful of small
  batches never moves the target (upstream defect 4).
- ``save(path)`` / ``load_cached(path) -> bool``: JSON with schema version, fingerprint,
  coefficients, target, base chunk and samples. A missing file returns False quietly;
  a corrupt file, another schema or another fingerprint returns False with one warning.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:  # vLLM's logger (its handlers and format) inside vLLM; a plain one when used alone.
    from vllm.logger import logger
except ImportError:  # pragma: no cover - depends on the environment
    logger = logging.getLogger(__name__)

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "ChunkSizePredictor",
    "FitError",
    "LatencyModel",
    "ProfilingChunkManager",
    "make_fingerprint",
]

PROFILE_SCHEMA_VERSION = 1
MIN_FIT_POINTS = 8
MAX_FIT_MAPE = 0.15
MIN_QUADRATIC_SHARE = 1e-4  # c3*C^2 + c4*C*H must be at least this share of some sample's time
OUTLIER_MIN_RELATIVE_ERROR = 0.10
OUTLIER_ROBUST_SIGMAS = 5.0
OUTLIER_MAX_FRACTION = 0.25
NUM_FEATURES = 5  # [1, sum C, sum H, sum C^2, sum C*H]


class FitError(ValueError):
    """A latency fit was rejected; the message names the rule that failed."""


def batch_features(pairs: Iterable[tuple[int, int]]) -> np.ndarray:
    """The model's feature vector [1, sum C, sum H, sum C^2, sum C*H] of one step."""
    sum_c = sum_h = sum_cc = sum_ch = 0.0
    for chunk_tokens, history_tokens in pairs:
        chunk = float(chunk_tokens)
        history = float(history_tokens)
        sum_c += chunk
        sum_h += history
        sum_cc += chunk * chunk
        sum_ch += chunk * history
    return np.array([1.0, sum_c, sum_h, sum_cc, sum_ch])


def _nnls_small(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of scaled columns.

    If the unconstrained optimum is non-negative it is the answer; otherwise every set of
    free columns is tried on the normal equations (at most 31 solves of <= 5x5 systems)
    and the cheapest feasible one kept.
    """
    gram = design.T @ design
    moment = design.T @ target
    num_cols = design.shape[1]
    unconstrained, *_ = np.linalg.lstsq(design, target, rcond=None)
    if np.all(unconstrained >= 0) and np.all(np.isfinite(unconstrained)):
        return unconstrained  # the least-squares optimum is feasible, so it is the NNLS optimum
    best_coef = np.zeros(num_cols)
    best_cost = 0.0  # cost relative to target @ target; all-zero coefficients cost 0
    for size in range(1, num_cols + 1):
        for cols in itertools.combinations(range(num_cols), size):
            idx = list(cols)
            coef, *_ = np.linalg.lstsq(gram[np.ix_(idx, idx)], moment[idx], rcond=None)
            if np.any(coef < 0) or not np.all(np.isfinite(coef)):
                continue
            cost = float(coef @ gram[np.ix_(idx, idx)] @ coef - 2.0 * coef @ moment[idx])
            if cost < best_cost - 1e-12 * abs(best_cost):
                best_cost = cost
                best_coef = np.zeros(num_cols)
                best_coef[idx] = coef
    return best_coef


def _reduce_repeats(features: np.ndarray, latency_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One row per distinct feature vector, its latency the median of the repeats."""
    unique, inverse, counts = np.unique(features, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    medians = np.empty(len(unique))
    medians[inverse] = latency_ms  # right for groups of one
    if np.any(counts > 1):
        order = np.argsort(inverse, kind="stable")
        groups = np.split(latency_ms[order], np.cumsum(counts)[:-1])
        for index in np.flatnonzero(counts > 1):
            medians[index] = np.median(groups[index])
    return unique, medians


def _solve_weighted(features: np.ndarray, latency_ms: np.ndarray, start_up_form: bool) -> np.ndarray:
    """Relative-error NNLS on scaled columns; returns the five coefficients."""
    if start_up_form:  # c2 = 0, c4 = 2*c3: columns [1, C, C^2 + 2*C*H]
        design = np.column_stack([features[:, 0], features[:, 1], features[:, 3] + 2.0 * features[:, 4]])
    else:
        design = features
    weights = 1.0 / latency_ms
    weighted = design * weights[:, None]
    scale = np.max(np.abs(weighted), axis=0)
    scale[scale == 0] = 1.0
    coef = _nnls_small(weighted / scale, np.ones_like(latency_ms)) / scale
    if start_up_form:
        return np.array([coef[0], coef[1], 0.0, coef[2], 2.0 * coef[2]])
    return coef


@dataclass(frozen=True)
class LatencyModel:
    """t(C, H) = c0 + c1*C + c2*H + c3*C^2 + c4*C*H milliseconds (see the module docstring)."""

    c0_ms: float
    c1_ms: float
    c2_ms: float
    c3_ms: float
    c4_ms: float
    mape: float = 0.0  # relative error on the points it was fitted on
    num_points: int = 0

    def __post_init__(self) -> None:
        for name in ("c0_ms", "c1_ms", "c2_ms", "c3_ms", "c4_ms"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise FitError(f"coefficient {name}={value!r} must be finite and >= 0")
            object.__setattr__(self, name, float(value))
        if self.c3_ms + self.c4_ms <= 0:
            raise FitError("no quadratic term: c3 + c4 must be > 0 (latency does not grow faster than linearly)")

    # ---------------------------------------------------------------- fitting
    @classmethod
    def fit(
        cls, chunk_tokens: Sequence[float], history_tokens: Sequence[float], latency_ms: Sequence[float]
    ) -> LatencyModel:
        """Fit single-request samples (three equal-length sequences); raise FitError if rejected."""
        chunks = np.asarray(chunk_tokens, dtype=np.float64).reshape(-1)
        histories = np.asarray(history_tokens, dtype=np.float64).reshape(-1)
        latencies = np.asarray(latency_ms, dtype=np.float64).reshape(-1)
        if not (len(chunks) == len(histories) == len(latencies)):
            raise FitError(
                f"chunk_tokens, history_tokens and latency_ms differ in length "
                f"({len(chunks)}, {len(histories)}, {len(latencies)})"
            )
        if not (np.all(np.isfinite(chunks)) and np.all(np.isfinite(histories))):
            raise FitError("chunk_tokens and history_tokens must be finite")
        if np.any(chunks <= 0) or np.any(histories < 0):
            raise FitError("chunk_tokens must be > 0 and history_tokens >= 0")
        features = np.column_stack([np.ones_like(chunks), chunks, histories, chunks * chunks, chunks * histories])
        return cls.fit_features(features, latencies)

    @classmethod
    def fit_features(cls, features: np.ndarray, latency_ms: Sequence[float]) -> LatencyModel:
        """Fit rows of step features [1, sum C, sum H, sum C^2, sum C*H]; raise FitError if rejected."""
        features = np.asarray(features, dtype=np.float64).reshape(-1, NUM_FEATURES)
        latencies = np.asarray(latency_ms, dtype=np.float64).reshape(-1)
        if len(features) != len(latencies):
            raise FitError(f"{len(features)} feature rows but {len(latencies)} latencies")
        if not np.all(np.isfinite(latencies)) or np.any(latencies <= 0):
            raise FitError("latency_ms must be finite and > 0 (found NaN, inf, zero or negative times)")
        if not np.all(np.isfinite(features)):
            raise FitError("features must be finite")
        features, latencies = _reduce_repeats(features, latencies)
        if len(features) < MIN_FIT_POINTS:
            raise FitError(
                f"only {len(features)} distinct (chunk, history) points; a fit needs >= {MIN_FIT_POINTS} "
                "(all-equal lengths or too few samples)"
            )
        start_up_form = not np.any(features[:, 2] > 0)
        coef = _solve_weighted(features, latencies, start_up_form)
        relative = (features @ coef - latencies) / latencies
        # One pass of outlier rejection: large and far from the robust spread of the others.
        spread = 1.4826 * float(np.median(np.abs(relative - np.median(relative))))
        wild = np.abs(relative) > max(OUTLIER_MIN_RELATIVE_ERROR, OUTLIER_ROBUST_SIGMAS * spread)
        if 0 < wild.sum() <= OUTLIER_MAX_FRACTION * len(features) and len(features) - wild.sum() >= MIN_FIT_POINTS:
            features, latencies = features[~wild], latencies[~wild]
            coef = _solve_weighted(features, latencies, start_up_form)
            relative = (features @ coef - latencies) / latencies
        if not np.all(np.isfinite(coef)):
            raise FitError(f"non-finite coefficients {coef.tolist()}")
        quadratic_share = float(np.max((features[:, 3] * coef[3] + features[:, 4] * coef[4]) / latencies))
        if not quadratic_share >= MIN_QUADRATIC_SHARE:
            raise FitError(
                f"no quadratic term: the best non-negative fit has c3 + c4 = {coef[3] + coef[4]:.3g}, under "
                f"{MIN_QUADRATIC_SHARE:.0e} of any sample's time (latency does not grow faster than linearly "
                "with chunk and history)"
            )
        mape = float(np.mean(np.abs(relative)))
        if not mape <= MAX_FIT_MAPE:
            raise FitError(f"fit error too large: MAPE {mape:.1%} > {MAX_FIT_MAPE:.0%} on {len(features)} points")
        return cls(*(float(c) for c in coef), mape=mape, num_points=len(features))

    # ---------------------------------------------------------------- evaluation
    @property
    def coefficients(self) -> tuple[float, float, float, float, float]:
        return (self.c0_ms, self.c1_ms, self.c2_ms, self.c3_ms, self.c4_ms)

    def request_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        """One request's terms without the step's fixed cost c0."""
        return chunk_tokens * (self.c1_ms + self.c3_ms * chunk_tokens + self.c4_ms * history_tokens) + (
            self.c2_ms * history_tokens
        )

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        """Time of a step that runs only this chunk."""
        return self.c0_ms + self.request_ms(chunk_tokens, history_tokens)

    def batch_time_ms(self, pairs: Iterable[tuple[int, int]]) -> float:
        """c0 once plus each (chunk_tokens, history_tokens) pair's terms; [] costs c0."""
        return self.c0_ms + sum(self.request_ms(c, h) for c, h in pairs)

    def features_time_ms(self, features: np.ndarray) -> np.ndarray:
        """Predicted times of feature rows [1, sum C, sum H, sum C^2, sum C*H]."""
        return np.asarray(features, dtype=np.float64).reshape(-1, NUM_FEATURES) @ np.array(self.coefficients)

    def decode_ms(self, history_tokens: float) -> float:
        """Cost of one decode token (a 1-token chunk) at this history, without c0."""
        return self.request_ms(1.0, history_tokens)

    def chunk_for_request_ms(self, history_tokens: float, budget_ms: float) -> float:
        """Real C >= 0 with request_ms(C, H) = budget_ms (0 when the history alone costs more)."""
        spare_ms = budget_ms - self.c2_ms * history_tokens
        if spare_ms <= 0:
            return 0.0
        slope = self.c1_ms + self.c4_ms * history_tokens
        # Positive root of c3*C^2 + slope*C - spare = 0, in the form that stays exact as c3 -> 0.
        denominator = slope + math.sqrt(slope * slope + 4.0 * self.c3_ms * spare_ms)
        return math.inf if denominator <= 0 else 2.0 * spare_ms / denominator

    def chunk_for_time(self, history_tokens: float, time_ms: float) -> float:
        """Real C >= 0 with time_ms(C, H) = time_ms (positive root; 0 if history alone exceeds it)."""
        return self.chunk_for_request_ms(history_tokens, time_ms - self.c0_ms)

    # ---------------------------------------------------------------- (de)serialisation
    def to_dict(self) -> dict:
        return {
            "c0_ms": self.c0_ms,
            "c1_ms": self.c1_ms,
            "c2_ms": self.c2_ms,
            "c3_ms": self.c3_ms,
            "c4_ms": self.c4_ms,
            "mape": self.mape,
            "num_points": self.num_points,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyModel:
        return cls(
            float(data["c0_ms"]),
            float(data["c1_ms"]),
            float(data["c2_ms"]),
            float(data["c3_ms"]),
            float(data["c4_ms"]),
            mape=float(data.get("mape", 0.0)),
            num_points=int(data.get("num_points", 0)),
        )


def _align_down(tokens: float, align: int) -> int:
    """Round down to a multiple of ``align``, forgiving float error in a root that is exact in theory.

    Without the slack, chunk_for_time(0, time_ms(512, 0)) = 511.99999... would give a base
    chunk one aligned unit short on every fresh prompt.
    """
    return int(math.floor(tokens / align + 1e-9)) * align


class ChunkSizePredictor:
    """Chunk sizes whose predicted time equals ``target_ms`` (rule in the module docstring)."""

    def __init__(
        self,
        model: LatencyModel,
        *,
        base_chunk_size: int,
        page_size: int,
        max_model_len: int,
        max_num_scheduled_tokens: int,
        smooth_factor: float = 1.0,
        min_chunk: int | None = None,
        tail_tolerance: float = 0.15,
    ) -> None:
        _require(page_size >= 1, "page_size", page_size, "must be >= 1 (the KV cache block size)")
        self.align = page_size * math.ceil(64 / page_size)
        _require(
            base_chunk_size >= self.align,
            "base_chunk_size",
            base_chunk_size,
            f"must be >= {self.align} (a multiple of page_size that is at least 64)",
        )
        _require(
            max_num_scheduled_tokens >= self.align,
            "max_num_scheduled_tokens",
            max_num_scheduled_tokens,
            f"must be >= {self.align}",
        )
        _require(max_model_len >= 1, "max_model_len", max_model_len, "must be >= 1")
        _require(0 < smooth_factor <= 1, "smooth_factor", smooth_factor, "must be in (0, 1]")
        _require(0 <= tail_tolerance <= 1, "tail_tolerance", tail_tolerance, "must be in [0, 1]")
        if min_chunk is None:
            min_chunk = base_chunk_size // 4
        _require(min_chunk >= 0, "min_chunk", min_chunk, "must be >= 0 (None: base_chunk_size // 4)")
        self.model = model
        self.base_chunk_size = int(base_chunk_size)
        self.page_size = int(page_size)
        self.max_model_len = int(max_model_len)
        self.max_num_scheduled_tokens = int(max_num_scheduled_tokens)
        self.smooth_factor = float(smooth_factor)
        self.min_chunk = int(min_chunk)
        self.tail_tolerance = float(tail_tolerance)
        self.floor_tokens = max(self.align, _align_down(min_chunk, self.align))
        self.scheduled_cap_tokens = _align_down(max_num_scheduled_tokens, self.align)
        # The one definition of the target: a base chunk with no history.
        self.target_ms: float = model.time_ms(self.base_chunk_size, 0)
        self.tail_limit_ms: float = (1.0 + self.tail_tolerance) * self.target_ms

    def next_chunk(self, history_tokens: int, remaining_tokens: int) -> int:
        """Tokens to schedule now for a request at ``history_tokens`` with ``remaining_tokens`` left."""
        if remaining_tokens <= 0:
            return 0
        model = self.model
        align = self.align
        raw_tokens = model.chunk_for_time(history_tokens, self.target_ms)
        blended = self.base_chunk_size + self.smooth_factor * (min(raw_tokens, 1e18) - self.base_chunk_size)
        chunk = max(_align_down(blended, align), self.floor_tokens)
        context_left = self.max_model_len - history_tokens
        cap = min(self.scheduled_cap_tokens, _align_down(context_left, align))
        if chunk > cap:
            chunk = cap
        if remaining_tokens <= chunk:
            return remaining_tokens  # the request's final tail
        if chunk <= 0:  # a cap below one aligned unit (request runs into max_model_len)
            return max(0, min(remaining_tokens, context_left, self.max_num_scheduled_tokens))
        left_tokens = remaining_tokens - chunk
        if (
            left_tokens < max(chunk // 4, self.floor_tokens)
            and remaining_tokens <= self.max_num_scheduled_tokens
            and remaining_tokens <= context_left
            and model.time_ms(remaining_tokens, history_tokens) <= self.tail_limit_ms
        ):
            return remaining_tokens  # tail merge
        return chunk

    def max_chunk_within(self, history_tokens: int, budget_ms: float, remaining_tokens: int) -> int:
        """Largest chunk with request_ms <= budget_ms: aligned, or all remaining tokens; 0 if none fits."""
        if remaining_tokens <= 0 or budget_ms <= 0:
            return 0
        limit = min(remaining_tokens, self.max_num_scheduled_tokens, self.max_model_len - history_tokens)
        if limit <= 0:
            return 0
        raw_tokens = self.model.chunk_for_request_ms(history_tokens, budget_ms)
        if raw_tokens >= limit:
            return limit if limit == remaining_tokens else _align_down(limit, self.align)
        return _align_down(raw_tokens, self.align)

    # The model's budget helpers, here too so a scheduler needs only the predictor.
    def request_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return self.model.request_ms(chunk_tokens, history_tokens)

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return self.model.time_ms(chunk_tokens, history_tokens)

    def batch_time_ms(self, pairs: Iterable[tuple[int, int]]) -> float:
        return self.model.batch_time_ms(pairs)

    def decode_ms(self, history_tokens: float) -> float:
        return self.model.decode_ms(history_tokens)


def _require(ok: bool, key: str, value, fix: str) -> None:
    if not ok:
        raise ValueError(f"profiling chunk config: {key}={value!r} {fix}")


def make_fingerprint(
    *,
    model: str,
    dtype: str,
    quantization: str | None,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    max_num_batched_tokens: int,
    block_size: int,
    vllm_version: str,
    vllm_ascend_version: str,
    device_name: str,
    cann_version: str | None = None,
) -> dict:
    """What a cached profile must match to be reused (JSON-safe values)."""
    return {
        "model": str(model),
        "dtype": str(dtype),
        "quantization": None if quantization is None else str(quantization),
        "tensor_parallel_size": int(tensor_parallel_size),
        "pipeline_parallel_size": int(pipeline_parallel_size),
        "max_num_batched_tokens": int(max_num_batched_tokens),
        "block_size": int(block_size),
        "vllm_version": str(vllm_version),
        "vllm_ascend_version": str(vllm_ascend_version),
        "device_name": str(device_name),
        "cann_version": None if cann_version is None else str(cann_version),
    }


def _json_normal(value):
    return json.loads(json.dumps(value, sort_keys=True))


class ProfilingChunkManager:
    """Holds the predictor, the online calibration window and the profile cache."""

    def __init__(
        self,
        *,
        base_chunk_size: int,
        page_size: int,
        max_model_len: int,
        max_num_scheduled_tokens: int,
        smooth_factor: float = 1.0,
        min_chunk: int | None = None,
        tail_tolerance: float = 0.15,
        fingerprint: Mapping | None = None,
        window_size: int = 64,
        refit_every: int = 8,
        warmup_samples: int = 1,
        max_target_shift: float = 0.25,
    ) -> None:
        _require(window_size >= MIN_FIT_POINTS, "window_size", window_size, f"must be >= {MIN_FIT_POINTS}")
        _require(refit_every >= 1, "refit_every", refit_every, "must be >= 1")
        _require(warmup_samples >= 0, "warmup_samples", warmup_samples, "must be >= 0")
        self.predictor_kwargs = {
            "base_chunk_size": int(base_chunk_size),
            "page_size": int(page_size),
            "max_model_len": int(max_model_len),
            "max_num_scheduled_tokens": int(max_num_scheduled_tokens),
            "smooth_factor": float(smooth_factor),
            "min_chunk": min_chunk,
            "tail_tolerance": float(tail_tolerance),
        }
        # Validate the config now (a clear error naming the key), with a throw-away model.
        ChunkSizePredictor(LatencyModel(0.0, 1.0, 0.0, 1.0, 2.0), **self.predictor_kwargs)
        self.base_chunk_size = int(base_chunk_size)
        self.fingerprint = _json_normal(dict(fingerprint or {}))
        self.refit_every = int(refit_every)
        self.warmup_samples = int(warmup_samples)
        self.max_target_shift = float(max_target_shift)
        self.profile_samples: list[tuple[int, int, float]] = []
        self._profile_rows: np.ndarray | None = None  # features of profile_samples, built on first refit
        self._profile_ms: np.ndarray | None = None
        self.window: deque[tuple[np.ndarray, float]] = deque(maxlen=int(window_size))
        self.last_error: str | None = None
        self._predictor: ChunkSizePredictor | None = None
        self._records_since_fit = 0
        self._warned_bad_record = False

    # ---------------------------------------------------------------- state
    @property
    def predictor(self) -> ChunkSizePredictor | None:
        """The predictor of the accepted model; None means: keep fixed chunking."""
        return self._predictor

    @property
    def model(self) -> LatencyModel | None:
        return None if self._predictor is None else self._predictor.model

    @property
    def target_ms(self) -> float | None:
        return None if self._predictor is None else self._predictor.target_ms

    def _adopt(self, model: LatencyModel) -> None:
        self._predictor = ChunkSizePredictor(model, **self.predictor_kwargs)

    # ---------------------------------------------------------------- start-up profile
    def fit_profile(self, samples: Sequence[Sequence[float]]) -> bool:
        """Fit (chunk_tokens, history_tokens, latency_ms) samples in measurement order; True if accepted."""
        try:
            kept = [(int(c), int(h), float(t)) for c, h, t in samples][self.warmup_samples :]
            if not kept:
                raise FitError("no samples left after dropping warm-up")
            chunks, histories, latencies = zip(*kept, strict=True)
            model = LatencyModel.fit(chunks, histories, latencies)
        except (ValueError, TypeError) as error:  # FitError, or samples that are not number triples
            self.last_error = str(error)
            logger.warning("[ProfilingChunk] start-up profile rejected (%s); keeping fixed chunking", error)
            return False
        self.profile_samples = kept
        self._profile_rows = None
        self._adopt(model)
        self.last_error = None
        logger.info(
            "[ProfilingChunk] profile fitted on %d points: c=%s ms, MAPE %.1f%%, target %.2f ms",
            model.num_points,
            [f"{c:.3g}" for c in model.coefficients],
            100 * model.mape,
            self._predictor.target_ms,
        )
        return True

    # ---------------------------------------------------------------- online calibration
    def record_batch(self, features, measured_ms: float) -> bool:
        """Record one timed step; refit every ``refit_every`` records. True if a new model was adopted."""
        try:
            if isinstance(features, np.ndarray) and features.shape == (NUM_FEATURES,):
                row = features.astype(np.float64)
            else:
                row = batch_features(features)
            measured_ms = float(measured_ms)
        except (ValueError, TypeError) as error:
            if not self._warned_bad_record:
                self._warned_bad_record = True
                logger.warning("[ProfilingChunk] ignoring a timed step that is not (chunk, history) pairs: %s", error)
            return False
        if not (math.isfinite(measured_ms) and measured_ms > 0) or not row[1] > 0 or not np.all(np.isfinite(row)):
            return False
        self.window.append((row, float(measured_ms)))
        self._records_since_fit += 1
        if self._records_since_fit < self.refit_every or len(self.window) < MIN_FIT_POINTS:
            return False
        self._records_since_fit = 0
        return self._refit()

    def window_mape(self, model: LatencyModel) -> float:
        rows = np.array([row for row, _ in self.window])
        measured = np.array([ms for _, ms in self.window])
        return float(np.mean(np.abs(model.features_time_ms(rows) - measured) / measured))

    def _refit(self) -> bool:
        current = self.model
        if current is None:  # nothing to refine: the window alone never sets a target
            return False
        window_rows = np.array([row for row, _ in self.window])
        window_ms = np.array([ms for _, ms in self.window])
        if self._profile_rows is None:
            self._profile_rows = np.array([[1.0, c, h, float(c) * c, float(c) * h] for c, h, _ in self.profile_samples])
            self._profile_ms = np.array([ms for _, _, ms in self.profile_samples])
        # The profile anchors H = 0; the window alone covers the case where the two disagree
        # (e.g. online steps carry costs the profile runs do not).
        candidates = []
        if len(self._profile_rows):
            candidates.append(
                (np.vstack([window_rows, self._profile_rows]), np.concatenate([window_ms, self._profile_ms]))
            )
        candidates.append((window_rows, window_ms))
        best, best_mape = current, self.window_mape(current)
        old_target = self._predictor.target_ms
        for rows, latencies in candidates:
            try:
                candidate = LatencyModel.fit_features(rows, latencies)
            except FitError as error:
                logger.debug("[ProfilingChunk] online refit rejected: %s", error)
                continue
            new_target = candidate.time_ms(self.base_chunk_size, 0)
            if abs(new_target / old_target - 1.0) > self.max_target_shift:
                logger.debug(
                    "[ProfilingChunk] online refit would move the target %.2f -> %.2f ms", old_target, new_target
                )
                continue
            candidate_mape = self.window_mape(candidate)
            if candidate_mape < best_mape:
                best, best_mape = candidate, candidate_mape
        if best is current:
            return False
        self._adopt(best)
        logger.debug(
            "[ProfilingChunk] online refit adopted: c=%s, window MAPE %.1f%%", best.coefficients, 100 * best_mape
        )
        return True

    # ---------------------------------------------------------------- persistence
    def to_profile(self) -> dict:
        return {
            "schema_version": PROFILE_SCHEMA_VERSION,
            "fingerprint": self.fingerprint,
            "base_chunk_size": self.base_chunk_size,
            "coefficients": None if self.model is None else self.model.to_dict(),
            "target_ms": self.target_ms,
            "samples": [list(s) for s in self.profile_samples],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as JSON (atomically: a temp file renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as tmp:
            json.dump(self.to_profile(), tmp, indent=1, sort_keys=True)
        os.replace(tmp.name, path)

    def load_cached(self, path: str | os.PathLike) -> bool:
        """Adopt a saved profile if it matches; False (one warning unless absent) otherwise."""
        path = Path(path)
        if not path.exists():
            return False
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("schema_version") != PROFILE_SCHEMA_VERSION:
                raise ValueError(f"schema_version {data.get('schema_version')!r} != {PROFILE_SCHEMA_VERSION}")
            if _json_normal(data.get("fingerprint")) != self.fingerprint:
                raise ValueError("fingerprint differs (other model, parallelism, versions or device)")
            if data.get("base_chunk_size") != self.base_chunk_size:
                raise ValueError(f"base_chunk_size {data.get('base_chunk_size')} != {self.base_chunk_size}")
            model = LatencyModel.from_dict(data["coefficients"])
            samples = [(int(c), int(h), float(t)) for c, h, t in data.get("samples", [])]
        except (OSError, ValueError, KeyError, TypeError) as error:  # FitError is a ValueError
            logger.warning("[ProfilingChunk] ignoring cached profile %s: %s", path, error)
            return False
        self.profile_samples = samples
        self._profile_rows = None
        self._adopt(model)
        logger.info("[ProfilingChunk] loaded cached profile %s (target %.2f ms)", path, self._predictor.target_ms)
        return True
