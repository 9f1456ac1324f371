"""An emulated TP link for the CPU: all-reduces that take wire time without taking CPU time.

``EmulatedLink`` is one link of a TP rank: a message issued at ``t`` starts once the link
is free (messages leave in order, as collectives ordered on one communication stream
do) and is delivered ``alpha + bytes / beta`` after it started. Waiting for a message
sleeps until then, so the CPU stays free for the other micro-batch. What gloo does
meanwhile is ``LinkSpec.data``:

- ``"real"``: the payload's all-reduce (the numbers are right); gloo's copies and sums
  take about 0.8 ms of CPU per MB here, from the same cores the compute threads use;
- ``"token"``: an all-reduce of one element per message: the ranks meet as they do in a
  collective, and the payload's transfer is left to the emulation, as a device leaves it
  to its link rather than its compute units (the numbers are partial sums: timing only);
- ``"none"``: no collective at all (the bench's pass without any communication).

Two ways in, both counting the time the compute thread spends blocked on the link:

- ``install_on_group``: the TP group's own all-reduce (what vLLM's single-stream forward
  and the embedding call) waits for the delivery before it returns;
- ``EmulatedLinkBackend``: the dual-stream backend. ``all_reduce`` issues gloo's
  ``async_op`` all-reduce and returns at once; the works are bound to the event recorded
  after them on the communication stream, and waiting on that event waits for them.


Bench code: not part of the package (``NpuStreamBackend`` is what serves on Ascend).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from vllm_ascend.dual_stream.streams import EventKey, StreamBackend

DATA_MODES = ("real", "token", "none")


@dataclass(frozen=True)
class LinkSpec:
    """``alpha_s`` per message, ``beta`` bytes per second (None: no delivery time), what gloo moves."""

    alpha_s: float = 0.0
    beta: float | None = None
    data: str = "real"

    def __post_init__(self) -> None:
        if self.data not in DATA_MODES:
            raise ValueError(f"link data must be one of {DATA_MODES}, got {self.data!r}")
        if not 0 <= self.alpha_s < math.inf:  # NaN fails too; a wait of inf or NaN seconds cannot be slept
            raise ValueError(f"link alpha must be finite and >= 0 s, got {self.alpha_s!r}")
        if self.beta is not None and not 0 < self.beta < math.inf:
            raise ValueError(f"link beta must be finite and > 0 bytes/s, or None, got {self.beta!r}")

    def wire_s(self, nbytes: int) -> float:
        return self.alpha_s + (nbytes / self.beta if self.beta else 0.0)

    def gloo_operand(self, payload: torch.Tensor) -> torch.Tensor | None:
        """What gloo all-reduces for ``payload``: itself, one element, or nothing."""
        if self.data == "real":
            return payload
        return torch.zeros(1, dtype=payload.dtype) if self.data == "token" else None


BARE = LinkSpec()
COMPUTE_ONLY = LinkSpec(data="none")


class EmulatedLink:
    """One rank's link: in-order delivery times and what the compute thread waited for them."""

    def __init__(self, spec: LinkSpec = BARE) -> None:
        self.spec = spec
        self._free_at = 0.0
        self.reset()

    def reset(self) -> None:
        """Zero the counters (between timed forwards); the link is idle."""
        self.blocked_s = 0.0  # compute thread blocked on a message: all-reduce calls and event waits
        self.blocked_group_s = 0.0  # of it, in the group's own (synchronous) all-reduce
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
        before = link.blocked_s
        with link.blocked():
            deadline = link.issue(tensor.numel() * tensor.element_size())
            operand = link.spec.gloo_operand(tensor)
            result = real(operand) if operand is not None else None
            link.sleep_until(deadline)
        link.blocked_group_s += link.blocked_s - before
        return result if operand is tensor else tensor

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
        operand = self._link.spec.gloo_operand(partial)
        work = None if operand is None else dist.all_reduce(operand, group=self._group, async_op=True)
        self._pending.append((work, deadline))
        return partial  # reduced in place once the work completes (data "real")

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
