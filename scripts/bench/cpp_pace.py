#!/usr/bin/env python3
"""CPP's decode pace judged as users judge serving: ours against the fixed chunk a user would tune by hand.

For each surface, base chunk, workload (mixed traffic per seed, or trace slices per load)
and pipeline depth, the twin runs every fixed chunk of a 1-1.5-2 sweep (64 up to the base
chunk) once, and ours once per TPOT target of ``--targets``:

- ``none``: no target (CPP's default). The comparator is the tuned fixed chunk (the least
  mean TTFT of the sweep); goodput is judged at the twin's default bounds (twin/slo.py).
- ``K`` (a number): a target of K times the pipeline's decode-only round (the whole-model
  time of a step with one decode at the reference prompt's length: one token every round);
  ``slo``: the twin's default TPOT bound. Ours gets the target as ``target_tpot_ms``, and
  the comparator is the SLO-tuned fixed chunk: the least mean TTFT among the chunks whose
  TPOT P99 is within the target, else the least TPOT P99. Goodput is judged with the
  target as the TPOT bound.

Per case it prints ours over the comparator: mean TTFT, mean and P99 end-to-end latency
(arrival to last token), TPOT P99 (and the target), goodput of ours, the comparator and
the best fixed chunk; then per target, the cases that miss each goal:

- none: mean E2E <= 1.02x, E2E P99 <= 1.05x, mean TTFT <= 1.05x (geometric means <= 0.95x
  and <= 0.85x), goodput no more than 2 points below the comparator's;
- a target: TPOT P99 within the target where the comparator meets it (else within its
  TPOT P99), mean TTFT <= 1.02x, goodput >= every fixed chunk's minus 2 points.

It asserts nothing; ``--json FILE`` writes every case's figures.

    PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_pace.py [--surfaces a,b] [--bases 4096] \\
        [--workloads mixed] [--seeds 0,1,2,3,4] [--loads 0.5,0.8] [--stages 4] [--targets none,2,4,slo]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import ROOT  # noqa: E402
from vllm_ascend_patchset.twin import policies as pol  # noqa: E402
from vllm_ascend_patchset.twin.command import check_writable, slo_tuned_fixed  # noqa: E402
from vllm_ascend_patchset.twin.options import (  # noqa: E402
    BLOCK_TOKENS,
    LONGEST_REQUEST_TOKENS,
    parse_chunks,
    parse_loads,
    parse_seeds,
    parse_stages,
    parse_trace_item,
)
from vllm_ascend_patchset.twin.report import figures_from_result  # noqa: E402
from vllm_ascend_patchset.twin.slo import REFERENCE_TOKENS, Slo, default_slo  # noqa: E402
from vllm_ascend_patchset.twin.surface import batch_ms  # noqa: E402
from vllm_ascend_patchset.twin.surface_files import load_surface  # noqa: E402
from vllm_ascend_patchset.twin.traces import (
    read_slice,  # noqa: E402
    trace_workload,  # noqa: E402
)
from vllm_ascend_patchset.twin.workloads import mixed  # noqa: E402

GOALS = {"e2e": 1.02, "e2e_p99": 1.05, "ttft": 1.05, "e2e_geo": 0.95, "ttft_geo": 0.85, "goodput": 0.02}
TARGET_GOALS = {"ttft": 1.02, "goodput": 0.02}
MAX_TARGET_ROUNDS = 1000.0  # --targets K: past a thousand decode-only rounds a target binds no step


def decode_round_ms(surface) -> float:
    """One token every pipeline round: the whole-model time of a step with one decode at the reference length."""
    return batch_ms(surface, [(1, REFERENCE_TOKENS)])


def workloads(spec: str, surface, args, stages: int, base: int):
    """(label, workload) of every ``--workloads`` item: mixed once per seed, a trace slice once per load."""
    for item in args.workloads.split(","):
        if item == "mixed":
            for seed in (int(s) for s in args.seeds.split(",")):
                yield f"mixed-s{seed}", mixed(surface, stages, seed=seed, reference_chunk_tokens=base), seed
        else:
            trace = parse_trace_item(item.split(":", 1)[1], 32)
            for load in (float(x) for x in args.loads.split(",")):
                made = trace_workload(
                    surface, stages, trace, load, reference_chunk_tokens=base, cache_block_tokens=BLOCK_TOKENS,
                    max_request_tokens=LONGEST_REQUEST_TOKENS,
                )  # fmt: skip
                yield f"{made.name}", made, 0


def target_ms(target: str, surface, stages: int) -> float | None:
    if target == "none":
        return None
    if target == "slo":
        return default_slo(surface, stages).tpot_ms
    return float(target) * decode_round_ms(surface)


def judge(target: str | None, ours, comparator, fixed, slo: Slo) -> dict:
    """One case's figures, ours over the comparator, and the goals it misses."""
    row = {
        "ttft": ours.ttft_mean_ms / comparator.ttft_mean_ms,
        "e2e": ours.e2e_mean_ms / comparator.e2e_mean_ms,
        "e2e_p99": ours.e2e_p99_ms / comparator.e2e_p99_ms,
        "tpot_p99_ms": ours.tpot_p99_ms,
        "comparator_tpot_p99_ms": comparator.tpot_p99_ms,
        "goodput": ours.goodput(slo),
        "comparator_goodput": comparator.goodput(slo),
        "best_fixed_goodput": max(f.goodput(slo) for f in fixed),
    }
    misses = []
    if target is None:
        for goal in ("e2e", "e2e_p99", "ttft"):
            if row[goal] > GOALS[goal]:
                misses.append(goal)
        if row["goodput"] < row["comparator_goodput"] - GOALS["goodput"]:
            misses.append("goodput")
    else:
        bound = slo.tpot_ms if comparator.tpot_p99_ms <= slo.tpot_ms else comparator.tpot_p99_ms
        if ours.tpot_p99_ms > bound * (1 + 1e-9):
            misses.append("tpot")
        if row["ttft"] > TARGET_GOALS["ttft"]:
            misses.append("ttft")
        if row["goodput"] < row["best_fixed_goodput"] - TARGET_GOALS["goodput"]:
            misses.append("goodput")
    row["misses"] = misses
    return row


