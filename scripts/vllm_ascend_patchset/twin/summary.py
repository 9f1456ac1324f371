"""One table of serving figures over many cases, from the twin's ``--json`` files.

    python -m vllm_ascend_patchset.twin.summary build/bench/traces-*.json

A markdown row per case (surface, workload, load, P) with, for each policy, TTFT mean
and P99 (s), TPOT P99 (ms), end-to-end latency mean and P99 (s, arrival to last token)
and goodput (%, under the case's SLO); then, per surface, each policy's mean goodput and
the geometric means of its mean TTFT and of its mean end-to-end latency over tuned fixed's.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POLICIES = (
    ("vllm-fixed", "vLLM fixed"),
    ("tuned-fixed", "tuned fixed"),
    ("upstream-cpp", "upstream"),
    ("ours", "ours"),
)


def _policy(name: str) -> str | None:
    return next((key for key, _ in POLICIES if name == key or name.startswith(f"{key}-")), None)


def _cells(row: dict[str, Any] | None) -> list[str]:
    if row is None:
        return ["-", "-", "-", "-"]
    tpot = row.get("tpot_p99_ms")
    goodput = row.get("goodput")
    e2e = row.get("e2e_mean_ms"), row.get("e2e_p99_ms")
    return [
        f"{row['ttft_mean_ms'] / 1000:.2f} / {row['ttft_p99_ms'] / 1000:.2f}",
        "-" if tpot is None else f"{tpot:.0f}",
        "-" if not all(map(_positive, e2e)) else f"{e2e[0] / 1000:.2f} / {e2e[1] / 1000:.2f}",
        "-" if goodput is None else f"{100 * goodput:.0f}",
    ]


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _case_problem(case: Any) -> str | None:
    """What makes ``case`` no case of a cpp-twin ``--json`` file, or None."""
    if not isinstance(case, dict):
        return "a case is not an object"
    if not isinstance(case.get("workload"), str) or not isinstance(case.get("stages"), int):
        return "a case lacks its workload or stages"
    rows = case.get("rows")
    if not isinstance(rows, list) or not rows:
        return f"case {case['workload']!r} has no rows"
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            return f"case {case['workload']!r}: a row without a policy name"
        if not (_positive(row.get("ttft_mean_ms")) and _positive(row.get("ttft_p99_ms"))):
            return f"case {case['workload']!r}, {row['name']}: TTFT mean and P99 must be positive numbers"
    return None


def load_cases(paths: Sequence[Path]) -> list[dict[str, Any]]:
    cases = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a cpp-twin --json file ({exc})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: not a cpp-twin --json file (expected a list of cases)")
        problem = next((why for why in map(_case_problem, data) if why), None)
        if problem:
            raise ValueError(f"{path}: not a cpp-twin --json file ({problem})")
        cases += [{**case, "surface": case.get("surface") or path.stem} for case in data]
    return cases


def summary_table(cases: Sequence[dict[str, Any]]) -> str:
    head = ["surface", "workload", "load", "P", "tuned C"]
    for _, label in POLICIES:
        head += [f"{label} TTFT mean / P99 s", "TPOT P99 ms", "E2E mean / P99 s", "goodput %"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    totals: dict[tuple[str, str], list[tuple[float, float | None, float | None]]] = {}
    counts: dict[str, int] = {}
    for case in cases:
        rows = {_policy(r["name"]): r for r in case["rows"]}
        workload, _, load = case["workload"].rpartition("-load")
        if not workload:
            workload, load = case["workload"], "-"
        tuned = rows.get("tuned-fixed")
        cells = [Path(case["surface"]).name, workload, load, str(case["stages"])]
        counts[cells[0]] = counts.get(cells[0], 0) + 1
        cells.append(tuned["name"].rsplit("-", 1)[-1] if tuned else "-")
        for key, _ in POLICIES:
            cells += _cells(rows.get(key))
            row = rows.get(key)
            if row is not None and tuned is not None:
                ratio = row["ttft_mean_ms"] / tuned["ttft_mean_ms"]
                e2e = row.get("e2e_mean_ms"), tuned.get("e2e_mean_ms")
                e2e_ratio = e2e[0] / e2e[1] if all(map(_positive, e2e)) else None
                totals.setdefault((cells[0], key), []).append((ratio, row.get("goodput"), e2e_ratio))
        lines.append("| " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""]
    for surface, count in counts.items():
        parts = []
        for key, label in POLICIES:
            values = totals.get((surface, key))
            if not values:
                continue
            ratio = _geomean([r for r, _, _ in values])
            e2e_ratios = [e for _, _, e in values if e is not None]
            e2e = f", E2E x{_geomean(e2e_ratios):.3f}" if len(e2e_ratios) == len(values) else ""
            goodputs = [g for _, g, _ in values if g is not None]
            mean_goodput = f", mean goodput {100 * sum(goodputs) / len(goodputs):.1f}%" if goodputs else ""
            parts.append(f"{label}: TTFT x{ratio:.3f}{e2e} of tuned{mean_goodput}")
        out.append(f"{surface} ({count} cases): " + ("; ".join(parts) or "no tuned fixed to compare with"))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m vllm_ascend_patchset.twin.summary FILE.json [FILE.json ...] (cpp-twin --json files)"
    if any(a in ("-h", "--help") for a in args):
        print(usage)
        return 0
    paths = [Path(p) for p in args]
    if not paths:
        print(usage, file=sys.stderr)
        return 2
    try:
        print(summary_table(load_cases(paths)))
    except ValueError as exc:
        print(f"summary: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
