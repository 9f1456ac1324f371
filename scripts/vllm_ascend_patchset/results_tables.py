"""The tables of docs/results.md, rendered from saved bench outputs, and the figures the docs quote from them.

``scripts/bench/results.py`` runs the benches, saves their outputs and rewrites the page; this
module turns one saved output into markdown lines, and gives the figures (a case's rows, a
trace summary, a recorded table's cells) that ``tests/test_doc_numbers.py`` checks the README and
the docs against. It reads JSON only: no vLLM, no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TRACE = "tests/data/traces/mooncake.jsonl"
TPOT_TAIL = 1.10  # a TPOT P99 over this many times tuned fixed's is counted as a tail case


def policy(case: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The row of ``case`` whose policy name is ``prefix`` or starts with ``prefix-``."""
    for row in case["rows"]:
        if row["name"] == prefix or row["name"].startswith(f"{prefix}-"):
            return row
    raise KeyError(f"{case['workload']}: no {prefix} row")


def case_of(saved: dict[str, Any], workload: str, stages: int) -> dict[str, Any]:
    for case in saved["output"]:
        if case["workload"] == workload and case["stages"] == stages:
            return case
    raise KeyError(f"{saved['name']}: no case {workload} at P = {stages}")


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def surface_of(case: dict[str, Any]) -> str:
    """``cpu_surface`` for tests/data/cpu_surface.csv, ``synthetic`` for synthetic: how the tables name a surface."""
    return Path(case["surface"]).stem


def trace_summary(saved: dict[str, Any], surface: str | None = None) -> dict[str, float]:
    """Ours against tuned fixed over the cases of ``surface`` (all with None): the figures the README and docs state."""
    ttft, e2e, tpot, ours_goodput, tuned_goodput = [], [], [], [], []
    for case in saved["output"]:
        if surface is not None and surface_of(case) != surface:
            continue
        ours, tuned = policy(case, "ours"), policy(case, "tuned-fixed")
        ttft.append(ours["ttft_mean_ms"] / tuned["ttft_mean_ms"])
        e2e.append(ours["e2e_mean_ms"] / tuned["e2e_mean_ms"])
        tpot.append(ours["tpot_p99_ms"] / tuned["tpot_p99_ms"])
        ours_goodput.append(ours["goodput"])
        tuned_goodput.append(tuned["goodput"])
    if not ttft:
        raise KeyError(f"no case on {surface}")
    return {
        "cases": len(ttft),
        "ttft": geomean(ttft),
        "e2e": geomean(e2e),
        "goodput": 100 * sum(ours_goodput) / len(ours_goodput),
        "tuned_goodput": 100 * sum(tuned_goodput) / len(tuned_goodput),
        "tpot_tail_cases": sum(r > TPOT_TAIL for r in tpot),
        "tpot_worst": max(tpot),
    }


def table_rows(saved: dict[str, Any], index: int = 0) -> list[dict[str, str]]:
    """A recorded table's rows as {column: cell}."""
    table = saved["output"]["tables"][index]
    return [dict(zip(table["head"], row, strict=True)) for row in table["rows"]]


# ----------------------------------------------------------------------------- rendering


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f}"


def _markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def render_long(saved: dict[str, Any]) -> list[str]:
    head = ["surface", "prompt", "P", "vLLM fixed s", "tuned fixed s", "upstream CPP s", "ours s", "optimum s"]
    head += ["ours / tuned", "ours / upstream", "ours / optimum"]
    rows = []
    for case in saved["output"]:
        ours, tuned, up = policy(case, "ours"), policy(case, "tuned-fixed"), policy(case, "upstream-cpp")
        fixed = policy(case, "vllm-fixed")
        best = case["optimum"]["best_ms"]
        rows.append([
            surface_of(case), case["workload"].removeprefix("long-"), str(case["stages"]),
            f"{_s(fixed['ttft_mean_ms'])} ({fixed['name'].rsplit('-', 1)[1]})",
            f"{_s(tuned['ttft_mean_ms'])} ({tuned['name'].rsplit('-', 1)[1]})",
            _s(up["ttft_mean_ms"]), _s(ours["ttft_mean_ms"]), _s(best),
            f"{ours['ttft_mean_ms'] / tuned['ttft_mean_ms']:.3f}", f"{ours['ttft_mean_ms'] / up['ttft_mean_ms']:.3f}",
            f"{ours['ttft_mean_ms'] / best:.3f}",
        ])  # fmt: skip
    return _markdown(head, rows)


