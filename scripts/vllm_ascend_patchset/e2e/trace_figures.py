"""Serving figures of a replayed trace, real or twin, and the goals they are judged against (docs/e2e.md).

Pure functions over per-request times (milliseconds, keyed by request id), so the real
engine's replay and the twin's prediction of it go through the very same definitions,
the twin's own (``twin/report.py``, ``twin/slo.py``):

- TTFT: first token minus arrival; mean, P50, P99 over requests (a request with no
  first token counts in none of them, and misses the goodput).
- TPOT: per request with two tokens or more, (last token - first token) / (tokens - 1);
  mean and P99 over requests.
- goodput: the share of requests within both bounds of the ``Slo`` (``slo.goodput``).

The goals compare ours with the best fixed chunk that ran (by real mean TTFT; with a TPOT
target, the SLO-tuned one: the least mean TTFT of those whose TPOT P99 meets the target),
paired request by request: every policy served the same requests at the same arrivals, so the
per-request differences carry the comparison's noise, not the spread of prompt sizes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..twin.slo import Slo, goodput

FIDELITY_GOAL = 0.05  # twin/real mean TTFT within 1 +/- this
TPOT_P99_GOAL = 1.10  # ours' TPOT P99 at most this times the best fixed chunk's
TARGET_GOAL = 1.10  # with a TPOT target, ours' TPOT P99 at most this times it (the host's noise)
STANDARD_ERRORS = 2.0  # ours' mean TTFT may lie behind the best fixed chunk's by at most this many s.e.

RequestTimes = Mapping[str, "float | None"]


@dataclass(frozen=True)
class Serving:
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_mean_ms: float | None
    tpot_p99_ms: float | None
    goodput: float  # share of requests, 0..1
    answered: int  # requests that got their first token
    requests: int


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else math.nan


def serving(ttft_ms: RequestTimes, tpot_ms: RequestTimes, slo: Slo) -> Serving:
    """The figures of one policy's run from each request's TTFT and TPOT (None: no first token / no TPOT)."""
    ids = list(ttft_ms)
    ttft = [ttft_ms[r] for r in ids if ttft_ms[r] is not None]
    tpot = [tpot_ms.get(r) for r in ids if tpot_ms.get(r) is not None]
    return Serving(
        ttft_mean_s=statistics.fmean(ttft) / 1000.0 if ttft else math.nan,
        ttft_p50_s=_percentile(ttft, 50) / 1000.0,
        ttft_p99_s=_percentile(ttft, 99) / 1000.0,
        tpot_mean_ms=statistics.fmean(tpot) if tpot else None,
        tpot_p99_ms=_percentile(tpot, 99) if tpot else None,
        goodput=goodput([ttft_ms[r] for r in ids], [tpot_ms.get(r) for r in ids], slo),
        answered=len(ttft),
        requests=len(ids),
    )


def tpot_ms(token_times_s: Sequence[float]) -> float | None:
    """(last token - first token) / (tokens - 1), in ms; None with fewer than two tokens."""
    if len(token_times_s) < 2:
        return None
    return (token_times_s[-1] - token_times_s[0]) / (len(token_times_s) - 1) * 1000.0


@dataclass(frozen=True)
class Paired:
    ratio: float  # mean TTFT of a over b's, over the requests both answered
    two_se: float  # STANDARD_ERRORS standard errors of that ratio, from the per-request differences
    requests: int

    @property
    def behind_beyond_noise(self) -> bool:
        """a's mean lies above b's by more than ``two_se``."""
        return self.ratio - 1.0 > self.two_se


def paired_ratio(a: RequestTimes, b: RequestTimes) -> Paired:
    """mean(a) / mean(b) over the requests both answered, with STANDARD_ERRORS s.e. of the mean paired difference
    (a_i - b_i) over mean(b): the same requests, so what differs is the policy (and the noise)."""
    ids = [r for r in a if a[r] is not None and b.get(r) is not None]
    if not ids:
        return Paired(math.nan, math.nan, 0)
    base = statistics.fmean(b[r] for r in ids)
    diffs = [a[r] - b[r] for r in ids]
    se = statistics.stdev(diffs) / math.sqrt(len(ids)) if len(ids) > 1 else math.inf
    return Paired(statistics.fmean(a[r] for r in ids) / base, STANDARD_ERRORS * se / base, len(ids))


def ranking(means: Mapping[str, float], names: Sequence[str]) -> list[str]:
    """``names`` ordered by their mean TTFT in ``means``, fastest first (names without a figure left out)."""
    known = [n for n in names if n in means and math.isfinite(means[n])]
    return sorted(known, key=lambda n: means[n])


@dataclass(frozen=True)
class Goal:
    what: str
    value: str
    met: bool


def goals(
    real: Mapping[str, Serving],
    twin: Mapping[str, Serving],
    real_ttft_ms: Mapping[str, RequestTimes],
    best_fixed: str | None,
    upstream: str | None,
    ours: str = "ours",
    target_tpot_ms: float | None = None,
) -> list[Goal]:
    """The replay's goals (module doc), each with its measured value; a goal whose policies did not run is left out."""
    out = []
    for name in real:
        if name in twin and math.isfinite(real[name].ttft_mean_s) and real[name].ttft_mean_s > 0:
            fidelity = twin[name].ttft_mean_s / real[name].ttft_mean_s
            met = abs(fidelity - 1.0) <= FIDELITY_GOAL
            out.append(Goal(f"{name}: twin/real mean TTFT within 1 +/- {FIDELITY_GOAL:g}", f"{fidelity:.3f}", met))
    three = [n for n in (ours, best_fixed, upstream) if n and n in real]
    real_order = ranking({n: real[n].ttft_mean_s for n in three}, three)
    twin_order = ranking({n: twin[n].ttft_mean_s for n in three if n in twin}, three)
    if len(three) > 1 and twin_order:
        orders = f"real {' < '.join(real_order)}, twin {' < '.join(twin_order)}"
        out.append(Goal("the twin ranks the policies as the engine does", orders, real_order == twin_order))
    if best_fixed and ours in real and best_fixed in real:
        paired = paired_ratio(real_ttft_ms[ours], real_ttft_ms[best_fixed])
        out.append(
            Goal(
                f"ours' mean TTFT not behind {best_fixed}'s beyond {STANDARD_ERRORS:g} s.e.",
                f"{paired.ratio:.3f} +/- {paired.two_se:.3f} over {paired.requests} requests",
                not paired.behind_beyond_noise,
            )
        )
        ours_p99, fixed_p99 = real[ours].tpot_p99_ms, real[best_fixed].tpot_p99_ms
        if ours_p99 is not None and target_tpot_ms is not None:  # the pace ours was asked to keep
            ratio = ours_p99 / target_tpot_ms
            what = f"ours' TPOT P99 <= {TARGET_GOAL:g}x its target {target_tpot_ms:g} ms (host noise)"
            out.append(Goal(what, f"{ratio:.3f} ({ours_p99:.1f} ms)", ratio <= TARGET_GOAL))
        elif ours_p99 is not None and fixed_p99:
            ratio = ours_p99 / fixed_p99
            what = f"ours' TPOT P99 <= {TPOT_P99_GOAL:g}x {best_fixed}'s"
            out.append(Goal(what, f"{ratio:.3f}", ratio <= TPOT_P99_GOAL))
    return out


