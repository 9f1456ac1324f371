"""Latency surfaces: how long the whole model takes for a batch, and per stage.

A surface answers ``request_ms(chunk_tokens, history_tokens)`` for one request's chunk
and ``batch_ms(chunks)`` for a batch. The batch rule, stated once: a batch pays the
fixed per-step cost once plus each request's own variable cost,

    batch_ms = fixed_ms + sum_i (request_ms(C_i, H_i) - fixed_ms)

so attention never crosses requests, and a batch of one request costs exactly its
``request_ms``. The model form: a per-step cost, a cost per token and per history token,
and attention over the chunk's own tokens and its history:

    request_ms(C, H) = fixed_ms + token_ms * C + history_token_ms * H + attention_pair_ms * C * (C + H)

Sources: ``QuadraticSurface`` (coefficients), ``GridSurface`` (a CSV of measured
``chunk_tokens,history_tokens,ms``; bilinear inside the measured grid, continued
outside it by the least-squares fit's growth, without a jump at the edge), or a profile
JSON saved by the engine (``load_surface``).
``StageTimer`` splits a batch's time over P stages by layer share, with optional
multiplicative noise, seeded so that runs repeat.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .pipeline import Chunk


class Surface(Protocol):
    fixed_ms: float

    def request_ms(self, chunk_tokens: int, history_tokens: int) -> float: ...

    def request_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        """``request_ms`` of many chunk sizes at one history (vectorised)."""

    def describe(self) -> str: ...


def batch_ms(surface: Surface, chunks: Sequence[tuple[int, int]]) -> float:
    """Whole-model time of a batch of (chunk_tokens, history_tokens) pairs (rule in the module doc)."""
    if not chunks:
        return 0.0
    return surface.fixed_ms + sum(surface.request_ms(c, h) - surface.fixed_ms for c, h in chunks)


@dataclass(frozen=True)
class QuadraticSurface:
    """request_ms(C, H) = fixed_ms + token_ms*C + history_token_ms*H + self_pair_ms*C^2 + history_pair_ms*C*H."""

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

    def request_ms(self, chunk_tokens: int, history_tokens: int) -> float:
        return (
            self.fixed_ms
            + chunk_tokens * (self.token_ms + self.self_pair_ms * chunk_tokens + self.history_pair_ms * history_tokens)
            + self.history_token_ms * history_tokens
        )

    def request_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        return self.request_ms(np.asarray(chunk_tokens, dtype=np.float64), float(history_tokens))

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
        weights = 1.0 / np.maximum(ms, 1e-9)
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
class GridSurface:
    """Measured t(C, H) on a rectilinear grid; bilinear inside it, continued by the fit's growth outside."""

    chunk_axis: tuple[int, ...]
    history_axis: tuple[int, ...]
    grid_ms: tuple[tuple[float, ...], ...]  # [history index][chunk index]
    fit: QuadraticSurface
    name: str = "grid"

    @property
    def fixed_ms(self) -> float:
        return self.fit.fixed_ms

    def request_ms(self, chunk_tokens: int, history_tokens: int) -> float:
        """Bilinear inside the grid; outside, the fit's growth from the nearest grid point.

        Beyond the grid the variable part (time above ``fixed_ms``) of the nearest grid
        point is scaled by the fit's ratio between the two points, so the surface is
        continuous at the edge and never falls below the fixed cost.
        """
        cs, hs = self.chunk_axis, self.history_axis
        if len(cs) < 2:
            return self.fit.request_ms(chunk_tokens, history_tokens)
        edge_c = min(max(chunk_tokens, cs[0]), cs[-1])
        edge_h = min(max(history_tokens, hs[0]), hs[-1])
        inside = self._bilinear(edge_c, edge_h)
        if (edge_c, edge_h) == (chunk_tokens, history_tokens):
            return inside
        fixed = self.fixed_ms
        edge_fit = self.fit.request_ms(edge_c, edge_h) - fixed
        if edge_fit <= 0:
            return max(inside, fixed) + self.fit.request_ms(chunk_tokens, history_tokens) - fixed
        scale = (self.fit.request_ms(chunk_tokens, history_tokens) - fixed) / edge_fit
        return fixed + max(inside - fixed, 0.0) * scale

    def request_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        chunks = np.asarray(chunk_tokens, dtype=np.float64)
        cs, hs = np.array(self.chunk_axis, dtype=np.float64), np.array(self.history_axis, dtype=np.float64)
        if len(cs) < 2:
            return self.fit.request_ms_many(chunks, history_tokens)
        grid = np.array(self.grid_ms, dtype=np.float64)
        edge_c = np.clip(chunks, cs[0], cs[-1])
        edge_h = float(min(max(history_tokens, hs[0]), hs[-1]))
        i = np.clip(np.searchsorted(cs, edge_c, side="right") - 1, 0, len(cs) - 2)
        wc = (edge_c - cs[i]) / (cs[i + 1] - cs[i])
        if len(hs) == 1:
            row0 = row1 = grid[0]
            wh = 0.0
        else:
            j = min(max(int(np.searchsorted(hs, edge_h, side="right")) - 1, 0), len(hs) - 2)
            wh = (edge_h - hs[j]) / (hs[j + 1] - hs[j])
            row0, row1 = grid[j], grid[j + 1]
        inside = (row0[i] * (1 - wc) + row0[i + 1] * wc) * (1 - wh) + (row1[i] * (1 - wc) + row1[i + 1] * wc) * wh
        fixed = self.fixed_ms
        edge_fit = self.fit.request_ms_many(edge_c, edge_h) - fixed
        wanted_fit = self.fit.request_ms_many(chunks, history_tokens) - fixed
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = fixed + np.maximum(inside - fixed, 0.0) * wanted_fit / edge_fit
        shifted = np.maximum(inside, fixed) + wanted_fit
        outside = np.where(edge_fit > 0, scaled, shifted)
        at_edge = (edge_c == chunks) & (edge_h == history_tokens)
        return np.where(at_edge, inside, outside)

    def _bilinear(self, chunk_tokens: float, history_tokens: float) -> float:
        cs, hs = self.chunk_axis, self.history_axis
        i = min(max(bisect.bisect_right(cs, chunk_tokens) - 1, 0), len(cs) - 2)
        if len(hs) == 1:
            j, wh = 0, 0.0
            row0 = row1 = self.grid_ms[0]
        else:
            j = min(max(bisect.bisect_right(hs, history_tokens) - 1, 0), len(hs) - 2)
            wh = (history_tokens - hs[j]) / (hs[j + 1] - hs[j])
            row0, row1 = self.grid_ms[j], self.grid_ms[j + 1]
        wc = (chunk_tokens - cs[i]) / (cs[i + 1] - cs[i])
        low = row0[i] * (1 - wc) + row0[i + 1] * wc
        high = row1[i] * (1 - wc) + row1[i + 1] * wc
        return low * (1 - wh) + high * wh

    @classmethod
    def from_points(cls, points: Sequence[tuple[int, int, float]], name: str) -> Surface:
        """A grid if the points cover every (C, H) pair of their axes, else the fit alone."""
        fit = QuadraticSurface.fit(points, name=f"{name} (fit)")
        table: dict[tuple[int, int], list[float]] = {}
        for c, h, ms in points:
            table.setdefault((int(c), int(h)), []).append(float(ms))
        cs = tuple(sorted({c for c, _ in table}))
        hs = tuple(sorted({h for _, h in table}))
        if len(cs) < 2 or any((c, h) not in table for c in cs for h in hs):
            return fit
        grid = tuple(tuple(float(np.median(table[(c, h)])) for c in cs) for h in hs)
        return cls(cs, hs, grid, fit, name=name)

    def describe(self) -> str:
        return (
            f"{self.name}: measured grid C {self.chunk_axis[0]}..{self.chunk_axis[-1]} x H "
            f"{self.history_axis[0]}..{self.history_axis[-1]} ({len(self.chunk_axis)}x{len(self.history_axis)});"
            f" outside: {self.fit.describe()}"
        )


