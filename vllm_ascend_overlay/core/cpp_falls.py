"""Times in a CPP profile that fall as the chunk or the history grows: noise, or a fact about the device.

A device's step time mostly grows with the chunk (more work) and with the history (more
to read and attend to). Where the profile shows it falling between two neighbouring grid
points (a larger size at one history, or a deeper history at one size), there are two
mechanisms, and the runs behind the two medians tell them apart:

- **noise**: a run taken during a hiccup (another process, a clock change) moves a
  median of two runs by half its error, and only the runs it hit. Such a fall does not
  repeat: the other runs of the same points do not show it.
- **a fact**: a size that hits a better kernel or tiling (a sweet spot), or a worse one,
  at some histories. Every run shows it, for it is the same computation each time.

A fall is *beyond the noise* when its medians fall by more than ``FALL_SIGMAS`` standard
errors of the two (from the scatter between repeats of one point and their repeats) and
by more than ``ODD_MIN_FALL``. It *repeated* when each of its points was run at least
twice and every run of the later point took less than every run of the earlier one
(unanimous), or when each has at least ``CONFIRM_SAMPLES`` runs and the fall holds on
their medians (a median of three runs outvotes one bad run). A fall beyond the noise that
has not repeated is measured again (``remeasure_runs``: only its two points, up to
``CONFIRM_SAMPLES`` runs each), and judged again on every run. One that repeated is kept by
the latency model (its points are odd points, core/cpp_latency_model.py); one that did not,
or that was never measured again, is averaged away by isotonic regression as noise is. No
fall refuses a profile.

Pure Python: no numpy, no vLLM, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vllm_ascend.core.cpp_samples import Point

__all__ = [
    "CONFIRM_SAMPLES",
    "FALL_SIGMAS",
    "ODD_MIN_FALL",
    "Fall",
    "find_falls",
    "median_variance",
    "odd_points",
    "remeasure_runs",
    "runs_by_point",
]

FALL_SIGMAS = 4.0  # a fall beyond this many standard errors of the two medians is not noise
# A fall of under 1% moves the two pooled points by half of it each: within the 0.5% the chunk rule
# counts per-token costs as equal (cpp_chunk_rule.EFFICIENT_SLACK), so no decision it makes changes.
ODD_MIN_FALL = 0.01
CONFIRM_SAMPLES = 3  # runs a point needs for its median to outvote one bad run


@dataclass(frozen=True)
class Fall:
    """Two neighbouring grid points, (chunk_tokens, history_tokens) each, the later one taking less."""

    earlier: tuple[int, int]  # the smaller size at one history, or the shallower history at one size
    later: tuple[int, int]
    share: float  # 1 - later's median / earlier's
    repeated: bool

    def describe(self) -> str:
        return f"{self.later} takes {self.share:.0%} less than {self.earlier}"


def median_variance(repeats: int) -> float:
    """The variance of a median of ``repeats`` samples, in units of one sample's (Gaussian noise)."""
    return 1.0 / repeats if repeats <= 2 else math.pi / (2.0 * repeats)


def runs_by_point(samples: Iterable[tuple[int, int, float]]) -> dict[tuple[int, int], list[float]]:
    """Every run's time of each (chunk_tokens, history_tokens)."""
    runs: dict[tuple[int, int], list[float]] = {}
    for chunk, history, latency in samples:
        runs.setdefault((chunk, history), []).append(latency)
    return runs


def _repeated(earlier: list[float], later: list[float]) -> bool:
    if min(len(earlier), len(later)) >= CONFIRM_SAMPLES:
        return True  # (the medians' fall, already beyond the noise, is the majority's)
    return min(len(earlier), len(later)) >= 2 and max(later) < min(earlier)


def find_falls(points: Sequence[Point], runs: Mapping[tuple[int, int], list[float]], scatter: float) -> list[Fall]:
    """Falls beyond the noise between neighbouring points of the grid (``points``), largest first."""
    by_key = {(p.chunk_tokens, p.history_tokens): p for p in points}
    chunks = sorted({p.chunk_tokens for p in points})
    histories = sorted({p.history_tokens for p in points})
    lines = [[(c, h) for c in chunks] for h in histories] + [[(c, h) for h in histories] for c in chunks]
    found = []
    for line in lines:
        present = [key for key in line if key in by_key]
        for a, b in zip(present, present[1:], strict=False):
            low, high = by_key[a], by_key[b]
            share = 1.0 - high.median_ms / low.median_ms
            noise = FALL_SIGMAS * scatter * math.sqrt(median_variance(low.repeats) + median_variance(high.repeats))
            if share > max(ODD_MIN_FALL, noise):
                found.append(Fall(a, b, share, _repeated(runs.get(a, []), runs.get(b, []))))
    return sorted(found, key=lambda fall: -fall.share)


def odd_points(falls: Iterable[Fall]) -> list[tuple[int, int]]:
    """The points of the falls that repeated: the latency model keeps their medians."""
    return sorted({key for fall in falls if fall.repeated for key in (fall.earlier, fall.later)})


def remeasure_runs(
    falls: Iterable[Fall], runs: Mapping[tuple[int, int], list[float]], budget: int
) -> list[tuple[int, int]]:
    """Runs that measure again the points of the falls that have not repeated, largest fall first, until each
    point has ``CONFIRM_SAMPLES`` runs; a fall is left out whole when its runs do not fit ``budget``."""
    planned: list[tuple[int, int]] = []
    for fall in falls:
        if fall.repeated:
            continue
        wanted = [
            key
            for key in (fall.earlier, fall.later)
            if key not in planned
            for _ in range(CONFIRM_SAMPLES - len(runs.get(key, [])))
        ]
        if len(planned) + len(wanted) <= budget:
            planned += wanted
    return planned
