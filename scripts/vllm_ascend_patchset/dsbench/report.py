"""The dual-stream bench's figures: ratios of forwards measured side by side, and where the time goes.

Per link preset, batch and split strategy, from ``repeats`` rounds (each round runs the
batch single-stream and dual-stream back to back; a forward's time is the slower rank's).
Other jobs on the host only ever slow a forward down, so each figure comes from the
fastest single-stream and the fastest dual-stream forward:

- ``dual/single``: their ratio, with the least and largest ratio of one round's pair;
- ``comm`` f: the share of single-stream time the compute thread was blocked on the link;
  compute = single - comm;
- ``limit``: max(f, 1 - f), what perfect overlap of two micro-batches approaches;
- ``eff``: overlap efficiency, time saved / min(compute, comm).

Where the time goes (shares of single-stream time), the shortfall from the ideal saving
min(compute, comm) is exactly ``compute+`` plus ``embed`` plus ``waits``:

- ``compute+``: dual-stream compute minus single-stream compute; of it ``split``
  (cutting metadata and tokens, entering each micro-batch's context) and ``merge`` (the
  final concatenation), measured on their own, ``half+sched`` (the half-size matmuls and
  the schedule itself, from the runs without any communication, less split and merge)
  and ``host`` (the rest: CPU the link's gloo work takes from compute while the other
  micro-batch runs, and whatever else the host's load did to these runs);
- ``embed``: the embedding's all-reduce, full size and synchronous before the batch is
  split (the embedding module reduces its own output), so dual stream cannot hide it: one
  of the 13 all-reduces of this model's forward, one of 129 in Qwen3-32B's;
- ``waits``: the other event waits beyond the unavoidable max(0, comm - compute), where
  the compute thread idles for a micro-batch's all-reduce (the last half-layer's, an
  uneven split, a peer rank running late);
- ``+alpha``: the extra per-message latency of twice the messages (included in the
  waits wherever it is exposed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

GOAL_EFFICIENCY = 0.80
GOAL_SLOWDOWN = 1.02


def combine_ranks(results: Sequence[dict]) -> dict:
    """(preset, case, mode, rep) -> the record of the slower rank."""
    combined: dict = {}
    for result in results:
        for record in result["records"]:
            key = (record["preset"], record["case"], record["mode"], record["rep"])
            if key not in combined or record["elapsed"] > combined[key]["elapsed"]:
                combined[key] = record
    return combined


def figures(results: Sequence[dict], preset: str, case: str, mode: str, alpha_s: float) -> dict:
    """The figures of one dual mode of one batch under one preset (see the module docstring).

    Other jobs on the host only ever slow a forward down, so the figures come from the
    fastest single-stream and the fastest dual-stream forward of the rounds (each with its
    own split of compute and link time); the spread is that of the rounds' own ratios,
    each round's two forwards run back to back.
    """
    records = combine_ranks(results)
    reps = sorted(r for p, c, m, r in records if (p, c, m) == (preset, case, mode))
    single = min((records[(preset, case, "single", r)] for r in reps), key=lambda x: x["elapsed"])
    dual = min((records[(preset, case, mode, r)] for r in reps), key=lambda x: x["elapsed"])
    ratios = [records[(preset, case, mode, r)]["elapsed"] / records[(preset, case, "single", r)]["elapsed"]
              for r in reps]  # fmt: skip
    split_merge = max((r.get("split_merge", {}).get(case, {}) for r in results), key=lambda v: sum(v.values()))
    figures = _figures(single, dual, split_merge, _compute_only_overhead(records, case, mode), alpha_s)
    figures.update(ratio_min=min(ratios), ratio_max=max(ratios))
    return figures


def _figures(single: dict, dual: dict, split_merge: dict, overhead: float | None, alpha_s: float) -> dict:
    s_time, comm = single["elapsed"], single["blocked"]
    d_time, waits = dual["elapsed"], dual["blocked"]
    compute, d_compute = s_time - comm, d_time - waits
    ideal = min(compute, comm)
    split, merge = split_merge.get("split", 0.0), split_merge.get("merge", 0.0)
    half_sched = overhead * compute - split - merge if overhead is not None else float("nan")
    return {
        "single_ms": s_time * 1e3,
        "dual_ms": d_time * 1e3,
        "ratio": d_time / s_time,
        "comm_share": comm / s_time,
        "limit": max(comm, compute) / s_time,
        "efficiency": (s_time - d_time) / ideal if ideal > 0 else float("nan"),
        "compute_plus": (d_compute - compute) / s_time,
        "split": split / s_time,
        "merge": merge / s_time,
        "half_sched": half_sched / s_time,
        "host": (d_compute - compute - split - merge - (0.0 if overhead is None else half_sched)) / s_time,
        "embed": dual.get("blocked_group", 0.0) / s_time,
        "waits": (waits - dual.get("blocked_group", 0.0) - max(0.0, comm - compute)) / s_time,
        "alpha_extra": (dual["messages"] - single["messages"]) * alpha_s / s_time,
        # the goal's condition: a micro-batch's communication (half the messages) at most its compute
        "comm_within_compute": 0 < dual["wire"] <= d_compute,
    }


def _compute_only_overhead(records: dict, case: str, mode: str) -> float | None:
    """Dual over single compute without any communication (fastest of each), as a share of single's:
    split, merge, the half-size matmuls and the schedule."""
    reps = sorted(r for p, c, m, r in records if (p, c, m) == ("compute", case, mode))
    if not reps:
        return None
    dual = min(records[("compute", case, mode, r)]["elapsed"] for r in reps)
    return dual / min(records[("compute", case, "single", r)]["elapsed"] for r in reps) - 1.0


def _pct(value: float) -> str:
    return "   n/a" if value != value else f"{value * 100:5.1f}%"


def preset_table(results: Sequence[dict], preset: str, cases: Sequence, gate: dict) -> tuple[str, list]:
    """The figures table and the where-the-time-goes table of one preset; and the goal's failures."""
    info = results[0]["presets"][preset]
    alpha = info["alpha_s"]
    header = (
        f"{'batch':<16}{'tokens':>7} {'split':<15}{'single ms':>10}{'dual ms':>9}  {'dual/single [min, max]':<24}"
        f"{'comm':>6}{'limit':>7}{'eff':>7}  gate"
    )
    where = (
        f"{'batch':<16} {'split':<15}{'shortfall':>10}{'compute+':>9}{'split':>7}{'merge':>7}{'half+sched':>11}"
        f"{'host':>7}{'embed':>7}{'waits':>8}{'+alpha':>8}"
    )
    rows, where_rows, failures = [header], [where], []
    decisions = gate.get("decisions", {})
    for case in cases:
        if not case.timed:
            reasons = {decisions.get(f"{case.name}|{s}", "?") for s in ("half_batch", "token_balanced")}
            rows.append(f"{case.name:<16}{case.tokens:>7} {'-':<15}{'not timed: ' + '; '.join(sorted(reasons))}")
            continue
        modes = results[0]["modes"][case.name][1:]  # after "single": one per distinct split
        for mode in modes:
            strategy = mode.split(":")[1]
            shared = [m.split(":")[1] for m in modes]
            label = "both" if len(shared) == 1 else strategy
            f = figures(results, preset, case.name, mode, alpha)
            strategies = ("half_batch", "token_balanced") if label == "both" else (strategy,)
            verdicts = {decisions.get(f"{case.name}|{s}", "?") for s in strategies}
            verdict = "/".join(sorted(verdicts))
            spread = f"{f['ratio']:.3f} [{f['ratio_min']:.3f}, {f['ratio_max']:.3f}]"
            rows.append(
                f"{case.name:<16}{case.tokens:>7} {label:<15}{f['single_ms']:>10.1f}{f['dual_ms']:>9.1f}  {spread:<24}"
                f"{_pct(f['comm_share'])}{_pct(f['limit']):>7}{_pct(f['efficiency']):>7}  {verdict}"
            )
            shortfall = f["compute_plus"] + f["embed"] + f["waits"]
            where_rows.append(
                f"{case.name:<16} {label:<15}{_pct(shortfall):>10}{_pct(f['compute_plus']):>9}{_pct(f['split']):>7}"
                f"{_pct(f['merge']):>7}{_pct(f['half_sched']):>11}{_pct(f['host']):>7}{_pct(f['embed']):>7}"
                f"{_pct(f['waits']):>8}"
                f"{_pct(f['alpha_extra']):>8}"
            )
            if info["beta"] and f["comm_within_compute"] and not f["efficiency"] >= GOAL_EFFICIENCY:
                failures.append(f"{preset} {case.name} {label}: efficiency {_pct(f['efficiency']).strip()} < 80%")
            if "dual" in verdicts and f["ratio"] > GOAL_SLOWDOWN:
                failures.append(f"{preset} {case.name} {label}: the gate lets it through at {f['ratio']:.3f}")
    return "\n".join(rows) + "\n\nwhere the time goes (share of single-stream time):\n" + "\n".join(
        where_rows
    ), failures


def gate_line(gate: dict) -> str:
    if "error" in gate:
        return f"measured gate: {gate['error']}"
    return (
        f"measured gate ({gate['probes']} probes, {gate['probe_extra_s']:.1f} s of dual-stream runs added to "
        f"{gate['probe_wall_s']:.1f} s of probe traffic): {gate['describe']}"
    )


def link_line(preset: str, info: dict, share: float | None, reference: str) -> str:
    if not info["beta"] and not info["alpha_s"]:
        return f"link {preset}: the bare machine (gloo over loopback, no emulated delay)"
    target = f", comm about {share:.0%} of single stream at {reference}" if share else ""
    beta = f"{info['beta'] / 1e6:.1f} MB/s" if info["beta"] else "infinite"
    moved = {"token": "gloo all-reduces one element per message", "real": "gloo all-reduces the payload too"}
    return f"link {preset}: alpha {info['alpha_s'] * 1e6:.0f} us, beta {beta}{target}; {moved[info['data']]}"


def by_preset(results: Sequence[dict]) -> dict:
    grouped: dict = defaultdict(list)
    for record in results[0]["records"]:
        grouped[record["preset"]].append(record)
    return grouped