CSV_COLUMNS = ("chunk_tokens", "history_tokens", "latency_ms")


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def measured_point(chunk: Any, history: Any, latency: Any, where: str) -> tuple[int, int, float]:
    """One measurement (chunk_tokens, history_tokens, latency_ms), checked; an error names ``where``."""
    c, h, ms = _number(chunk), _number(history), _number(latency)
    if c is None or not c.is_integer() or c <= 0:
        raise ValueError(f"{where}: chunk_tokens {chunk!r} must be a whole number > 0")
    if h is None or not h.is_integer() or h < 0:
        raise ValueError(f"{where}: history_tokens {history!r} must be a whole number >= 0")
    if ms is None or not math.isfinite(ms) or ms <= 0:
        raise ValueError(f"{where}: latency_ms {latency!r} must be a finite number of milliseconds > 0")
    return int(c), int(h), ms


def load_csv_points(path: Path) -> list[tuple[int, int, float]]:
    """Rows of ``chunk_tokens,history_tokens,latency_ms`` (lines starting with # are comments).

    Every value is checked (``measured_point``); an error names the file and line.
    """
    with open(path, newline="") as handle:
        lines = [(n, line) for n, line in enumerate(handle, 1) if line.strip() and not line.startswith("#")]
    header = [name.strip() for name in next(csv.reader([lines[0][1]]))] if lines else []
    missing = [name for name in CSV_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(CSV_COLUMNS)}")
    columns = [header.index(name) for name in CSV_COLUMNS]
    points = []
    for n, line in lines[1:]:
        cells = next(csv.reader([line]))
        if len(cells) != len(header):
            raise ValueError(f"{path}:{n}: {len(cells)} value(s), the header names {len(header)}")
        points.append(measured_point(*(cells[i].strip() for i in columns), where=f"{path}:{n}"))
    if not points:
        raise ValueError(f"{path}: no measured rows")
    return points


