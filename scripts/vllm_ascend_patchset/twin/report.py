"""Figures of one run and the comparison table.

Definitions (simulated clock, milliseconds):

- TTFT: first output token applied by the engine minus arrival; mean, P50, P99 over requests.
- prefill throughput: prompt tokens computed (prefix-cache hits excluded) over the time
  from the first arrival to the last first token.
- work time: the union of [arrival, finish] over requests (some request is unfinished).
- bubble of stage s: time stage s is idle during work time, over work time. It includes
  pipeline fill and drain; ``steady bubble`` counts only idle time between the stage's
  first start and its last end (the gaps chunking can remove).
- stage-time spread: coefficient of variation (std/mean) of the per-batch stage time
  (mean over stages) over batches that carry prefill tokens.
- chunks: prefill chunks scheduled (one request's share of one batch).
- TPOT: per request with >= 2 output tokens, (last token - first token)/(tokens - 1);
  mean and P99 over requests. ITL P99: the 99th percentile of the gaps between
  consecutive output tokens, over all requests.
- goodput: the share of requests within a TTFT and a TPOT bound (twin/slo.py); the
  figures keep each request's TTFT and TPOT for it.
- vs optimum (one-prompt workloads): mean TTFT over the least TTFT any chunking of the
  prompt can reach under the twin's cost model (twin/optimum.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .pipeline import BatchRecord, RequestLog
from .slo import Slo, goodput


@dataclass(frozen=True)
class Figures:
    name: str
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    prefill_tokens_per_s: float
    bubble_per_stage: tuple[float, ...]
    steady_bubble_per_stage: tuple[float, ...]
    stage_time_cv: float
    num_chunks: int
    num_batches: int
    tpot_mean_ms: float | None
    tpot_p99_ms: float | None
    itl_p99_ms: float | None
    work_ms: float
    # End-to-end latency, arrival to last token (None while a request is unfinished): what a
    # request that decodes beside another's prefill pays for its sooner first token shows here.
    e2e_mean_ms: float | None = None
    e2e_p99_ms: float | None = None
    problems: tuple[str, ...] = ()
    request_ttft_ms: tuple[float | None, ...] = ()  # per request, in the order of the run's logs (None: no token)
    request_tpot_ms: tuple[float | None, ...] = ()  # per request (None: fewer than 2 output tokens)

    @property
    def bubble(self) -> float:
        return float(np.mean(self.bubble_per_stage)) if self.bubble_per_stage else 0.0

    @property
    def steady_bubble(self) -> float:
        return float(np.mean(self.steady_bubble_per_stage)) if self.steady_bubble_per_stage else 0.0

    def goodput(self, slo: Slo) -> float:
        """Share of the requests that met both bounds of ``slo`` (twin/slo.py)."""
        return goodput(self.request_ttft_ms, self.request_tpot_ms, slo)


def interval_union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def overlap_ms(first: Sequence[tuple[float, float]], second: Sequence[tuple[float, float]]) -> float:
    """Length of the intersection of two unions of intervals, each given sorted and disjoint (``interval_union``).

    One pass over both lists, so a run of many batches costs linear time."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        (a0, a1), (b0, b1) = first[i], second[j]
        total += max(0.0, min(a1, b1) - max(a0, b0))
        if a1 <= b1:
            i += 1
        else:
            j += 1
    return total


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else math.nan


def completeness_problems(requests: Sequence[RequestLog], max_overshoot_tokens: int = 0) -> list[str]:
    """Every request finished with all its prompt and output tokens, each computed once.

    Under asynchronous scheduling vLLM may schedule up to one decode per batch in flight
    for a request whose last token is still on its way (and drop it): allow
    ``max_overshoot_tokens`` such tokens.
    """
    problems = []
    for log in requests:
        if log.finish_ms is None:
            problems.append(f"{log.req_id}: never finished")
        if len(log.token_ms) != log.max_output_tokens:
            problems.append(f"{log.req_id}: {len(log.token_ms)} output tokens, expected {log.max_output_tokens}")
        expected = log.prompt_tokens + log.max_output_tokens - 1
        if not 0 <= log.cached_tokens + log.scheduled_tokens - expected <= max_overshoot_tokens:
            problems.append(
                f"{log.req_id}: cached {log.cached_tokens} + scheduled {log.scheduled_tokens} tokens,"
                f" expected {expected}"
            )
    return problems


