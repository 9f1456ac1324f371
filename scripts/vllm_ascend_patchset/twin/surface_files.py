"""``--surface``: read a latency surface from a spec, a measured CSV or a profile the engine saved.

Every file is untrusted input. A value is admitted only if it is a measurement:
whole token counts, ``1 <= chunk_tokens <= MAX_TOKENS``, ``0 <= history_tokens <=
MAX_TOKENS``, a latency within ``[MIN_LATENCY_MS, MAX_LATENCY_MS]`` (no forward pass
takes less than a microsecond or more than hours; the scheduler's profile samples obey
the same range). Every refusal is a ``ValueError`` whose message starts with the spec or
``file:line`` and says what to give. A CSV may start with a UTF-8 byte-order mark (as
spreadsheet tools write it); lines starting with ``#`` are comments.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .engine import TINY_MODEL_MAX_POSITIONS
from .stress import STRESS_SURFACES, stress_surface
from .surface import SYNTHETIC, GridSurface, QuadraticSurface, Surface

CSV_COLUMNS = ("chunk_tokens", "history_tokens", "latency_ms")
MAX_TOKENS = 1 << 30
MIN_LATENCY_MS = 1e-3
MAX_LATENCY_MS = 1e7
MAX_FILE_BYTES = 64 << 20


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def measured_point(chunk: Any, history: Any, latency: Any, where: str) -> tuple[int, int, float]:
    """One measurement (chunk_tokens, history_tokens, latency_ms), checked; an error names ``where``."""
    c, h, ms = _number(chunk), _number(history), _number(latency)
    if c is None or not c.is_integer() or not 1 <= c <= MAX_TOKENS:
        raise ValueError(f"{where}: chunk_tokens {chunk!r:.40} must be a whole number in [1, {MAX_TOKENS}]")
    if h is None or not h.is_integer() or not 0 <= h <= MAX_TOKENS:
        raise ValueError(f"{where}: history_tokens {history!r:.40} must be a whole number in [0, {MAX_TOKENS}]")
    if ms is None or not MIN_LATENCY_MS <= ms <= MAX_LATENCY_MS:
        raise ValueError(
            f"{where}: latency_ms {latency!r:.40} must be a number of milliseconds in "
            f"[{MIN_LATENCY_MS:g}, {MAX_LATENCY_MS:g}] (a forward pass's time)"
        )
    return int(c), int(h), ms


def _read_text(path: Path) -> str:
    with path.open("rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; not a latency surface")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


NUMBERS_ROW = "a CSV row of numbers"


def csv_cells(line: str, where: str, row: str = "a CSV row") -> list[str]:
    """The cells of one CSV line; a line csv refuses (a cell over its field limit) is a ValueError naming
    ``where`` (file:line) and what the ``row`` should have been."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error as error:
        raise ValueError(f"{where}: not {row} ({error})") from None


def load_csv_points(path: Path) -> list[tuple[int, int, float]]:
    """Rows of ``chunk_tokens,history_tokens,latency_ms``; every value checked, an error names file and line."""
    lines = [(n, line) for n, line in enumerate(_read_text(path).splitlines(), 1) if line.strip()]
    lines = [(n, line) for n, line in lines if not line.lstrip().startswith("#")]
    header = [name.strip() for name in csv_cells(lines[0][1], f"{path}:{lines[0][0]}", NUMBERS_ROW)] if lines else []
    missing = [name for name in CSV_COLUMNS if name not in header]
    if missing:
        raise ValueError(
            f"{path}:{lines[0][0] if lines else 1}: missing column(s) {', '.join(missing)} in the header "
            f"{header!r:.120}; expected {','.join(CSV_COLUMNS)}"
        )
    columns = [header.index(name) for name in CSV_COLUMNS]
    points = []
    for n, line in lines[1:]:
        cells = csv_cells(line, f"{path}:{n}", NUMBERS_ROW)
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
            raise ValueError(
                f"{where}: samples[{i}] must be [chunk_tokens, history_tokens, latency_ms]: {sample!r:.80}"
            )
        points.append(measured_point(*sample, where=f"{where}: samples[{i}]"))
    return points


def _model_from_profile(data: dict[str, Any], name: str, scale: float) -> QuadraticSurface | None:
    """A quadratic model, if the profile carries coefficients c0_ms..c4_ms (profiles of schema 1)."""
    coefficients = data.get("coefficients")
    if not isinstance(coefficients, dict) or "c0_ms" not in coefficients:
        return None
    values = [_number(coefficients.get(f"c{i}_ms")) for i in range(5)]
    if any(v is None for v in values):
        raise ValueError("coefficients c0_ms..c4_ms must be finite numbers")
    return QuadraticSurface(*(v * scale for v in values), name=name)


