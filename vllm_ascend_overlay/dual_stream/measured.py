"""The measured gate: dual stream only where it measured faster, on this deployment.

When ``dual_stream_config.length_threshold`` is not set, the gate does not trust a
hand-set length. Batches are classed by the token count of their smaller micro-batch, in
size classes that double from ``MEASURE_FLOOR`` (128, 256, ... up to half of
``--max-num-batched-tokens``). The first ``measure_repeats`` qualifying prefill batches of
each class are *probes*: each runs single-stream and dual-stream (in alternating order),
both timed with the device synchronised, and returns the second run's output (the KV
cache then holds that run's values). The timings are reduced with a max over the TP group,
so every rank holds the same pairs and takes the same decisions.

A class *wins* when its fastest dual-stream run took at most ``WIN_RATIO`` of its fastest
single-stream run. The crossover is the smallest complete class from which every complete
class wins; a batch goes dual stream when its smaller micro-batch has at least that many
tokens (none when the largest complete class loses: dual stream stays off). A batch whose
class is still incomplete is probed; one below ``MEASURE_FLOOR`` never splits.

The cost is bounded: at most ``measure_repeats`` probes per class, each one extra forward
of a batch that was going to run anyway. The probes are kept in a cache
(``measured_store``) so a restart of the same deployment probes only what is missing.

Pure logic here (no torch, no I/O, no collective); ``MeasuredMode`` holds the state of one
model and runs a probe with the callables it is given (the model supplies them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MEASURE_FLOOR = 128  # micro-batch tokens below which the measured gate never splits
# Dual stream must take at most this share of single stream's time. A wrong "on" slows every
# batch of a class, a wrong "off" forgoes a gain of a few percent, and a decision rests on a
# few probes: a class turns dual stream on only where it clearly pays.
WIN_RATIO = 0.95
# What one forward of a probe batch can take. It holds at least MEASURE_FLOOR tokens per
# micro-batch through every layer: no device does that in under a microsecond, so a smaller
# time is a broken timer (or an edited cache file) and would make dual stream "win" its
# class; an hour is no timing either.
MIN_PROBE_SECONDS = 1e-6
MAX_PROBE_SECONDS = 3600.0


@dataclass(frozen=True)
class Probe:
    """One batch timed both ways; ``size_class`` is the class's lower bound in micro-batch tokens."""

    size_class: int
    single_s: float
    dual_s: float


