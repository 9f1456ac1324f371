"""The measured gate's decisions and its probe protocol, with scripted timings (no clock, no device)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_ascend.dual_stream import measured
from vllm_ascend.dual_stream.measured import (
    MEASURE_FLOOR,
    WIN_RATIO,
    MeasuredGate,
    MeasuredMode,
    Probe,
    ProbeRun,
    size_classes,
)

CLASSES = size_classes(8192)  # 128 ... 4096


def gate_with(ratios: dict[int, float], repeats: int = 1) -> MeasuredGate:
    """A gate whose classes measured ``ratios`` (dual/single), ``repeats`` probes each."""
    gate = MeasuredGate(CLASSES, repeats)
    for size_class, ratio in ratios.items():
        for _ in range(repeats):
            gate.add(Probe(size_class, 1.0, ratio))
    return gate


def test_size_classes_double_from_the_floor_to_half_the_budget():
    assert size_classes(8192) == (128, 256, 512, 1024, 2048, 4096)
    assert size_classes(8191) == (128, 256, 512, 1024, 2048)
    assert size_classes(256) == (128,) and size_classes(255) == ()
    with pytest.raises(ValueError, match="no size class"):
        MeasuredGate((), 3)


def test_a_batch_belongs_to_the_largest_class_its_smaller_micro_batch_reaches():
    gate = MeasuredGate(CLASSES, 3)
    assert gate.class_of(MEASURE_FLOOR - 1) is None
    assert [gate.class_of(n) for n in (128, 255, 256, 4095, 4096, 100_000)] == [128, 128, 256, 2048, 4096, 4096]


def test_an_unmeasured_class_is_probed_and_below_the_floor_never_splits():
    gate = MeasuredGate(CLASSES, 2)
    assert gate.route(127) == "single"
    assert gate.route(300) == "probe"
    gate.add(Probe(256, 1.0, 0.5))
    assert gate.route(300) == "probe", "one of two probes"
    assert gate.add(Probe(256, 1.0, 0.5)) is True, "the second completes the class"
    assert gate.route(300) == "dual" and gate.route(600) == "probe"
    assert gate.add(Probe(256, 1.0, 0.5)) is False and len(gate.of_class(256)) == 2, "a complete class takes no more"
    assert gate.add(Probe(300, 1.0, 0.5)) is False, "not a class"


def test_the_crossover_is_where_every_larger_measured_class_wins():
    gate = gate_with({128: 1.2, 256: 0.9, 512: 0.97, 1024: 0.9, 2048: 0.8, 4096: 0.7})
    assert gate.crossover() == 1024
    assert [gate.route(n) for n in (600, 1023, 1024, 5000)] == ["single", "single", "dual", "dual"]
    assert "from 1024 tokens per micro-batch" in gate.describe()


def test_the_gate_stays_off_when_the_largest_measured_class_loses():
    gate = gate_with({128: 0.5, 256: 0.5, 512: 0.5, 1024: 0.5, 2048: 0.5, 4096: 0.99})
    assert gate.crossover() is None and gate.route(4096) == "single" and gate.route(200) == "single"
    assert gate.describe().startswith("off")


def test_a_class_wins_only_at_most_win_ratio():
    assert gate_with({4096: WIN_RATIO}).crossover() == 4096
    assert gate_with({4096: WIN_RATIO + 1e-9}).crossover() is None


def test_incomplete_classes_do_not_decide_and_a_class_decides_by_its_fastest_runs():
    """A run slowed by something else (one-sided) must not decide: fastest dual over fastest single."""
    gate = MeasuredGate(CLASSES, 3)
    for single_s, dual_s in ((1.0, 3.0), (2.5, 0.9), (1.1, 1.2)):  # each probe slowed in one of its runs
        gate.add(Probe(2048, single_s, dual_s))
    gate.add(Probe(4096, 1.0, 5.0))  # 1 of 3: not complete, no say yet
    assert gate.ratio(4096) is None and gate.ratio(2048) == pytest.approx(0.9)
    assert gate.crossover() == 2048 and gate.route(3000) == "dual" and gate.route(5000) == "probe"
    assert not gate.finished


@given(st.dictionaries(st.sampled_from(CLASSES), st.floats(0.3, 1.5), min_size=1))
def test_decisions_are_monotone_in_the_batch_size(ratios):
    """Once the gate sends a batch dual stream, it sends every larger measured batch dual stream too."""
    gate = gate_with(ratios)
    routes = [gate.route(n) for n in range(MEASURE_FLOOR, 9000, 97) if gate.complete(gate.class_of(n))]
    first_dual = routes.index("dual") if "dual" in routes else len(routes)
    assert all(r == "dual" for r in routes[first_dual:])


class Scripted:
    """A probe's model side: which run ran, a clock that charges each run its scripted seconds."""

    def __init__(self, single_s=1.0, dual_s=0.8, agree=None, sync_fault=False):
        self.single_s, self.dual_s, self.sync_fault = single_s, dual_s, sync_fault
        self.now, self.running, self.ran = 0.0, None, []
        self.agree_calls = []
        self._agree = agree or (lambda values: values)

    def run(self, name):
        def forward():
            self.ran.append(name)
            self.running = name
            return f"output of {name}"

        return forward

    def synchronize(self):
        if self.sync_fault:
            raise RuntimeError("device lost")
        if self.running is not None:
            self.now += self.single_s if self.running == "single" else self.dual_s
            self.running = None

    def agree(self, values):
        self.agree_calls.append(list(values))
        return self._agree(values)

    def probe_run(self):
        return ProbeRun(self.run("single"), self.run("dual"), self.synchronize, self.agree)


