"""Latency surfaces: how long the whole model takes for a batch, and per stage.

A surface answers two questions of one request's chunk of C new tokens after H tokens
of history, with the same meaning as the scheduler's latency model
(core/cpp_latency_model.py):

- ``time_ms(C, H)``: the time of a step that runs only this chunk;
- ``request_ms(C, H) = time_ms(C, H) - fixed_ms``: the request's own cost in a step.

The batch rule, stated once: a batch pays the fixed per-step cost once plus each
request's own cost, ``batch_ms = fixed_ms + sum_i request_ms(C_i, H_i)``, so attention
never crosses requests and a batch of one request costs exactly its ``time_ms``.

Sources: ``QuadraticSurface`` (coefficients of 1, C, H, C^2, C*H), ``GridSurface``
(measured ``chunk_tokens,history_tokens,ms`` rows, interpolated; twin/surface_files.py
reads them), the stress family (twin/stress.py). ``StageTimer`` splits a batch's time
over P stages by layer share, with optional multiplicative noise and slow drift, seeded
so that runs repeat.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .pipeline import Chunk


class Surface(Protocol):
    fixed_ms: float

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        """Time of a step that runs only this chunk."""

    def time_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        """``time_ms`` of many chunk sizes at one history (vectorised)."""

    def describe(self) -> str: ...


def request_ms(surface: Surface, chunk_tokens: float, history_tokens: float) -> float:
    """One request's own cost in a step: its step time without the fixed cost."""
    return surface.time_ms(chunk_tokens, history_tokens) - surface.fixed_ms


def batch_ms(surface: Surface, chunks: Sequence[tuple[int, int]]) -> float:
    """Whole-model time of a batch of (chunk_tokens, history_tokens) pairs (rule in the module doc)."""
    if not chunks:
        return 0.0
    return surface.fixed_ms + sum(request_ms(surface, c, h) for c, h in chunks)


@dataclass(frozen=True)
class QuadraticSurface:
    """time_ms(C, H) = fixed_ms + token_ms*C + history_token_ms*H + self_pair_ms*C^2 + history_pair_ms*C*H."""

    fixed_ms: float
    token_ms: float
    history_token_ms: float
    self_pair_ms: float
    history_pair_ms: float
    name: str = "quadratic"

    def __post_init__(self) -> None:
        for key in ("fixed_ms", "token_ms", "history_token_ms", "self_pair_ms", "history_pair_ms"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"surface coefficient {key} must be finite and >= 0, got {value}")

    @property
    def coefficients(self) -> tuple[float, float, float, float, float]:
        return (self.fixed_ms, self.token_ms, self.history_token_ms, self.self_pair_ms, self.history_pair_ms)

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return (
            self.fixed_ms
            + chunk_tokens * (self.token_ms + self.self_pair_ms * chunk_tokens + self.history_pair_ms * history_tokens)
            + self.history_token_ms * history_tokens
        )

    def time_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        return self.time_ms(np.asarray(chunk_tokens, dtype=np.float64), float(history_tokens))

    @classmethod
    def fit(cls, points: Sequence[tuple[int, int, float]], name: str = "fitted") -> QuadraticSurface:
        """Non-negative least squares (relative error) over measured (chunk_tokens, history_tokens, ms)."""
        from scipy.optimize import nnls

        if len(points) < 5:
            raise ValueError(f"a surface needs at least 5 measured points, got {len(points)}")
        c = np.array([p[0] for p in points], dtype=np.float64)
        h = np.array([p[1] for p in points], dtype=np.float64)
        ms = np.array([p[2] for p in points], dtype=np.float64)
        design = np.column_stack([np.ones_like(c), c, h, c * c, c * h])
        if not np.any(h > 0):
            # Only fresh chunks measured (H = 0): C*H cannot be fitted. A token attends to all H
            # earlier tokens but, causally, to half its chunk on average, so C*H costs twice C^2.
            design[:, 3] = c * c
            design[:, 4] = 0.0
        weights = 1.0 / ms
        scale = np.abs(design).max(axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(design / scale * weights[:, None], ms * weights)
        coef = coef / scale
        if not np.any(h > 0):
            coef[4] = 2.0 * coef[3]
        return cls(*(float(v) for v in coef), name=name)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.fixed_ms:.3g} + {self.token_ms:.3g}*C + {self.history_token_ms:.3g}*H"
            f" + {self.self_pair_ms:.3g}*C^2 + {self.history_pair_ms:.3g}*C*H ms"
        )


