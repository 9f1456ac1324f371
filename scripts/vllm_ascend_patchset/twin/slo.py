"""Service-level objectives of the twin: goodput, and default bounds that mean the same on any surface.

Goodput: the share of a run's requests whose TTFT is within ``ttft_ms`` and whose TPOT
is within ``tpot_ms``. A request with one output token has no TPOT and is judged on
TTFT alone; a request that never produced its first token misses.

Default bounds, from the surface and the stage count alone (never from a policy or the
workload), for a reference prompt of ``reference_tokens`` (``--slo-reference``, 16k):

- TTFT: ``TTFT_FACTOR`` (5) x the least time to first token of the reference prompt
  alone on an idle pipeline under any fixed chunk (``idle_ttft_ms``; the best chunk C*).
- TPOT: the whole-model time of one step that carries a decode and one C*-token chunk of
  the reference prompt at its mid-point: the decode pace of a pipeline that interleaves
  the reference prompt's best chunks with decodes.

``--slo-ttft-ms`` and ``--slo-tpot-ms`` replace either bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .ladder import ladder
from .surface import Surface, batch_ms

TTFT_FACTOR = 5.0
REFERENCE_TOKENS = 16384
GRID_TOKENS = tuple(ladder(64, 131072))  # 64 .. 128k


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float
    basis: str  # how the bounds were set, for the table and the JSON

    def to_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "basis": self.basis}


def meets(ttft_ms: float | None, tpot_ms: float | None, slo: Slo) -> bool:
    """One request: first token within the TTFT bound and (if it has a TPOT) tokens within the TPOT bound."""
    if ttft_ms is None or not math.isfinite(ttft_ms) or ttft_ms > slo.ttft_ms:
        return False
    return tpot_ms is None or tpot_ms <= slo.tpot_ms


def goodput(ttft_ms: Sequence[float | None], tpot_ms: Sequence[float | None], slo: Slo) -> float:
    """Share of requests that meet both bounds (``meets``); NaN for no requests."""
    if len(ttft_ms) != len(tpot_ms):
        raise ValueError(f"{len(ttft_ms)} TTFTs but {len(tpot_ms)} TPOTs: one of each per request")
    if not ttft_ms:
        return math.nan
    return sum(meets(a, b, slo) for a, b in zip(ttft_ms, tpot_ms, strict=True)) / len(ttft_ms)


def idle_ttft_ms(surface: Surface, prompt_tokens: int, num_stages: int, chunk_tokens: int) -> float:
    """TTFT of one prompt alone in fixed chunks: stage 0 runs the chunks back to back (sum / P), the slowest
    chunk drains the other P - 1 stages (a flow shop of equal stage shares)."""
    times, history = [], 0
    while history < prompt_tokens:
        chunk = min(chunk_tokens, prompt_tokens - history)
        times.append(surface.time_ms(chunk, history))
        history += chunk
    return sum(times) / num_stages + (num_stages - 1) * max(times) / num_stages


def best_chunk(surface: Surface, prompt_tokens: int, num_stages: int) -> tuple[int, float]:
    """(C*, its idle TTFT): the fixed chunk of ``GRID_TOKENS`` that gives the prompt its least idle TTFT."""
    candidates = [c for c in GRID_TOKENS if c < prompt_tokens] + [prompt_tokens]
    return min(((c, idle_ttft_ms(surface, prompt_tokens, num_stages, c)) for c in candidates), key=lambda x: x[1])


def default_slo(
    surface: Surface,
    num_stages: int,
    reference_tokens: int = REFERENCE_TOKENS,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
) -> Slo:
    """The bounds of the module doc; a given bound replaces its default."""
    chunk, idle_ms = best_chunk(surface, reference_tokens, num_stages)
    step_ms = batch_ms(surface, [(chunk, reference_tokens // 2), (1, reference_tokens)])
    parts = []
    if ttft_ms is None:
        ttft_ms = TTFT_FACTOR * idle_ms
        parts.append(f"TTFT {TTFT_FACTOR:g}x a {reference_tokens}-token prompt alone (best chunk {chunk})")
    if tpot_ms is None:
        tpot_ms = step_ms
        parts.append(f"TPOT a decode step next to a {chunk}-token chunk of it")
    return Slo(ttft_ms, tpot_ms, "; ".join(parts) if parts else "given")