@pytest.fixture
def clock(monkeypatch):
    scripted = Scripted()
    monkeypatch.setattr(measured.time, "perf_counter", lambda: scripted.now)
    return scripted


def test_a_probe_runs_both_ways_in_alternating_order_and_returns_the_second_output(clock):
    mode = MeasuredMode(MeasuredGate(CLASSES, 2))
    assert mode.probe(300, clock.probe_run()) == "output of dual"
    assert mode.probe(300, clock.probe_run()) == "output of single"
    assert clock.ran == ["single", "dual", "dual", "single"]
    assert mode.gate.of_class(256) == [Probe(256, 1.0, 0.8)] * 2
    assert mode.probe_seconds == pytest.approx(1.6), "what probing added: the dual-stream runs"
    assert clock.agree_calls == [[1.0, 0.8], [1.0, 0.8]]


def test_the_probe_keeps_the_agreed_timings_not_its_own(clock):
    """The ranks' timings differ; every rank keeps the max over the group, so all hold the same probe."""
    clock._agree = lambda values: [values[0], 1.5]  # another rank's dual run was slower
    mode = MeasuredMode(MeasuredGate(CLASSES, 1))
    mode.probe(4096, clock.probe_run())
    assert mode.gate.probes == [Probe(4096, 1.0, 1.5)] and mode.gate.route(4096) == "single"


@pytest.mark.parametrize(
    "agreed",
    [[1.0, math.inf], [math.nan, 1.0], [1.0, 0.0], [1.0, 1e-300], [1.0]],
    ids=["inf", "nan", "zero", "below a microsecond", "short"],
)
def test_a_timing_no_rank_agrees_on_sets_the_fault_and_keeps_no_probe(clock, agreed):
    clock._agree = lambda values: agreed
    mode = MeasuredMode(MeasuredGate(CLASSES, 1))
    assert mode.probe(300, clock.probe_run()) == "output of dual", "the batch is served all the same"
    assert mode.fault and "could not time a probe" in mode.fault and mode.gate.probes == []


def test_a_local_timing_fault_still_reaches_the_agreement_as_an_infinite_time(clock):
    """A rank whose device wait fails must not skip the collective: its peers would wait there forever."""
    clock.sync_fault = True
    mode = MeasuredMode(MeasuredGate(CLASSES, 1))
    mode.probe(300, clock.probe_run())
    assert clock.agree_calls == [[math.inf, math.inf]] and mode.fault


def test_the_probes_are_saved_when_a_class_completes(clock):
    saved = []
    mode = MeasuredMode(MeasuredGate(CLASSES, 2), save=saved.append)
    mode.probe(300, clock.probe_run())
    assert saved == []
    mode.probe(300, clock.probe_run())
    assert saved == [[Probe(256, 1.0, 0.8)] * 2]


def test_a_probe_below_the_floor_is_a_caller_error(clock):
    with pytest.raises(ValueError, match="below the measured floor"):
        MeasuredMode(MeasuredGate(CLASSES, 1)).probe(MEASURE_FLOOR - 1, clock.probe_run())
