"""Discrete-event core of the twin: a P-stage pipeline fed the way vLLM 0.23.0 feeds it.

Independent of vLLM. A *driver* stands for the scheduler (``Driver`` protocol); a
*stage timer* says how long each stage spends on a batch. ``run_pipeline`` mirrors
``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py) with a simulated clock:

- Each engine step first admits the requests that have arrived by the engine clock.
  If the scheduler has requests, it schedules one batch and submits it; while fewer
  than ``max_batches_in_flight`` (P) batches are in flight it steps again at once.
  Otherwise it waits for the oldest batch to leave the last stage, applies that
  batch's output to the scheduler (``update_from_output``) and steps again. Scheduling
  and output processing take no simulated time.
- Stages form a flow shop: a batch enters stage s when it has left stage s-1 and stage
  s has finished the batch before it; stage s spends ``stage_ms[s]`` on it. Batches
  never overtake each other.
- A batch with no tokens runs no stage (vLLM returns an empty output at once); its
  output is ready when the batch submitted before it has left the last stage, because
  outputs come back in submission order. It still holds a slot of the batch queue
  until it is popped, as in vLLM.

The event log (``BatchRecord`` per batch, ``RequestLog`` per request) is everything
``report`` needs; it is plain data so a policy subprocess can return it as JSON.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Chunk:
    """One request's share of a batch: ``chunk_tokens`` new tokens after ``history_tokens``."""

    req_id: str
    chunk_tokens: int
    history_tokens: int
    is_prefill: bool  # the tokens belong to the prompt
    samples: bool  # the chunk reaches the request's last known token, so a token is sampled


@dataclass
class BatchRecord:
    """What the pipeline did with one scheduled batch."""

    index: int
    submit_ms: float
    chunks: tuple[Chunk, ...]
    stage_start_ms: tuple[float, ...]  # empty for a batch with no tokens
    stage_end_ms: tuple[float, ...]
    done_ms: float  # output ready (left the last stage)
    applied_ms: float = -1.0  # engine clock when update_from_output ran

    @property
    def num_tokens(self) -> int:
        return sum(c.chunk_tokens for c in self.chunks)

    @property
    def stage_ms(self) -> tuple[float, ...]:
        return tuple(e - s for s, e in zip(self.stage_start_ms, self.stage_end_ms, strict=True))

    @property
    def has_prefill(self) -> bool:
        return any(c.is_prefill for c in self.chunks)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["chunks"] = [asdict(c) for c in self.chunks]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRecord:
        return cls(
            index=data["index"],
            submit_ms=data["submit_ms"],
            chunks=tuple(Chunk(**c) for c in data["chunks"]),
            stage_start_ms=tuple(data["stage_start_ms"]),
            stage_end_ms=tuple(data["stage_end_ms"]),
            done_ms=data["done_ms"],
            applied_ms=data["applied_ms"],
        )


@dataclass
class RequestLog:
    """One request's life as the engine saw it (times on the simulated clock)."""

    req_id: str
    arrival_ms: float
    prompt_tokens: int
    max_output_tokens: int
    cached_tokens: int = 0  # prefix-cache hit when first scheduled
    scheduled_tokens: int = 0  # sum of its chunk tokens over all batches
    token_ms: list[float] = field(default_factory=list)  # when each output token was applied
    finish_ms: float | None = None

    @property
    def first_token_ms(self) -> float | None:
        return self.token_ms[0] if self.token_ms else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestLog:
        return cls(**data)


class Driver(Protocol):
    """The scheduler side of the twin, as the engine loop sees it."""

    def admit(self, now_ms: float) -> None:
        """Add every request that has arrived by ``now_ms``."""

    def next_arrival_ms(self) -> float | None:
        """Arrival time of the next request not yet admitted, or None."""

    def has_requests(self) -> bool: ...

    def schedule(self) -> tuple[tuple[Chunk, ...], Any]:
        """Schedule one batch; return its chunks and a handle given back to ``apply``."""

    def apply(self, handle: Any, record: BatchRecord) -> None:
        """Apply the batch's output (it left the last stage at ``record.done_ms``)."""


StageTimer = Callable[[tuple[Chunk, ...], int], Sequence[float]]
"""Per-stage milliseconds for a batch's chunks and its index (the index seeds noise)."""


class Pipeline:
    """P stages in a flow shop; ``submit`` returns when each stage starts and ends a batch."""

    def __init__(self, num_stages: int) -> None:
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.num_stages = num_stages
        self.stage_free_ms = [0.0] * num_stages
        self.last_done_ms = 0.0

    def submit(self, submit_ms: float, stage_ms: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if len(stage_ms) != self.num_stages:
            raise ValueError(f"stage timer gave {len(stage_ms)} stage times for {self.num_stages} stages")
        starts, ends = [], []
        ready_ms = submit_ms
        for stage, spent_ms in enumerate(stage_ms):
            if spent_ms < 0:
                raise ValueError(f"negative stage time {spent_ms} ms at stage {stage}")
            start_ms = max(ready_ms, self.stage_free_ms[stage])
            ready_ms = start_ms + spent_ms
            self.stage_free_ms[stage] = ready_ms
            starts.append(start_ms)
            ends.append(ready_ms)
        self.last_done_ms = ready_ms
        return tuple(starts), tuple(ends)


class SchedulerStuck(RuntimeError):
    """The scheduler holds requests but schedules nothing while nothing is in flight."""


def run_pipeline(
    driver: Driver,
    stage_timer: StageTimer,
    num_stages: int,
    max_batches_in_flight: int | None = None,
    max_batches: int = 1_000_000,
) -> list[BatchRecord]:
    """Run the engine loop until every request has finished; return the batches in order."""
    queue_size = max_batches_in_flight or num_stages
    pipeline = Pipeline(num_stages)
    queue: deque[tuple[BatchRecord, Any]] = deque()
    records: list[BatchRecord] = []
    clock_ms = 0.0
    idle_steps = 0
    while True:
        driver.admit(clock_ms)
        if not driver.has_requests() and not queue:
            next_ms = driver.next_arrival_ms()
            if next_ms is None:
                return records
            if not math.isfinite(next_ms):  # a clock that never reaches it would wait for ever
                raise SchedulerStuck(f"a request arrives at {next_ms} ms; arrival times must be finite")
            clock_ms = max(clock_ms, next_ms)
            continue
        if driver.has_requests():
            chunks, handle = driver.schedule()
            if len(records) >= max_batches:
                raise SchedulerStuck(f"more than {max_batches} batches; the workload does not finish")
            if chunks:
                stage_ms = stage_timer(chunks, len(records))
                starts, ends = pipeline.submit(clock_ms, stage_ms)
                done_ms = ends[-1]
                idle_steps = 0
            else:
                starts, ends = (), ()
                done_ms = max(clock_ms, pipeline.last_done_ms)
                idle_steps += 1
                if idle_steps > 2 * queue_size and all(not r.chunks for r, _ in queue):
                    raise SchedulerStuck(
                        "the scheduler has requests but schedules no tokens and nothing is in flight "
                        "(KV cache too small for the workload, or a scheduler fault)"
                    )
            record = BatchRecord(len(records), clock_ms, tuple(chunks), starts, ends, done_ms)
            records.append(record)
            queue.appendleft((record, handle))
            if len(queue) < queue_size and (chunks or driver.has_requests()):
                continue
        record, handle = queue.pop()
        clock_ms = max(clock_ms, record.done_ms)
        record.applied_ms = clock_ms
        driver.apply(handle, record)