def _points_from_profile(data: dict[str, Any], where: str) -> list[tuple[int, int, float]]:
    """The profile's measured samples, [chunk_tokens, history_tokens, latency_ms] each, checked."""
    samples = data.get("samples") or []
    if not isinstance(samples, list):
        raise ValueError(f"{where}: 'samples' must be a list of [chunk_tokens, history_tokens, latency_ms]")
    points = []
    for i, sample in enumerate(samples):
        if not isinstance(sample, list | tuple) or len(sample) != 3:
            raise ValueError(f"{where}: samples[{i}] must be [chunk_tokens, history_tokens, latency_ms]: {sample!r}")
        points.append(measured_point(*sample, where=f"{where}: samples[{i}]"))
    return points


def _model_from_profile(data: dict[str, Any], name: str, scale: float) -> QuadraticSurface | None:
    """The model the engine accepted, if the profile carries coefficients c0_ms..c4_ms."""
    coefficients = data.get("coefficients")
    if not isinstance(coefficients, dict):
        return None
    try:
        values = [float(coefficients[f"c{i}_ms"]) * scale for i in range(5)]
    except (KeyError, TypeError, ValueError):
        return None
    return QuadraticSurface(*values, name=name)


def _profile_stages(data: dict[str, Any]) -> int:
    """PP size the profile was taken at: its samples are one stage's time, the whole model is that many."""
    fingerprint = data.get("fingerprint")
    stages = fingerprint.get("pipeline_parallel_size", 1) if isinstance(fingerprint, dict) else 1
    return stages if isinstance(stages, int) and stages >= 1 else 1


def load_surface(spec: str) -> Surface:
    """A surface from ``--surface``: ``synthetic``, ``quadratic:C0,C1,C2,C3,C4`` (ms coefficients of
    1, C, H, C^2, C*H), a ``.csv`` of measurements, or a profile ``.json`` saved by the engine
    (its accepted coefficients; its samples if it has no coefficients). A profile holds one
    pipeline stage's time (the slowest worker's), so it is scaled by the PP size in its
    fingerprint to the whole model's time, which the twin then splits over its P stages."""
    surface = _read_surface(spec)
    first_ms = surface.request_ms(1, 0)
    if not (math.isfinite(first_ms) and first_ms > 0):
        raise ValueError(f"--surface {spec}: a 1-token chunk takes {first_ms} ms on it; every batch must take time")
    return surface