def check_args(args: argparse.Namespace) -> None:
    """Every flag before the twin's workers start; a ValueError names the flag and what to give."""
    for spec in args.surfaces.split(","):
        load_surface(str(ROOT / spec) if spec.endswith(".csv") else spec)
    if min(parse_stages(args.stages)) < 2:
        raise ValueError(f"--stages {args.stages}: ours needs pipeline parallelism, P >= 2")
    parse_chunks(args.bases, "--bases")
    parse_seeds(args.seeds, "--seeds")
    parse_loads(args.loads, "--loads")
    for item in args.workloads.split(","):
        if item.startswith("trace:"):
            read_slice(parse_trace_item(item.split(":", 1)[1], 32))
        elif item != "mixed":
            raise ValueError(f"--workloads item {item!r}: give mixed or trace:PATH@START:COUNT, comma-separated")
    for target in args.targets.split(","):
        try:
            rounds = None if target in ("none", "slo") else float(target)
        except ValueError:
            rounds = math.nan
        if rounds is not None and not 0 < rounds <= MAX_TARGET_ROUNDS:  # NaN fails both
            raise ValueError(
                f"--targets item {target!r}: give none, slo or a number K in (0, {MAX_TARGET_ROUNDS:g}] (K times the"
                " decode-only round)"
            )
    if args.json is not None:
        check_writable(args.json, "--json", folder=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--surfaces", default="tests/data/cpu_surface.csv,synthetic")
    parser.add_argument("--bases", default="4096")
    parser.add_argument("--workloads", default="mixed", help="mixed and/or trace:PATH@START:COUNT, comma-separated")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="mixed: seeds")
    parser.add_argument("--loads", default="0.5,0.8", help="trace: offered loads")
    parser.add_argument("--stages", default="4")
    parser.add_argument("--targets", default="none,2,4,slo", help="none, K (x the decode-only round) or slo")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        parser.error(str(error))
    targets = args.targets.split(",")
    cases = []
    for spec in args.surfaces.split(","):
        path = str(ROOT / spec) if spec.endswith(".csv") else spec
        surface = load_surface(path)
        for stages in (int(p) for p in args.stages.split(",")):
            for base in (int(b) for b in args.bases.split(",")):
                for label, workload, seed in workloads(path, surface, args, stages, base):
                    policies = [pol.fixed(c) for c in pol.SLO_SWEEP_TOKENS if c <= base]
                    wanted = {t: target_ms(t, surface, stages) for t in targets}
                    for t, ms in wanted.items():
                        options = {} if ms is None else {"target_tpot_ms": ms}
                        made = pol.ours(base, **options)
                        policies.append(pol.Policy(f"ours-{t}", made.kind, base, made.additional_config))
                    key = (Path(spec).name, stages, base, label)
                    cases.append((key, surface, wanted, pol.Setup(path, stages, workload, seed), policies))
    results = pol.run_cases([(setup, policies) for *_, setup, policies in cases])
    rows, misses = [], {t: {} for t in targets}
    geo: dict[str, list[tuple[float, float]]] = {}
    for (key, surface, wanted, setup, _), runs in zip(cases, results, strict=True):
        failed = [r["policy"]["name"] for r in runs if "error" in r]
        if failed:
            print(f"{key}: failed: {', '.join(failed)}")
            continue
        figures = {r["policy"]["name"]: figures_from_result(r, setup.num_stages) for r in runs}
        fixed = [(int(n.split("-")[1]), f) for n, f in figures.items() if n.startswith("fixed-")]
        for t, ms in wanted.items():
            default = default_slo(surface, setup.num_stages)
            if ms is None:
                chunk, comparator = min(fixed, key=lambda item: (item[1].ttft_mean_ms, item[0]))
                slo, name = default, f"tuned-fixed-{chunk}"
            else:
                chunk, comparator = slo_tuned_fixed(fixed, ms)
                slo, name = Slo(default.ttft_ms, ms, "target"), f"slo-tuned-fixed-{chunk}"
            row = judge(None if ms is None else t, figures[f"ours-{t}"], comparator, [f for _, f in fixed], slo)
            row.update(case="/".join(map(str, key)), target=t, target_ms=ms, comparator=name)
            rows.append(row)
            for goal in row["misses"]:
                misses[t].setdefault(goal, []).append(row["case"])
            if ms is None:
                geo.setdefault(key[0], []).append((row["e2e"], row["ttft"]))
            print(
                f"{row['case']:42s} {t:>4s} {name:20s} TTFT {row['ttft']:.3f} E2E {row['e2e']:.3f}"
                f" P99 {row['e2e_p99']:.3f} TPOT P99 {row['tpot_p99_ms']:7.1f} ({row['comparator_tpot_p99_ms']:7.1f}"
                f"{'' if ms is None else f', target {ms:.1f}'}) goodput {100 * row['goodput']:3.0f}"
                f" vs {100 * row['comparator_goodput']:3.0f} (best {100 * row['best_fixed_goodput']:3.0f})"
                f"{'  MISS ' + ','.join(row['misses']) if row['misses'] else ''}",
                flush=True,
            )
    print("\nsummary: per surface with no target, then per target the cases that miss each goal")
    for surface, values in geo.items():
        e2e = math.exp(sum(math.log(e) for e, _ in values) / len(values))
        ttft = math.exp(sum(math.log(t) for _, t in values) / len(values))
        print(f"{surface}: no target, geometric means over tuned fixed: E2E {e2e:.3f}, TTFT {ttft:.3f}")
    for t in targets:
        count = sum(1 for r in rows if r["target"] == t)
        summary = ", ".join(f"{goal} {len(cases)}" for goal, cases in misses[t].items()) or "none"
        print(f"target {t}: {count} cases; misses: {summary}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
