"""CPU implementations of the dual-stream backend interface, for the tests only.

The package carries only the NPU backend (``vllm_ascend.dual_stream.streams``); these
stand in for it on a CPU:

- ``SequentialBackend``: everything in program order, the all-reduce synchronous.
- ``GlooAsyncBackend``: ``torch.distributed`` all-reduce with ``async_op=True``;
  recording an event on the communication stream binds the pending works to it and
  waiting on the event waits on those works, so a missing wait reads a partial sum.
- ``DeferredAllReduceBackend``: an all-reduce runs only when its event is waited on, so
  a schedule that leaves out a wait computes a different answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from vllm_ascend.dual_stream.streams import EventKey, StreamBackend


class CpuBackend(StreamBackend):
    def __init__(self) -> None:
        super().__init__()
        self._on_comm_stream = False

    @contextlib.contextmanager
    def comm_stream(self) -> Iterator[None]:
        if self._on_comm_stream:
            raise RuntimeError("already on the communication stream")
        self._on_comm_stream = True
        try:
            yield
        finally:
            self._on_comm_stream = False

    def _require_comm_stream(self) -> None:
        if not self._on_comm_stream:
            raise RuntimeError("the dual-stream all-reduce must run on the communication stream")


class SequentialBackend(CpuBackend):
    """CPU, one thread: the all-reduce completes before it returns; events only checked."""

    def __init__(self, all_reduce_fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self._all_reduce_fn = all_reduce_fn

    def _record(self, key: EventKey) -> None:
        pass

    def _wait(self, key: EventKey) -> None:
        pass

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self._require_comm_stream()
        return self._all_reduce_fn(partial)


class _BoundToEvents(CpuBackend):
    """All-reduces left pending until the event recorded after them, on the communication
    stream, is waited on; then ``_complete`` finishes each one (begin drops leftovers)."""

    def __init__(self, group: Any = None):
        super().__init__()
        self._group = group
        self._pending: list[Any] = []
        self._bound: dict[EventKey, list[Any]] = {}

    def begin(self) -> None:
        super().begin()
        self._pending, self._bound = [], {}

    def _record(self, key: EventKey) -> None:
        self._bound[key], self._pending = (self._pending, []) if self._on_comm_stream else ([], self._pending)

    def _wait(self, key: EventKey) -> None:
        for item in self._bound.pop(key, []):
            self._complete(item)

    def _complete(self, item: Any) -> None:
        raise NotImplementedError


class GlooAsyncBackend(_BoundToEvents):
    """torch.distributed (gloo): the all-reduce starts at once (``async_op=True``, in place)
    and waiting on its event waits on the work, so a missing wait reads a partial sum."""

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self._require_comm_stream()
        self._pending.append(dist.all_reduce(partial, group=self._group, async_op=True))
        return partial  # reduced in place once the work completes

    def _complete(self, work: Any) -> None:
        work.wait()


class DeferredAllReduceBackend(_BoundToEvents):
    """Fault detector: an all-reduce runs only when the event recorded after it is waited on.

    Waiting runs the bound all-reduces (blocking, in the same order on every rank). A
    missing wait leaves a partial sum in place, so a schedule that depends on a missing
    wait computes a different answer; a wait on an event not yet recorded raises.
    """

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self._require_comm_stream()
        self._pending.append(partial)
        return partial  # reduced in place only when its event is waited on

    def _complete(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=self._group)