def render_serving(saved: dict[str, Any]) -> list[str]:
    """Cases with decodes (mixed, trace), one row a workload and P, the surfaces side by side: ours over tuned fixed."""
    surfaces = list(dict.fromkeys(surface_of(case) for case in saved["output"]))
    head = ["workload", "P"]
    for surface in surfaces:
        head += [f"{surface}: tuned C", "ours/tuned TTFT mean", "TPOT P99", "E2E mean", "goodput % ours / tuned"]
    rows: dict[tuple[str, int], list[str]] = {}
    for case in saved["output"]:
        ours, tuned = policy(case, "ours"), policy(case, "tuned-fixed")
        workload = re.sub(r"-s(\d+)-n(\d+)", r"@\1:\2", case["workload"]).replace("-load", ", load ")
        rows.setdefault((workload, case["stages"]), [workload, str(case["stages"])]).extend([
            tuned["name"].rsplit("-", 1)[1], f"{ours['ttft_mean_ms'] / tuned['ttft_mean_ms']:.3f}",
            f"{ours['tpot_p99_ms'] / tuned['tpot_p99_ms']:.2f}", f"{ours['e2e_mean_ms'] / tuned['e2e_mean_ms']:.3f}",
            f"{100 * ours['goodput']:.0f} / {100 * tuned['goodput']:.0f}",
        ])  # fmt: skip
    lines = _markdown(head, list(rows.values()))
    for surface in surfaces if len(rows) > 1 else ():
        s = trace_summary(saved, surface)
        lines += [
            "",
            f"{surface}, {s['cases']} cases: ours' mean TTFT {s['ttft']:.3f} of tuned fixed's and mean E2E "
            f"{s['e2e']:.3f} (geometric means), goodput {s['goodput']:.1f}% against {s['tuned_goodput']:.1f}%, "
            f"TPOT P99 over {TPOT_TAIL:.2f}x tuned fixed's in {s['tpot_tail_cases']} of them "
            f"(worst {s['tpot_worst']:.3f}x).",
        ]
    return lines


def render_recorded(saved: dict[str, Any]) -> list[str]:
    output = saved["output"]
    if "stdout" in output:
        return ["```", *output["stdout"].rstrip("\n").splitlines(), "```"]
    lines: list[str] = []
    for table in output["tables"]:
        if lines:
            lines.append("")
        if table.get("caption"):
            lines += [table["caption"], ""]
        lines += _markdown(table["head"], table["rows"])
    for note in output.get("notes", []):
        lines += ["", note]
    return lines


def render_mixed(saved: dict[str, Any]) -> list[str]:
    """cpp_mixed.py's closing lines (per surface and base) as one row a surface, one column a base."""
    if "tables" in saved["output"]:  # recorded by hand before the bench was run for this page
        return render_recorded(saved)
    lines = saved["output"]["stdout"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("per surface and base"))
    cells: dict[str, dict[str, str]] = {}
    goodput = []
    for line in lines[start + 1 :]:
        spec, base, mean, worst, tpot, ours, tuned = line.split()
        cells.setdefault(spec, {})[base] = f"{mean}, {worst} / {tpot}"
        goodput.append((float(ours), float(tuned)))
    bases = list(dict.fromkeys(base for row in cells.values() for base in row))
    head = ["surface", *(f"base {b}: TTFT mean, max / TPOT P99 max" if i == 0 else b for i, b in enumerate(bases))]
    rows = [[spec, *(row.get(b, "-") for b in bases)] for spec, row in cells.items()]
    ours = sum(g[0] for g in goodput) / len(goodput)
    tuned = sum(g[1] for g in goodput) / len(goodput)
    note = f"Over all {len(goodput)} cells ours' goodput averages {ours:.1f}% against the tuned chunk's {tuned:.1f}%."
    return [*_markdown(head, rows), "", note]


def render_closing(marker: str) -> Callable[[dict[str, Any]], list[str]]:
    """A bench's printed output from its closing table, the line that starts with ``marker``, on."""

    def render(saved: dict[str, Any]) -> list[str]:
        if "tables" in saved["output"]:  # recorded by hand before the bench was run for this page
            return render_recorded(saved)
        lines = saved["output"]["stdout"].splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(marker))
        return ["```", *lines[start:], "```"]

    return render


def render_gate(saved: dict[str, Any]) -> list[str]:
    """cpp_surfaces.py's rows summed up per surface: the worst case of each ratio, and its verdict line."""
    if "tables" in saved["output"]:  # recorded by hand before the bench was run for this page
        return render_recorded(saved)
    worst: dict[str, list[float]] = {}
    lines = saved["output"]["stdout"].splitlines()
    for line in lines[1:]:
        cells = line.split()
        if len(cells) == 8 and cells[1].isdigit():
            ratios = [float(c) for c in cells[4:]]
            old = worst.setdefault(cells[0], [0.0, 0.0, 0.0, 0.0, 0])
            worst[cells[0]] = [*(max(a, b) for a, b in zip(old[:4], ratios, strict=True)), old[4] + 1]
    head = ["surface", "cases", "ours / optimum, worst", "/ engine's optimum", "/ best fixed", "/ upstream"]
    rows = [[name, str(w[4]), *(f"{v:.4f}" for v in w[:4])] for name, w in worst.items()]
    verdict = next(line for line in lines if "case(s) miss" in line)
    return [*_markdown(head, rows), "", f"`{verdict.strip()}`"]


def render_pace(saved: dict[str, Any]) -> list[str]:
    """cpp_pace.py's summaries (one a command): per surface with no target, then each target's misses."""
    keep = [
        line
        for line in saved["output"]["stdout"].splitlines()
        if line.startswith("summary:")
        or ": no target, geometric means" in line
        or (line.startswith("target ") and "cases; misses" in line)
    ]
    return ["```", *keep, "```"]