def format_table(
    real: Mapping[str, Serving], twin: Mapping[str, Serving], loads: Mapping[str, float], slo: Slo
) -> list[str]:
    """One line per policy that ran: the real figures, the machine's load, and the twin's beside them."""

    def num(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
        return "-" if value is None or not math.isfinite(value) else f"{value * scale:.{digits}f}"

    head = ["policy", "TTFT mean s", "P50 s", "P99 s", "TPOT ms", "TPOT P99", "goodput %", "load"]
    head += ["twin TTFT s", "twin/real", "twin P99 s", "twin TPOT P99", "twin goodput %"]
    rows = []
    for name, f in real.items():
        t = twin.get(name)
        fidelity = t.ttft_mean_s / f.ttft_mean_s if t and f.ttft_mean_s else None
        rows.append(
            [name, num(f.ttft_mean_s), num(f.ttft_p50_s), num(f.ttft_p99_s), num(f.tpot_mean_ms, digits=1)]
            + [num(f.tpot_p99_ms, digits=1), num(f.goodput, 100, 1), num(loads.get(name), digits=1)]
            + [num(t.ttft_mean_s) if t else "-", num(fidelity), num(t.ttft_p99_s) if t else "-"]
            + [num(t.tpot_p99_ms, digits=1) if t else "-", num(t.goodput, 100, 1) if t else "-"]
        )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [head, *rows]]  # fmt: skip
    lines.append(f"  SLO: TTFT <= {slo.ttft_ms / 1000:.2f} s, TPOT <= {slo.tpot_ms:.0f} ms ({slo.basis})")
    return lines
