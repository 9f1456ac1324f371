"""Profile samples of dynamic chunked pipeline parallelism (CPP): one validation, one grouping.

A sample is one timed forward pass: ``(chunk_tokens, history_tokens, latency_ms)``, a
prefill chunk of C new tokens after H tokens of history and the slowest pipeline
stage's time for it. The same rule admits a sample wherever one comes from: the
start-up profile, a cached profile file and a timed step of online calibration
(``check_sample``). A sample is admitted only if it is a physical measurement:

- token counts are integers (never a float, a bool or a string: a count written as
  ``8192.0`` or ``"123"`` was not written by the profiler), ``1 <= C <= MAX_TOKENS`` and
  ``0 <= H <= MAX_TOKENS``;
- the latency is a real number (int or float, never a bool or a string) within
  ``[MIN_LATENCY_MS, MAX_LATENCY_MS]``: no forward pass takes less than a microsecond,
  none takes hours. Denormals, zeros and overflows never reach the arithmetic. A
  worker's answer to a profiling run is checked by the same rule (``check_latency``)
  before anything converts it.

``group_points`` reduces samples to one point per (C, H): the median of its repeats
and how many there were, plus the scatter between repeats of the same point (a robust
relative spread, pooled over every point measured more than once). Pure Python: no
numpy, no vLLM, no I/O.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_LATENCY_MS",
    "MAX_TOKENS",
    "MIN_LATENCY_MS",
    "FitError",
    "Point",
    "SampleError",
    "admitted",
    "check_latency",
    "check_sample",
    "check_samples",
    "group_points",
]

MAX_TOKENS = 1 << 30  # no chunk or history is longer; C^2 and C*H stay exact in a float
MIN_LATENCY_MS = 1e-3  # a microsecond: no forward pass is faster
MAX_LATENCY_MS = 1e7  # about three hours: no forward pass is slower


class FitError(ValueError):
    """Profile data that cannot give a latency model; the message names the rule that failed."""


class SampleError(FitError):
    """One sample is not a measurement; the message names the value and the rule."""


def _whole(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SampleError(f"{name} {value!r:.40} is not an integer number of tokens")
    if not low <= value <= MAX_TOKENS:
        raise SampleError(f"{name} {value!r:.40} is outside [{low}, {MAX_TOKENS}]")
    return int(value)


def check_sample(sample: object) -> tuple[int, int, float]:
    """``(chunk_tokens, history_tokens, latency_ms)`` of one admissible sample; else SampleError."""
    if isinstance(sample, str | bytes) or not isinstance(sample, Sequence) or len(sample) != 3:
        raise SampleError(f"a sample is [chunk_tokens, history_tokens, latency_ms], not {sample!r:.80}")
    chunk, history, latency = sample
    return _whole(chunk, "chunk_tokens", 1), _whole(history, "history_tokens", 0), check_latency(latency)


def check_latency(latency: object) -> float:
    """The time of one forward pass in ms as a float, checked before it is converted; else SampleError."""
    if isinstance(latency, bool) or not isinstance(latency, numbers.Real):
        raise SampleError(f"latency_ms {latency!r:.40} is not a number")
    try:
        latency_ms = float(latency)
    except OverflowError:
        raise SampleError(f"latency_ms {latency!r:.40} is not a forward pass's time") from None
    if not MIN_LATENCY_MS <= latency_ms <= MAX_LATENCY_MS:
        raise SampleError(
            f"latency_ms {latency_ms!r} is not a forward pass's time "
            f"(outside [{MIN_LATENCY_MS:g}, {MAX_LATENCY_MS:g}] ms)"
        )
    return latency_ms


def admitted(samples: Iterable[object]) -> tuple[list[tuple[int, int, float]], int]:
    """The samples that pass ``check_sample`` (as it returns them), and how many did not."""
    valid, dropped = [], 0
    for sample in samples:
        try:
            valid.append(check_sample(sample))
        except SampleError:
            dropped += 1
    return valid, dropped


def check_samples(samples: Iterable[object]) -> list[tuple[int, int, float]]:
    """Every sample checked; the first bad one raises SampleError naming its index."""
    checked = []
    for index, sample in enumerate(samples):
        try:
            checked.append(check_sample(sample))
        except SampleError as error:
            raise SampleError(f"sample {index}: {error}") from None
    return checked


@dataclass(frozen=True)
class Point:
    chunk_tokens: int
    history_tokens: int
    median_ms: float
    repeats: int


def group_points(samples: Iterable[tuple[int, int, float]]) -> tuple[list[Point], float]:
    """One point per (C, H), sorted by (H, C), and the relative scatter between repeats.

    The scatter is the relative standard deviation of one sample, estimated robustly
    from the differences between repeats of the same point: for Gaussian noise a
    difference of two samples has deviation sigma * sqrt(2), whose median absolute value
    is 0.6745 of it, so sigma = median(|a - b| / point median) / (0.6745 * sqrt(2)) over
    every pair of repeats of every point measured more than once. A wild repeat moves a
    median, not the estimate. 0.0 when no point was measured twice. The pairs are listed: a
    profile runs a point at most about a hundred times (a cached file holding more is refused
    before it is judged, core/cpp_profile_store.py ``check_size``), so they number about as
    many as the samples times fifty.
    """
    by_point: dict[tuple[int, int], list[float]] = {}
    for chunk, history, latency in samples:
        by_point.setdefault((chunk, history), []).append(latency)
    points, differences = [], []
    for (chunk, history), values in sorted(by_point.items(), key=lambda item: (item[0][1], item[0][0])):
        median = statistics.median(values)
        points.append(Point(chunk, history, median, len(values)))
        differences += [abs(a - b) / median for i, a in enumerate(values) for b in values[i + 1 :]]
    return points, statistics.median(differences) / (0.6745 * math.sqrt(2.0)) if differences else 0.0
