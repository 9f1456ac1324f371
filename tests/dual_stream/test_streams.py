"""Backends and the event schedule, in one process."""

from __future__ import annotations

import contextlib

import pytest
import torch
from vllm_ascend.dual_stream import schedule
from vllm_ascend.dual_stream.schedule import MicroBatch, run_layers
from vllm_ascend.dual_stream.streams import EventKind, EventOrderError, NpuStreamBackend, StreamBackend

from dual_stream.cpu_backends import SequentialBackend

ATTN_COM, ATTN_AR, FFN_COM, FFN_AR = (
    EventKind.ATTN_COM_FINISH,
    EventKind.ATTN_AR_FINISH,
    EventKind.FFN_COM_FINISH,
    EventKind.FFN_AR_FINISH,
)


class TraceBackend(SequentialBackend):
    """Sequential, plus a trace of (stream, action, event or op)."""

    def __init__(self, trace):
        super().__init__(lambda t: t * 2)  # "all-reduce" over two identical ranks
        self.trace = trace

    def _record(self, key):
        self.trace.append(("comm" if self._on_comm_stream else "compute", "record", key))

    def _wait(self, key):
        self.trace.append(("comm" if self._on_comm_stream else "compute", "wait", key))

    def all_reduce(self, partial):
        self.trace.append(("comm" if self._on_comm_stream else "compute", "all_reduce", None))
        return super().all_reduce(partial)


class TraceOps:
    def __init__(self, trace):
        self.trace = trace

    def attention_partial(self, layer, positions, hidden_states, residual):
        self.trace.append(("compute", "attention", layer))
        return hidden_states + 1, hidden_states if residual is None else residual

    def mlp_partial(self, layer, hidden_states, residual):
        self.trace.append(("compute", "mlp", layer))
        return hidden_states + 1, residual


def _run(num_layers=2):
    trace = []
    micro_batches = [MicroBatch(torch.arange(2), torch.zeros(2, 3), None) for _ in range(2)]
    run_layers(list(range(num_layers)), micro_batches, TraceOps(trace), TraceBackend(trace))
    return trace, micro_batches


def test_the_schedule_is_the_seeds_four_event_order():
    trace, _ = _run(num_layers=2)
    expected = []
    for layer in range(2):
        for i in range(2):
            if layer > 0:
                expected.append(("compute", "wait", (FFN_AR, layer - 1, i)))
            expected += [
                ("compute", "attention", layer),
                ("compute", "record", (ATTN_COM, layer, i)),
                ("comm", "wait", (ATTN_COM, layer, i)),
                ("comm", "all_reduce", None),
                ("comm", "record", (ATTN_AR, layer, i)),
            ]
        for i in range(2):
            expected += [
                ("compute", "wait", (ATTN_AR, layer, i)),
                ("compute", "mlp", layer),
                ("compute", "record", (FFN_COM, layer, i)),
                ("comm", "wait", (FFN_COM, layer, i)),
                ("comm", "all_reduce", None),
                ("comm", "record", (FFN_AR, layer, i)),
            ]
    expected += [("compute", "wait", (FFN_AR, 1, i)) for i in range(2)]
    assert trace == expected


def test_the_schedule_reduces_every_half_layer():
    _, micro_batches = _run(num_layers=2)
    # per half layer: +1 then x2 (the all-reduce of two equal ranks): 0 -> 2 -> 6 -> 14 -> 30
    for mb in micro_batches:
        assert torch.equal(mb.hidden_states, torch.full((2, 3), 30.0))
        assert torch.equal(mb.residual, torch.zeros(2, 3))


def test_waiting_before_recording_raises():
    backend = SequentialBackend(lambda t: t)
    backend.begin()
    with pytest.raises(EventOrderError, match="FFN_AR_FINISH of layer 0, micro-batch 1 waited before recorded"):
        backend.wait((FFN_AR, 0, 1))
    backend.record((FFN_AR, 0, 1))
    backend.wait((FFN_AR, 0, 1))
    backend.begin()  # a new forward forgets the old records
    with pytest.raises(EventOrderError):
        backend.wait((FFN_AR, 0, 1))


def test_a_schedule_that_waits_on_the_next_layer_is_refused(monkeypatch):
    def wait_wrong_layer(backend: StreamBackend, layer_index: int, micro_batch: int) -> None:
        backend.wait((FFN_AR, layer_index, micro_batch))  # not recorded yet

    monkeypatch.setattr(schedule, "wait_for_previous_layer", wait_wrong_layer)
    with pytest.raises(EventOrderError):
        _run(num_layers=2)


def test_cpu_all_reduce_outside_the_comm_stream_is_refused():
    backend = SequentialBackend(lambda t: t)
    with pytest.raises(RuntimeError, match="must run on the communication stream"):
        backend.all_reduce(torch.zeros(1))


class FakeDevice:
    """torch.npu's stream and event surface, logging what the NPU backend asks of it."""

    def __init__(self):
        self.log = []
        self.compute = self.Stream("compute", self.log)
        self.current = self.compute

    class Stream:
        def __init__(self, name="comm", log=None):
            self.name, self.log = name, log

        def wait_event(self, event):
            self.log.append((self.name, "wait", event.recorded_on))

    class Event:
        def __init__(self):
            self.recorded_on = None

        def record(self, stream):
            self.recorded_on = stream.name

    def current_stream(self):
        return self.current

    @contextlib.contextmanager
    def stream(self, stream):
        saved, self.current = self.current, stream
        stream.log = self.log
        try:
            yield
        finally:
            self.current = saved


def test_npu_backend_orders_streams_with_events_and_keeps_cross_stream_tensors_alive(monkeypatch):
    device = FakeDevice()
    kept = []
    monkeypatch.setattr(NpuStreamBackend, "_keep_alive", staticmethod(lambda t, s: kept.append((id(t), s.name))))
    reduced_on = []

    def all_reduce(t):
        reduced_on.append(device.current_stream().name)
        return t * 2

    backend = NpuStreamBackend(all_reduce, device_module=device)
    backend.begin()
    partial = torch.ones(2)
    backend.record((ATTN_COM, 0, 0))
    with backend.comm_stream():
        backend.wait((ATTN_COM, 0, 0))
        reduced = backend.all_reduce(partial)
        backend.record((ATTN_AR, 0, 0))
    backend.wait((ATTN_AR, 0, 0))
    assert reduced_on == ["comm"]
    assert kept == [(id(partial), "comm"), (id(reduced), "compute")]
    assert device.log == [("comm", "wait", "compute"), ("compute", "wait", "comm")]
    events = backend._events
    backend.begin()
    backend.record((ATTN_COM, 0, 0))
    assert backend._events is events and len(events) == 2, "events are reused across forwards"