def _read_surface(spec: str) -> Surface:
    if spec in ("", "synthetic"):
        return SYNTHETIC
    if spec.startswith("quadratic:"):
        try:
            values = [float(v) for v in spec.split(":", 1)[1].split(",")]
            if len(values) != 5:
                raise ValueError(f"{len(values)} values")
            return QuadraticSurface(*values, name="quadratic")
        except ValueError as exc:
            raise ValueError(
                f"--surface {spec!r}: expected quadratic:C0,C1,C2,C3,C4 (five ms coefficients of 1, C, H, C^2, C*H)"
                f" ({exc})"
            ) from None
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--surface {spec!r}: no such file (give a .csv, a profile .json, or 'synthetic')")
    try:
        return _surface_from_file(path, spec)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--surface {spec}: cannot read it ({exc})") from None


def _surface_from_file(path: Path, spec: str) -> Surface:
    """A measured CSV, or an engine profile JSON (its model, else its samples)."""
    if path.suffix == ".csv":
        return _from_points(load_csv_points(path), path.name, spec)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--surface {spec}: not a JSON profile ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--surface {spec}: a profile is a JSON object")
    stages = _profile_stages(data)
    label = f"{path.name} (engine model x PP {stages})" if stages > 1 else f"{path.name} (engine model)"
    try:
        model = _model_from_profile(data, label, float(stages))
    except ValueError as exc:
        raise ValueError(f"--surface {spec}: {exc}") from None
    if model is not None:
        return model
    points = [(c, h, ms * stages) for c, h, ms in _points_from_profile(data, f"--surface {spec}")]
    if len(points) >= 5:
        return _from_points(points, path.name, spec)
    raise ValueError(
        f"--surface {spec}: the profile has neither coefficients c0_ms..c4_ms nor 5 measured samples;"
        " save it with a fitted model or pass a CSV"
    )


def _from_points(points: Sequence[tuple[int, int, float]], name: str, spec: str) -> Surface:
    try:
        return GridSurface.from_points(points, name=name)
    except ValueError as exc:
        raise ValueError(f"--surface {spec}: {exc}") from None


@dataclass(frozen=True)
class StageTimer:
    """Per-stage time of a batch: surface time times the stage's layer share times noise."""

    surface: Surface
    stage_shares: tuple[float, ...]
    noise_sigma: float = 0.0
    seed: int = 0

    @classmethod
    def build(
        cls,
        surface: Surface,
        num_stages: int,
        layers: Sequence[int] | None = None,
        noise_sigma: float = 0.0,
        seed: int = 0,
    ) -> StageTimer:
        if layers:
            if len(layers) != num_stages or any(n <= 0 for n in layers):
                raise ValueError(f"--layers needs {num_stages} positive counts (one per stage), got {list(layers)}")
            total = float(sum(layers))
            shares = tuple(n / total for n in layers)
        else:
            shares = tuple(1.0 / num_stages for _ in range(num_stages))
        if noise_sigma < 0:
            raise ValueError(f"--noise must be >= 0, got {noise_sigma}")
        return cls(surface, shares, noise_sigma, seed)

    def _noise(self, stream: int, index: int) -> np.ndarray:
        if self.noise_sigma == 0:
            return np.ones(len(self.stage_shares))
        rng = np.random.default_rng([self.seed, stream, index])
        return np.exp(rng.normal(0.0, self.noise_sigma, size=len(self.stage_shares)))

    def __call__(self, chunks: tuple[Chunk, ...], batch_index: int) -> tuple[float, ...]:
        total_ms = batch_ms(self.surface, [(c.chunk_tokens, c.history_tokens) for c in chunks])
        noise = self._noise(0, batch_index)
        return tuple(total_ms * share * float(n) for share, n in zip(self.stage_shares, noise, strict=True))

    def profile_stage_ms(self, chunk_tokens: int, history_tokens: int, call_index: int) -> tuple[float, ...]:
        """Each stage's compute for one profiling run (what each PP rank's worker measures)."""
        total_ms = self.surface.request_ms(chunk_tokens, history_tokens)
        noise = self._noise(1, call_index)
        return tuple(total_ms * share * float(n) for share, n in zip(self.stage_shares, noise, strict=True))