def compute_figures(
    name: str,
    batches: Sequence[BatchRecord],
    requests: Sequence[RequestLog],
    num_stages: int,
    max_overshoot_tokens: int = 0,
) -> Figures:
    request_ttft = [None if log.first_token_ms is None else log.first_token_ms - log.arrival_ms for log in requests]
    request_tpot = [_tpot(log) for log in requests]
    ttft = [t for t in request_ttft if t is not None]
    work = interval_union([(log.arrival_ms, log.finish_ms) for log in requests if log.finish_ms is not None])
    work_ms = _length(work)
    run = [b for b in batches if b.stage_end_ms]
    bubbles, steady = [], []
    for stage in range(num_stages):
        busy = interval_union([(b.stage_start_ms[stage], b.stage_end_ms[stage]) for b in run])
        busy_in_work = overlap_ms(busy, work)
        idle = work_ms - busy_in_work
        bubbles.append(idle / work_ms if work_ms > 0 else 0.0)
        if busy:
            window = overlap_ms([(busy[0][0], busy[-1][1])], work)
            steady.append(max(window - busy_in_work, 0.0) / work_ms if work_ms > 0 else 0.0)
        else:
            steady.append(0.0)
    prefill_times = [float(np.mean(b.stage_ms)) for b in run if b.has_prefill]
    cv = float(np.std(prefill_times) / np.mean(prefill_times)) if len(prefill_times) > 1 else 0.0
    computed_prompt = sum(log.prompt_tokens - log.cached_tokens for log in requests)
    first_tokens = [log.first_token_ms for log in requests if log.first_token_ms is not None]
    span_ms = (max(first_tokens) - min(log.arrival_ms for log in requests)) if first_tokens else 0.0
    tpot = [t for t in request_tpot if t is not None]
    itl = [float(gap) for log in requests for gap in np.diff(log.token_ms)]
    e2e = [log.finish_ms - log.arrival_ms for log in requests if log.finish_ms is not None]
    if len(e2e) < len(requests):
        e2e = []  # a request never finished: the run has no end-to-end figure (its problems say why)
    return Figures(
        name=name,
        ttft_mean_ms=float(np.mean(ttft)) if ttft else math.nan,
        ttft_p50_ms=_percentile(ttft, 50),
        ttft_p99_ms=_percentile(ttft, 99),
        prefill_tokens_per_s=computed_prompt / span_ms * 1000.0 if span_ms > 0 else math.nan,
        bubble_per_stage=tuple(bubbles),
        steady_bubble_per_stage=tuple(steady),
        stage_time_cv=cv,
        num_chunks=sum(1 for b in run for c in b.chunks if c.is_prefill),
        num_batches=len(run),
        tpot_mean_ms=float(np.mean(tpot)) if tpot else None,
        tpot_p99_ms=_percentile(tpot, 99) if tpot else None,
        itl_p99_ms=_percentile(itl, 99) if itl else None,
        work_ms=work_ms,
        e2e_mean_ms=float(np.mean(e2e)) if e2e else None,
        e2e_p99_ms=_percentile(e2e, 99) if e2e else None,
        problems=tuple(completeness_problems(requests, max_overshoot_tokens)),
        request_ttft_ms=tuple(request_ttft),
        request_tpot_ms=tuple(request_tpot),
    )


def _tpot(log: RequestLog) -> float | None:
    """(last token - first token) / (tokens - 1); None with fewer than two tokens."""
    tokens = log.token_ms
    return (tokens[-1] - tokens[0]) / (len(tokens) - 1) if len(tokens) > 1 else None


def figures_from_result(result: dict[str, Any], num_stages: int) -> Figures:
    batches = [BatchRecord.from_json(b) for b in result["batches"]]
    requests = [RequestLog.from_json(r) for r in result["requests"]]
    overshoot = num_stages if result.get("async_scheduling") else 0
    return compute_figures(result["policy"]["name"], batches, requests, num_stages, overshoot)


def _ratio(value: float, reference: Figures | None) -> str:
    if reference is None or not reference.ttft_mean_ms or math.isnan(reference.ttft_mean_ms):
        return "-"
    return f"{value / reference.ttft_mean_ms:.3f}"


