"""The latency model of dynamic chunked pipeline parallelism (CPP) and its fit.

A step that runs, for requests i, chunks of C_i new tokens after H_i tokens of history
costs (one pipeline stage's time, the slowest stage's)::

    t = c0 + sum_i (c1*C_i + c2*H_i + c3*C_i^2 + c4*C_i*H_i)   [ms]

c0 is the step's fixed cost, c1*C the linear work (projections, MLP), c2*H reading the
history's KV cache, c3*C^2 attention among the new tokens and c4*C*H attention of the
new tokens over the history; all coefficients are >= 0. One model serves the start-up
profile and the online refit.

The fit minimises the relative error with every coefficient >= 0, after reducing
repeats of one point to their median and dropping at most a quarter of the points as
outliers (relative residual > 10% and > 5 robust sigmas). While no sample has history,
c2 = 0 and c4 = 2*c3 (f(l) = a*l^2 + b*l + c with a chunk costing f(H+C) - f(H)).
``accept`` is the one acceptance rule, for a fresh profile and a cached one alike: the
fit must succeed, and it must be stable where the scheduler will use it (refits that
leave out a share of the points agree with it over the chunk and history range).
Pure Python and numpy: no vLLM, no torch, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FitError", "LatencyModel", "accept", "batch_features"]

MIN_FIT_POINTS = 8
MAX_FIT_MAPE = 0.15
MIN_QUADRATIC_SHARE = 1e-4  # c3*C^2 + c4*C*H must be at least this share of some sample's time
OUTLIER_MIN_RELATIVE_ERROR = 0.10
OUTLIER_ROBUST_SIGMAS = 5.0
OUTLIER_MAX_FRACTION = 0.25
NUM_FEATURES = 5  # [1, sum C, sum H, sum C^2, sum C*H]
MAX_TOKENS = 1e9  # no chunk or history is longer; C^2 and C*H stay far from overflow


class FitError(ValueError):
    """A latency fit was rejected; the message names the rule that failed."""


class NoisyFit(FitError):
    """Rejected for scatter (fit error too large, or unstable without a fold of the points): more samples may fix it."""


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
        if np.any(chunks > MAX_TOKENS) or np.any(histories > MAX_TOKENS):
            raise FitError(f"chunk_tokens and history_tokens must be <= {MAX_TOKENS:g} (no context is longer)")
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
            raise NoisyFit(f"fit error too large: MAPE {mape:.1%} > {MAX_FIT_MAPE:.0%} on {len(features)} points")
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


STABILITY_FOLDS = 8
MAX_DOMAIN_SPREAD = 0.25  # a refit without one fold may move a predicted time by at most this share
MAX_SAMPLE_MS = 1e7  # a profile sample above ~3 hours is not a measurement
MIN_HISTORY_COVERAGE = 0.5  # the samples must reach this share of the history range the scheduler uses


def _domain(min_chunk_tokens: float, max_chunk_tokens: int, max_history_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    low = max(1.0, min(min_chunk_tokens, max_chunk_tokens))
    chunks = np.unique(np.geomspace(low, max(low, max_chunk_tokens), 6).round())
    histories = np.linspace(0, max(0, max_history_tokens), 5).round()
    grid_c, grid_h = np.meshgrid(chunks, histories)
    return grid_c.ravel(), grid_h.ravel()


def accept(samples: Sequence[Sequence[float]], *, max_chunk_tokens: int, max_history_tokens: int) -> LatencyModel:
    """The model of (chunk_tokens, history_tokens, latency_ms) samples, if it may be used; else FitError.

    Besides ``LatencyModel.fit``'s own rules, the fit must be stable over the range the
    scheduler will use (chunks from the smallest measured one up to ``max_chunk_tokens``,
    histories up to ``max_history_tokens``): the distinct points are split into
    ``STABILITY_FOLDS`` interleaved folds, the model is refitted without each fold, and
    every refit must predict every point of that range within ``MAX_DOMAIN_SPREAD`` of
    the full fit (a refit whose fold held the smallest chunk is judged from its own
    smallest chunk up: below it, it extrapolates). A handful of noisy points, or points
    far from where the model is used, fail here.
    """
    try:
        rows = [(float(c), float(h), float(t)) for c, h, t in samples]
    except (TypeError, ValueError, OverflowError) as error:
        raise FitError(f"samples must be (chunk_tokens, history_tokens, latency_ms) numbers: {error}") from None
    if any(not t < MAX_SAMPLE_MS for _, _, t in rows):
        raise FitError(f"a latency sample is not below {MAX_SAMPLE_MS:g} ms")
    if not rows:
        raise FitError("no samples")
    chunks, histories, latencies = (np.array(column) for column in zip(*rows, strict=True))
    model = LatencyModel.fit(chunks, histories, latencies)
    if max_history_tokens > 0 and not np.max(histories) >= MIN_HISTORY_COVERAGE * max_history_tokens:
        raise FitError(
            f"the samples' history reaches {int(np.max(histories))} tokens, under "
            f"{MIN_HISTORY_COVERAGE:.0%} of the {max_history_tokens} the scheduler will see: the history terms "
            "would be guessed; profile history lengths (profile_history_points >= 2)"
        )
    points = sorted({(c, h) for c, h in zip(chunks, histories, strict=True)}, key=lambda p: (p[1], p[0]))
    fold_of = {point: index % STABILITY_FOLDS for index, point in enumerate(points)}
    folds = np.array([fold_of[(c, h)] for c, h in zip(chunks, histories, strict=True)])
    for fold in range(min(STABILITY_FOLDS, len(points))):
        keep = folds != fold
        try:
            partial = LatencyModel.fit(chunks[keep], histories[keep], latencies[keep])
        except FitError as error:
            raise NoisyFit(f"unstable fit: without 1/{STABILITY_FOLDS} of the points it fails ({error})") from None
        # Judged from the smallest chunk the refit measured, as the full fit is from its own:
        # below it the refit extrapolates by construction, which says nothing of its stability.
        grid_c, grid_h = _domain(float(np.min(chunks[keep])), max_chunk_tokens, max_history_tokens)
        spread = float(np.max(np.abs(partial.time_ms(grid_c, grid_h) / model.time_ms(grid_c, grid_h) - 1.0)))
        if not spread <= MAX_DOMAIN_SPREAD:
            raise NoisyFit(
                f"unstable fit: without 1/{STABILITY_FOLDS} of the points its prediction moves by {spread:.0%} "
                f"somewhere in chunks <= {max_chunk_tokens}, history <= {max_history_tokens} "
                f"(limit {MAX_DOMAIN_SPREAD:.0%}); profile more points or a wider history range"
            )
    return model