def size_classes(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Doubling classes from ``MEASURE_FLOOR`` up to the largest a batch's smaller half can reach."""
    classes, size = [], MEASURE_FLOOR
    while size <= max_num_batched_tokens // 2:
        classes.append(size)
        size *= 2
    return tuple(classes)


class MeasuredGate:
    """The probes so far and the decisions they imply; the same on every rank."""

    def __init__(self, classes: Sequence[int], repeats: int, probes: Sequence[Probe] = ()):
        if not classes:
            raise ValueError("no size class to measure")
        self.classes = tuple(classes)
        self.repeats = int(repeats)
        self.probes: list[Probe] = []
        for probe in probes:
            self.add(probe)

    def class_of(self, micro_tokens: int) -> int | None:
        """The class of a batch whose smaller micro-batch has ``micro_tokens`` tokens; None below the floor."""
        fitting = [c for c in self.classes if c <= micro_tokens]
        return fitting[-1] if fitting else None

    def of_class(self, size_class: int) -> list[Probe]:
        return [p for p in self.probes if p.size_class == size_class]

    def complete(self, size_class: int) -> bool:
        return len(self.of_class(size_class)) >= self.repeats

    @property
    def finished(self) -> bool:
        return all(self.complete(c) for c in self.classes)

    def add(self, probe: Probe) -> bool:
        """Keep ``probe`` unless its class is complete or unknown; True when this completed the class."""
        if probe.size_class not in self.classes or self.complete(probe.size_class):
            return False
        self.probes.append(probe)
        return self.complete(probe.size_class)

    def ratio(self, size_class: int) -> float | None:
        """Fastest dual-stream over fastest single-stream run of a complete class.

        Whatever else the device or host does meanwhile only ever slows a run down, so the
        fastest run of each kind is the estimate of its time (as timing tools take the
        minimum of repeats); a probe slowed in one of its runs does not decide the class.
        """
        if not self.complete(size_class):
            return None
        probes = self.of_class(size_class)
        return min(p.dual_s for p in probes) / min(p.single_s for p in probes)

    def crossover(self) -> int | None:
        """Smallest complete class from which every complete class wins; None: dual stream off."""
        found = None
        for size_class in reversed(self.classes):
            ratio = self.ratio(size_class)
            if ratio is None:
                continue
            if ratio > WIN_RATIO:
                break
            found = size_class
        return found

    def route(self, micro_tokens: int) -> str:
        """``"single"``, ``"dual"`` or ``"probe"`` for a batch whose smaller micro-batch has ``micro_tokens``."""
        size_class = self.class_of(micro_tokens)
        if size_class is None:
            return "single"
        if not self.complete(size_class):
            return "probe"
        crossover = self.crossover()
        return "dual" if crossover is not None and micro_tokens >= crossover else "single"

    def describe(self) -> str:
        """One line: the crossover and each complete class's ratio."""
        crossover = self.crossover()
        ratios = ", ".join(
            f"{c}: {self.ratio(c):.3f}" if self.complete(c) else f"{c}: {len(self.of_class(c))}/{self.repeats}"
            for c in self.classes
        )
        head = f"from {crossover} tokens per micro-batch" if crossover else "off (never faster where measured)"
        return f"{head}; dual/single by class: {ratios}"


@dataclass
class ProbeRun:
    """What a probe needs from the model, for one batch."""

    run_single: Callable[[], Any]
    run_dual: Callable[[], Any]
    synchronize: Callable[[], None]  # wait for the device (timing)
    agree: Callable[[list[float]], list[float]]  # elementwise max over the TP group (a collective)


class MeasuredMode:
    """One model's measured gate: the state, the probe protocol, the save after each complete class."""

    def __init__(self, gate: MeasuredGate, save: Callable[[list[Probe]], None] | None = None):
        self.gate = gate
        self._save = save
        self.probe_seconds = 0.0  # the probes' dual-stream runs: what measuring added to serving
        self.fault: str | None = None  # why measuring stopped; the same on every rank
        self.decided_logged = False

    def probe(self, micro_tokens: int, run: ProbeRun) -> Any:
        """Run the batch both ways, time it, agree on the timings; returns the second run's output.

        A fault of a forward propagates (collectives are in flight, as in any forward).
        A fault of the timing on any rank becomes an infinite time, which the max over the
        ranks hands to every rank, so every rank sets ``fault`` for the same probe (the
        caller then turns dual stream off) and none is left waiting in a collective.
        """
        size_class = self.gate.class_of(micro_tokens)
        if size_class is None:
            raise ValueError(f"{micro_tokens} tokens per micro-batch is below the measured floor {MEASURE_FLOOR}")
        dual_first = len(self.gate.probes) % 2 == 1  # alternate, so neither side always runs warm
        order = (("dual", run.run_dual), ("single", run.run_single))
        if not dual_first:
            order = order[::-1]
        seconds: dict[str, float] = {}
        output = None
        for name, forward in order:
            start = _timed(run.synchronize)
            output = forward()
            end = _timed(run.synchronize)
            seconds[name] = end - start if math.isfinite(start + end) else math.inf
        agreed = [float(v) for v in run.agree([seconds["single"], seconds["dual"]])]
        if len(agreed) != 2 or not all(MIN_PROBE_SECONDS <= v <= MAX_PROBE_SECONDS for v in agreed):  # NaN fails
            self.fault = (
                f"a rank could not time a probe (agreed timings {agreed}, not in "
                f"[{MIN_PROBE_SECONDS:g}, {MAX_PROBE_SECONDS:g}] s)"
            )
            return output
        self.probe_seconds += agreed[1]  # on top of upstream, which runs each batch once, single-stream
        if self.gate.add(Probe(size_class, agreed[0], agreed[1])) and self._save is not None:
            self._save(list(self.gate.probes))
        return output


def _timed(synchronize: Callable[[], None]) -> float:
    """``time.perf_counter()`` once the device is idle; infinite when the wait fails (agreed on later)."""
    try:
        synchronize()
    except Exception:
        return math.inf
    return time.perf_counter()