# A synthetic long-context surface (not a measurement), whole model, attention a*C*(C+H):
# a per-step cost of 60 ms (launches, PP hand-offs) makes small chunks inefficient as on an
# accelerator (1k-token chunks reach ~60% of 8k chunks' token rate); an 8k chunk takes
# ~0.58 s without history and ~1.0 s at 120k.
SYNTHETIC = QuadraticSurface(
    fixed_ms=60.0,
    token_ms=0.06,
    history_token_ms=2.0e-5,
    self_pair_ms=4.0e-7,
    history_pair_ms=4.0e-7,
    name="synthetic",
)


@dataclass(frozen=True)
class Level:
    """One measured history length: its chunk sizes (increasing) and their times."""

    history_tokens: int
    chunk_tokens: tuple[int, ...]
    times_ms: tuple[float, ...]


@dataclass(frozen=True)
class GridSurface:
    """Measured times at history levels, each with its own chunk sizes; continued outside by the fit's growth.

    Inside: linear in C along a level, linear in H between levels. Outside a level's
    chunk range, or beyond the first or last level, the time above ``fixed_ms`` of the
    nearest measured point is scaled by the fit's ratio between the two points, so the
    surface is continuous at the edge of what was measured and never below the fixed
    cost. (A full grid is bilinear; a ragged one, such as a profile that measured more
    chunk sizes without history, keeps every measured row.)
    """

    levels: tuple[Level, ...]
    fit: QuadraticSurface
    name: str = "grid"

    @functools.cached_property
    def fixed_ms(self) -> float:
        """The fit's per-step cost, but never above a measured step: a step of one request costs
        at least the fixed cost, so no request's own cost is negative (a fit through a curved
        surface can put its constant above what the smallest chunks were measured to take)."""
        return min(self.fit.fixed_ms, min(min(level.times_ms) for level in self.levels))

    def _grow(self, measured_ms, fit_to, fit_from):
        """Continue a measured time from ``fit_from`` to ``fit_to`` by the fit's ratio of variable parts."""
        fixed = self.fixed_ms
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(fit_from - fixed > 0, (fit_to - fixed) / (fit_from - fixed), 1.0)
        return fixed + np.maximum(np.asarray(measured_ms) - fixed, 0.0) * ratio

    def _at_level(self, level: Level, chunks: np.ndarray) -> np.ndarray:
        axis = np.array(level.chunk_tokens, dtype=np.float64)
        times = np.array(level.times_ms, dtype=np.float64)
        inside = np.interp(chunks, axis, times)
        edge = np.clip(chunks, axis[0], axis[-1])
        h = float(level.history_tokens)
        grown = self._grow(inside, self.fit.time_ms_many(chunks, h), self.fit.time_ms_many(edge, h))
        return np.where(edge == chunks, inside, grown)

    def time_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        chunks = np.asarray(chunk_tokens, dtype=np.float64)
        history = float(history_tokens)
        levels = self.levels
        hs = [lv.history_tokens for lv in levels]
        if len(levels) == 1 or history <= hs[0] or history >= hs[-1]:
            edge = levels[0] if history <= hs[0] else levels[-1]
            at_edge = self._at_level(edge, chunks)
            if history == edge.history_tokens:
                return at_edge
            h = float(edge.history_tokens)
            return self._grow(at_edge, self.fit.time_ms_many(chunks, history), self.fit.time_ms_many(chunks, h))
        j = max(0, min(int(np.searchsorted(hs, history, side="right")) - 1, len(levels) - 2))
        weight = (history - hs[j]) / (hs[j + 1] - hs[j])
        return self._at_level(levels[j], chunks) * (1 - weight) + self._at_level(levels[j + 1], chunks) * weight

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return float(self.time_ms_many(np.array([float(chunk_tokens)]), history_tokens)[0])

    @classmethod
    def from_points(cls, points: Sequence[tuple[int, int, float]], name: str) -> GridSurface:
        """Medians of repeats, one level per measured history with at least two chunk sizes."""
        table: dict[int, dict[int, list[float]]] = {}
        for c, h, ms in points:
            table.setdefault(int(h), {}).setdefault(int(c), []).append(float(ms))
        levels = tuple(
            Level(h, tuple(sorted(row)), tuple(float(np.median(row[c])) for c in sorted(row)))
            for h, row in sorted(table.items())
            if len(row) >= 2
        )
        if not levels:
            raise ValueError("no history length has two or more measured chunk sizes")
        return cls(levels, QuadraticSurface.fit(points, name=f"{name} (fit)"), name=name)

    def describe(self) -> str:
        chunks = sorted({c for lv in self.levels for c in lv.chunk_tokens})
        return (
            f"{self.name}: measured C {chunks[0]}..{chunks[-1]} at {len(self.levels)} history lengths "
            f"{self.levels[0].history_tokens}..{self.levels[-1].history_tokens}"
            f" ({sum(len(lv.chunk_tokens) for lv in self.levels)} points);"
            f" outside: {self.fit.describe()}"
        )


