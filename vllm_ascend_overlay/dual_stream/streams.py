"""Streams, events and the all-reduce behind one small interface.

The schedule (``schedule.py``) speaks only of events keyed ``(kind, layer, micro_batch)``,
of a communication stream, and of an all-reduce launched on it. ``NpuStreamBackend``
implements it with ``torch.npu.Stream`` / ``torch.npu.Event`` and the TP group's
all-reduce; tensors that cross streams are kept alive with ``record_stream``. (The CPU
tests implement it with their own backends, which the package does not carry.)

Every backend refuses to wait on an event that was not recorded in the same forward
(``EventOrderError``): on a device a wait on an unrecorded event is silently a no-op,
which would turn a schedule bug into wrong numbers instead of an error.
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch


class EventKind(enum.Enum):
    ATTN_COM_FINISH = "attention compute finished"
    ATTN_AR_FINISH = "attention all-reduce finished"
    FFN_COM_FINISH = "MLP compute finished"
    FFN_AR_FINISH = "MLP all-reduce finished"


EventKey = tuple[EventKind, int, int]  # (kind, layer index, micro-batch index)


class EventOrderError(RuntimeError):
    """An event was waited on before it was recorded in this forward."""


class StreamBackend(ABC):
    def __init__(self) -> None:
        self._recorded: set[EventKey] = set()

    def begin(self) -> None:
        """Start of a dual-stream forward: forget the previous forward's events."""
        self._recorded.clear()

    def record(self, key: EventKey) -> None:
        """Record ``key`` on the current stream."""
        self._recorded.add(key)
        self._record(key)

    def wait(self, key: EventKey) -> None:
        """Make the current stream wait until ``key``'s recorded work is done."""
        if key not in self._recorded:
            kind, layer, micro_batch = key
            raise EventOrderError(f"{kind.name} of layer {layer}, micro-batch {micro_batch} waited before recorded")
        self._wait(key)

    @abstractmethod
    def _record(self, key: EventKey) -> None: ...

    @abstractmethod
    def _wait(self, key: EventKey) -> None: ...

    @abstractmethod
    def comm_stream(self) -> contextlib.AbstractContextManager:
        """Context in which the current stream is the communication stream."""

    @abstractmethod
    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Launch the TP all-reduce of ``partial`` on the current (communication) stream."""

    def synchronize(self) -> None:
        """Wait until the device has finished all work issued so far (the measured gate's timing).

        Host backends finish everything a forward issued before it returns: nothing to wait for.
        """
        return None


class NpuStreamBackend(StreamBackend):
    """Ascend: a second stream for HCCL all-reduces, ordered against compute by events."""

    def __init__(self, all_reduce_fn: Callable[[torch.Tensor], torch.Tensor], device_module: Any = None):
        super().__init__()
        self._all_reduce_fn = all_reduce_fn
        self._device = device_module if device_module is not None else torch.npu  # type: ignore[attr-defined]
        self._comm: Any = None
        self._compute: Any = None
        self._events: dict[EventKey, Any] = {}  # reused across forwards; a wait sees the latest record

    def begin(self) -> None:
        super().begin()
        self._compute = self._device.current_stream()
        if self._comm is None:
            self._comm = self._device.Stream()

    def _record(self, key: EventKey) -> None:
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = self._device.Event()
        event.record(self._device.current_stream())

    def _wait(self, key: EventKey) -> None:
        self._device.current_stream().wait_event(self._events[key])

    def comm_stream(self) -> contextlib.AbstractContextManager:
        return self._device.stream(self._comm)

    def synchronize(self) -> None:
        self._device.synchronize()

    @staticmethod
    def _keep_alive(tensor: torch.Tensor, stream: Any) -> None:
        # The caching allocator must not hand this memory to another tensor until
        # ``stream`` has finished with it.
        tensor.record_stream(stream)

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self._keep_alive(partial, self._comm)  # made on compute, read on comm
        reduced = self._all_reduce_fn(partial)
        if reduced is not partial:
            self._keep_alive(reduced, self._compute)  # made on comm, read on compute
        return reduced