def profile_stages(data: dict[str, Any]) -> int:
    """PP size the profile was taken at: its samples are one stage's time, the whole model is that many."""
    fingerprint = data.get("fingerprint")
    stages = fingerprint.get("pipeline_parallel_size", 1) if isinstance(fingerprint, dict) else 1
    return stages if isinstance(stages, int) and not isinstance(stages, bool) and 1 <= stages <= 4096 else 1


MIN_BATCH_MS = 1e-3  # no forward pass is quicker than a microsecond; below it the ms arithmetic loses meaning
LONGEST_BATCH_TOKENS = TINY_MODEL_MAX_POSITIONS  # the twin's largest batch: this many new tokens after as many
MAX_BATCH_MS = 1e10  # that batch's time at most (116 days): the slowest surface held (the tiny model on a CPU core,
# extrapolated that far) takes 2e9 ms, a real accelerator far less; beyond it a run's ms clock (a double, ~16
# digits) cannot keep the microsecond of its shortest batch, and coefficients such as 1e300 overflow to inf


def load_surface(spec: str) -> Surface:
    """A surface from ``--surface``: ``synthetic``, ``stress:<name>``, ``quadratic:C0,C1,C2,C3,C4`` (ms
    coefficients of 1, C, H, C^2, C*H), a ``.csv`` of measurements, or a profile ``.json`` saved by the
    engine (its samples; a schema-1 profile's coefficients). A profile holds one pipeline stage's time
    (the slowest worker's), so it is scaled by the PP size in its fingerprint to the whole model's
    time, which the twin then splits over its P stages."""
    surface = _read_surface(spec)
    first_ms = surface.time_ms(1, 0)
    if not (math.isfinite(first_ms) and first_ms >= MIN_BATCH_MS):
        raise ValueError(
            f"--surface {spec}: a 1-token chunk takes {first_ms:g} ms on it; every batch must take at least"
            f" {MIN_BATCH_MS:g} ms (a microsecond)"
        )
    longest = LONGEST_BATCH_TOKENS
    longest_ms = max(surface.time_ms(longest, 0), surface.time_ms(1, longest), surface.time_ms(longest, longest))
    if not (math.isfinite(longest_ms) and longest_ms <= MAX_BATCH_MS):
        raise ValueError(
            f"--surface {spec}: the twin's largest batch ({longest} tokens after {longest} of history) takes"
            f" {longest_ms:g} ms on it; a batch must take at most {MAX_BATCH_MS:g} ms (check its coefficients:"
            " ms per batch, per token, per history token, per token squared and per token x history token)"
        )
    return surface


def _read_surface(spec: str) -> Surface:
    if spec in ("", "synthetic"):
        return SYNTHETIC
    if spec.startswith("stress:"):
        return stress_surface(spec.split(":", 1)[1])
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
        raise ValueError(
            f"--surface {spec!r}: no such file (give a .csv, a profile .json, 'synthetic' or one of "
            f"{', '.join('stress:' + name for name in STRESS_SURFACES)})"
        )
    try:
        return _surface_from_file(path, spec)
    except OSError as exc:
        raise ValueError(f"--surface {spec}: cannot read it ({exc.strerror or exc})") from None


def _surface_from_file(path: Path, spec: str) -> Surface:
    """A measured CSV, or an engine profile JSON (its samples, else its coefficients)."""
    if path.suffix.lower() == ".csv":
        return _from_points(load_csv_points(path), path.name, spec)
    try:
        data = json.loads(_read_text(path))
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"--surface {spec}: not a JSON profile ({type(exc).__name__}: {str(exc):.120})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--surface {spec}: a profile is a JSON object")
    stages = profile_stages(data)
    points = [(c, h, ms * stages) for c, h, ms in _points_from_profile(data, f"--surface {spec}")]
    if len(points) >= 5:
        return _from_points(points, path.name, spec)
    label = f"{path.name} (engine model x PP {stages})" if stages > 1 else f"{path.name} (engine model)"
    try:
        model = _model_from_profile(data, label, float(stages))
    except ValueError as exc:
        raise ValueError(f"--surface {spec}: {exc}") from None
    if model is not None:
        return model
    raise ValueError(
        f"--surface {spec}: the profile has neither 5 measured samples nor coefficients c0_ms..c4_ms;"
        " save it from the engine again or pass a CSV"
    )


def _from_points(points: Sequence[tuple[int, int, float]], name: str, spec: str) -> Surface:
    try:
        return GridSurface.from_points(points, name=name)
    except ValueError as exc:
        raise ValueError(f"--surface {spec}: {exc}") from None