@dataclass(frozen=True)
class StageTimer:
    """Per-stage time of a batch: surface time x the stage's layer share x noise x drift.

    Noise is log-normal with sigma ``noise_sigma``, independent per batch and stage.
    Drift is slow: a factor ``1 + drift * sin(2 pi k / DRIFT_PERIOD_CALLS)`` over the
    k-th call (batch or profiling run), as a device whose clocks or neighbours change.
    """

    surface: Surface
    stage_shares: tuple[float, ...]
    noise_sigma: float = 0.0
    seed: int = 0
    drift: float = 0.0

    DRIFT_PERIOD_CALLS = 400

    @classmethod
    def build(
        cls,
        surface: Surface,
        num_stages: int,
        layers: Sequence[int] | None = None,
        noise_sigma: float = 0.0,
        seed: int = 0,
        drift: float = 0.0,
    ) -> StageTimer:
        if layers:
            if len(layers) != num_stages or any(n <= 0 for n in layers):
                raise ValueError(f"--layers needs {num_stages} positive counts (one per stage), got {list(layers)}")
            total = float(sum(layers))
            shares = tuple(n / total for n in layers)
        else:
            shares = tuple(1.0 / num_stages for _ in range(num_stages))
        if not (math.isfinite(noise_sigma) and noise_sigma >= 0):
            raise ValueError(f"--noise must be a finite number >= 0, got {noise_sigma}")
        if not (math.isfinite(drift) and 0 <= drift < 1):
            raise ValueError(f"--drift must be in [0, 1), got {drift}")
        return cls(surface, shares, noise_sigma, seed, drift)

    def _factors(self, stream: int, index: int) -> np.ndarray:
        drift = 1.0 + self.drift * math.sin(2 * math.pi * index / self.DRIFT_PERIOD_CALLS)
        if self.noise_sigma == 0:
            return np.full(len(self.stage_shares), drift)
        rng = np.random.default_rng([self.seed, stream, index])
        return drift * np.exp(rng.normal(0.0, self.noise_sigma, size=len(self.stage_shares)))

    def __call__(self, chunks: tuple[Chunk, ...], batch_index: int) -> tuple[float, ...]:
        total_ms = batch_ms(self.surface, [(c.chunk_tokens, c.history_tokens) for c in chunks])
        factors = self._factors(0, batch_index)
        return tuple(total_ms * share * float(n) for share, n in zip(self.stage_shares, factors, strict=True))

    def profile_stage_ms(self, chunk_tokens: int, history_tokens: int, call_index: int) -> tuple[float, ...]:
        """Each stage's compute for one profiling run (what each PP rank's worker measures)."""
        total_ms = self.surface.time_ms(chunk_tokens, history_tokens)
        factors = self._factors(1, call_index)
        return tuple(total_ms * share * float(n) for share, n in zip(self.stage_shares, factors, strict=True))
