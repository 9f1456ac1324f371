"""A scripted stand-in for the scheduler, for the twin's pure-pipeline tests."""

from __future__ import annotations

from vllm_ascend_patchset.twin.pipeline import Chunk, RequestLog


class ScriptedDriver:
    """One prompt cut into given chunks, scheduled the way vLLM's scheduler does under PP.

    A chunk is scheduled as soon as asked (history advances at schedule time); once every
    prompt token is scheduled the scheduler returns empty batches until the last chunk's
    output arrives, then the request finishes with one token.
    """

    def __init__(self, chunk_tokens: list[int], arrival_ms: float = 0.0) -> None:
        self.chunks = list(chunk_tokens)
        self.prompt_tokens = sum(chunk_tokens)
        self.log = RequestLog("r", arrival_ms, self.prompt_tokens, 1)
        self.admitted = False
        self.finished = False
        self.history_tokens = 0

    def admit(self, now_ms: float) -> None:
        self.admitted = self.admitted or now_ms >= self.log.arrival_ms

    def next_arrival_ms(self) -> float | None:
        return None if self.admitted else self.log.arrival_ms

    def has_requests(self) -> bool:
        return self.admitted and not self.finished

    def schedule(self):
        if not self.chunks:
            return (), None
        size = self.chunks.pop(0)
        chunk = Chunk("r", size, self.history_tokens, True, samples=not self.chunks)
        self.history_tokens += size
        self.log.scheduled_tokens += size
        return (chunk,), None

    def apply(self, handle, record) -> None:
        if any(c.samples for c in record.chunks):
            self.log.token_ms.append(record.applied_ms)
            self.log.finish_ms = record.applied_ms
            self.finished = True


def timer_from_table(ms_by_chunk: dict[int, tuple[float, ...]]):
    """Stage times looked up by chunk size (the sizes in a test are distinct)."""
    return lambda chunks, index: ms_by_chunk[chunks[0].chunk_tokens]
