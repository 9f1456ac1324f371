"""An emulated TP link for the CPU: all-reduces that take wire time without taking CPU time.

``EmulatedLink`` is one link of a TP rank: a message issued at ``t`` starts once the link
is free (messages leave in order, as collectives ordered on one communication stream
do) and is delivered ``alpha + bytes / beta`` after it started. The real all-reduce still
runs (gloo, so the numbers are right); waiting for a message means waiting for gloo's work
*and* for its delivery time, sleeping, so the CPU stays free for the other micro-batch.

Two ways in, both counting the time the compute thread spends blocked on the link:

- ``install_on_group``: the TP group's own all-reduce (what vLLM's single-stream forward
  and the embedding call) waits for the delivery before it returns;
- ``EmulatedLinkBackend``: the dual-stream backend. ``all_reduce`` issues gloo's
  ``async_op`` all-reduce and returns at once; the works are bound to the event recorded
  after them on the communication stream, and waiting on that event waits for them.

``zero_compute_link`` (``alpha = 0``, no delivery time, no gloo) leaves only compute: the
bench uses it to measure what splitting costs without any communication.

Bench code: not part of the package (``NpuStreamBackend`` is what serves on Ascend).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from vllm_ascend.dual_stream.streams import EventKey, StreamBackend


@dataclass(frozen=True)
class LinkSpec:
    """``alpha_s`` per message, ``beta`` bytes per second (None: no delivery time); ``reduce``
    False skips the real all-reduce (compute-only runs, whose numbers are not used)."""

    alpha_s: float = 0.0
    beta: float | None = None
    reduce: bool = True

    def wire_s(self, nbytes: int) -> float:
        return self.alpha_s + (nbytes / self.beta if self.beta else 0.0)

    @property
    def emulated(self) -> bool:
        return self.alpha_s > 0 or bool(self.beta)


BARE = LinkSpec()
COMPUTE_ONLY = LinkSpec(reduce=False)


class EmulatedLink:
    """One rank's link: in-order delivery times and what the compute thread waited for them."""

    def __init__(self, spec: LinkSpec = BARE) -> None:
        self.spec = spec
        self._free_at = 0.0
        self.reset()

    def reset(self) -> None:
        """Zero the counters (between timed forwards); the link is idle."""
        self.blocked_s = 0.0  # compute thread blocked on a message: all-reduce calls and event waits
        self.wire_s = 0.0  # emulated delivery time of the messages issued
        self.messages = 0
        self.nbytes = 0
        self._free_at = 0.0

    def issue(self, nbytes: int) -> float:
        """A message of ``nbytes`` issued now; returns its delivery time (``time.perf_counter``)."""
        wire = self.spec.wire_s(nbytes)
        start = max(time.perf_counter(), self._free_at)
        self._free_at = start + wire
        self.wire_s += wire
        self.messages += 1
        self.nbytes += nbytes
        return self._free_at

    @staticmethod
    def sleep_until(deadline: float) -> None:
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.blocked_s += time.perf_counter() - start


def install_on_group(group: Any, link: EmulatedLink) -> None:
    """Route the vLLM group coordinator's all-reduce (single stream, embedding) over ``link``."""
    real = group._all_reduce_out_place

    def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
        with link.blocked():
            deadline = link.issue(tensor.numel() * tensor.element_size())
            result = real(tensor) if link.spec.reduce else tensor
            link.sleep_until(deadline)
        return result

    group._all_reduce_out_place = all_reduce  # torch.ops.vllm.all_reduce finds the same instance


class EmulatedLinkBackend(StreamBackend):
    """The dual-stream backend over ``link``: gloo ``async_op`` all-reduces, delivered by the link."""

    def __init__(self, link: EmulatedLink, group: Any = None) -> None:
        super().__init__()
        self._link = link
        self._group = group
        self._on_comm_stream = False
        self._pending: list[tuple[Any, float]] = []
        self._bound: dict[EventKey, list[tuple[Any, float]]] = {}

    def begin(self) -> None:
        super().begin()
        self._pending, self._bound = [], {}

    @contextlib.contextmanager
    def comm_stream(self) -> Iterator[None]:
        self._on_comm_stream = True
        try:
            yield
        finally:
            self._on_comm_stream = False

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        if not self._on_comm_stream:
            raise RuntimeError("the dual-stream all-reduce must run on the communication stream")
        deadline = self._link.issue(partial.numel() * partial.element_size())
        work = dist.all_reduce(partial, group=self._group, async_op=True) if self._link.spec.reduce else None
        self._pending.append((work, deadline))
        return partial  # reduced in place once the work completes

    def _record(self, key: EventKey) -> None:
        # On the communication stream an event covers the all-reduces issued before it.
        if self._on_comm_stream:
            self._bound[key], self._pending = self._pending, []

    def _wait(self, key: EventKey) -> None:
        messages = self._bound.pop(key, [])
        if not messages:
            return
        with self._link.blocked():
            for work, deadline in messages:
                if work is not None:
                    work.wait()
                self._link.sleep_until(deadline)