def format_table(
    title: str,
    rows: Sequence[Figures],
    tuned: Figures | None,
    upstream: Figures | None,
    show_tpot: bool,
    optimum_ms: float | None = None,
    slo: Slo | None = None,
) -> str:
    """One line per policy; ratios are mean TTFT over the reference's (< 1 is faster).

    ``optimum_ms``: the least TTFT of the case (twin/optimum.py), for a "vs optimum" column;
    ``slo``: the bounds of a "goodput %" column (with the TPOT columns).
    """
    head = ["policy", "TTFT mean s", "P50 s", "P99 s", "prefill tok/s", "bubble %", "steady %", "CV", "chunks"]
    if show_tpot:
        head += ["TPOT ms", "TPOT P99", "ITL P99", "E2E s", "E2E P99 s"] + (["goodput %"] if slo else [])
    head += ["vs tuned", "vs upstream"]
    if optimum_ms:
        head += ["vs optimum"]
    lines = []
    for f in rows:
        line = [
            f.name,
            f"{f.ttft_mean_ms / 1000:.3f}",
            f"{f.ttft_p50_ms / 1000:.3f}",
            f"{f.ttft_p99_ms / 1000:.3f}",
            f"{f.prefill_tokens_per_s:,.0f}",
            f"{100 * f.bubble:.1f}",
            f"{100 * f.steady_bubble:.1f}",
            f"{f.stage_time_cv:.3f}",
            str(f.num_chunks),
        ]
        if show_tpot:
            line += [
                "-" if value is None else f"{value:.1f}" for value in (f.tpot_mean_ms, f.tpot_p99_ms, f.itl_p99_ms)
            ]
            line += ["-" if value is None else f"{value / 1000:.3f}" for value in (f.e2e_mean_ms, f.e2e_p99_ms)]
            if slo:
                line.append(f"{100 * f.goodput(slo):.1f}")
        line += [_ratio(f.ttft_mean_ms, tuned), _ratio(f.ttft_mean_ms, upstream)]
        if optimum_ms:
            line += [f"{f.ttft_mean_ms / optimum_ms:.3f}"]
        lines.append(line)
    widths = [max(len(str(row[i])) for row in [head, *lines]) for i in range(len(head))]

    def render(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    out = [title, render(head), *(render(line) for line in lines)]
    for f in rows:
        stages = " ".join(f"{100 * b:.1f}" for b in f.bubble_per_stage)
        out.append(f"  {f.name}: bubble per stage % [{stages}], {f.num_batches} batches")
        for problem in f.problems:
            out.append(f"  {f.name}: INCOMPLETE {problem}")
    return "\n".join(out)


def all_figures(results: Sequence[dict[str, Any]], num_stages: int) -> list[Figures | None]:
    """Each result's figures (None for a policy that failed), computed once for every use."""
    return [None if "error" in result else figures_from_result(result, num_stages) for result in results]


def run_problems(
    results: Sequence[dict[str, Any]], num_stages: int, computed: Sequence[Figures | None] | None = None
) -> list[str]:
    """Why a case's figures cannot be trusted: a policy failed, ran incomplete or gave an invalid figure."""
    problems = []
    for index, result in enumerate(results):
        name = result["policy"]["name"]
        if "error" in result:
            problems.append(f"{name}: failed")
            continue
        figures = computed[index] if computed else figures_from_result(result, num_stages)
        problems += [f"{name}: incomplete: {p}" for p in figures.problems]
        problems += [f"{name}: {p}" for p in invalid_figures(figures)]
    return problems


def invalid_figures(figures: Figures) -> list[str]:
    """Figures no real run gives: times and rates must be finite and > 0, shares within [0, 1]."""
    positive = {
        "TTFT mean": figures.ttft_mean_ms,
        "TTFT P50": figures.ttft_p50_ms,
        "TTFT P99": figures.ttft_p99_ms,
        "prefill tok/s": figures.prefill_tokens_per_s,
        "work time": figures.work_ms,
    }
    bad = [f"{label} is {value}" for label, value in positive.items() if not (math.isfinite(value) and value > 0)]
    shares = figures.bubble_per_stage + figures.steady_bubble_per_stage
    if not all(0 <= b <= 1 for b in shares):
        bad.append(f"a bubble share is outside [0, 1]: {shares}")
    if not (math.isfinite(figures.stage_time_cv) and figures.stage_time_cv >= 0):
        bad.append(f"stage-time CV is {figures.stage_time_cv}")
    for label, value in (("TPOT mean", figures.tpot_mean_ms), ("TPOT P99", figures.tpot_p99_ms)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            bad.append(f"{label} is {value}")
    return bad
