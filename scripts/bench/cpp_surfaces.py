#!/usr/bin/env python3
"""CPP on every latency surface at hand: one long prompt, ours against the optimum, the best fixed chunk and upstream.

For each surface (the committed CPU surface, the two other measured CPU surfaces, the
synthetic accelerator-like one and the stress family of twin/stress.py), each base
chunk (``max_num_batched_tokens``), prompt and pipeline depth, the twin runs ours,
upstream v0.23.0's CPP and every fixed chunk of the sweep up to the base chunk (64 tokens
and up in 1-1.5-2 steps: 64, 96, 128, 192, ...), and prints ours' TTFT over:

- the optimum: the least TTFT any chunking within the token budget can reach
  (twin/optimum.py, a certified lower bound that ignores the engine's limit of P
  batches in flight). Where ours is over 1.03x that bound and over the engine's optimum
  (below), the bound under the limit (twin/in_flight_bound.py, certified too, and slower)
  replaces it, on a line of its own under the case;
- the engine's optimum: the best of the optimum's chunkings under that limit (a
  schedule the engine can run; ours may beat it);
- the best fixed chunk of the sweep, and upstream's CPP.

It asserts nothing; with ``--gate`` it exits 1 when ours is over 1.03x the optimum
(and over the engine's optimum) or over 1.01x the best fixed chunk anywhere.

    PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_surfaces.py [--surfaces a,b] [--bases 2048,4096,8192]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import DATA_DIR, ROOT  # noqa: E402
from vllm_ascend_patchset.twin import policies as pol  # noqa: E402
from vllm_ascend_patchset.twin.in_flight_bound import in_flight_lower_ms  # noqa: E402
from vllm_ascend_patchset.twin.optimum import optimum  # noqa: E402
from vllm_ascend_patchset.twin.options import (  # noqa: E402
    LONGEST_REQUEST_TOKENS,
    check_number,
    parse_chunks,
    parse_stages,
    parse_tokens,
)
from vllm_ascend_patchset.twin.report import figures_from_result  # noqa: E402
from vllm_ascend_patchset.twin.stress import STRESS_SURFACES  # noqa: E402
from vllm_ascend_patchset.twin.surface_files import load_surface  # noqa: E402
from vllm_ascend_patchset.twin.workloads import long_prompt  # noqa: E402

MEASURED = [str(p.relative_to(ROOT)) for p in sorted(DATA_DIR.glob("cpu_surface*.csv"))]
SURFACES = MEASURED + ["synthetic"] + [f"stress:{name}" for name in sorted(STRESS_SURFACES)]
OPTIMUM_GATE, FIXED_GATE = 1.03, 1.01


def run_surface(spec: str, bases: list[int], prompts: list[int], stages: list[int]) -> list[dict]:
    """Every (base, prompt, P) case of one surface, in one wave of twin workers."""
    surface = load_surface(str(ROOT / spec) if spec.endswith(".csv") else spec)
    cases, keys = [], []
    for base in bases:
        sweep = [c for c in pol.SLO_SWEEP_TOKENS if c <= base]
        policies = [pol.fixed(c) for c in sweep] + [pol.upstream(base), pol.ours(base)]
        policies = [
            pol.Policy(f"{p.name}@{base}", p.kind, p.max_num_batched_tokens, p.additional_config) for p in policies
        ]
        for prompt in prompts:
            for num_stages in stages:
                cases.append((pol.Setup(str(ROOT / spec) if spec.endswith(".csv") else spec, num_stages,
                                        long_prompt(prompt)), policies))  # fmt: skip
                keys.append((base, prompt, num_stages))
    rows = []
    for (base, prompt, num_stages), results in zip(keys, pol.run_cases(cases), strict=True):
        ttft = {}
        for result in results:
            if "error" not in result:
                ttft[result["policy"]["kind"], result["policy"]["name"]] = figures_from_result(
                    result, num_stages
                ).ttft_mean_ms
        best = optimum(surface, prompt, num_stages, base_chunk_tokens=base)
        fixed = min(ms for (kind, _), ms in ttft.items() if kind == "fixed")
        ours = next((ms for (kind, _), ms in ttft.items() if kind == "ours"), float("nan"))
        upstream = next((ms for (kind, _), ms in ttft.items() if kind == "upstream"), float("nan"))
        lower = best.lower_ms
        if ours / lower > OPTIMUM_GATE and ours > best.in_flight_ms:  # over the gate: the limit may explain it
            lower = max(lower, in_flight_lower_ms(surface, prompt, num_stages, lower, best.in_flight_ms, base))
        rows.append(
            {
                "surface": spec,
                "base": base,
                "prompt": prompt,
                "stages": num_stages,
                "vs_optimum": ours / lower,
                "in_flight_bound": lower / best.lower_ms if lower > best.lower_ms else None,
                "vs_engine_optimum": ours / best.in_flight_ms,
                "vs_fixed": ours / fixed,
                "vs_upstream": ours / upstream,
            }
        )
    return rows


def check_args(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    """Every flag before the twin's workers start (a ValueError names it); the bases, prompts and stage counts."""
    for spec in args.surfaces.split(","):
        load_surface(str(ROOT / spec) if spec.endswith(".csv") else spec)
    bases = parse_chunks(args.bases, "--bases")
    prompts = [parse_tokens(v, "--prompts item") for v in args.prompts.split(",")]
    for prompt in prompts:
        check_number(prompt, "--prompts", 1, LONGEST_REQUEST_TOKENS, why="tokens the twin's model takes")
    stages = parse_stages(args.stages)
    if min(stages) < 2:
        raise ValueError(f"--stages {args.stages}: ours needs pipeline parallelism, P >= 2")
    return bases, prompts, stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--surfaces", default=",".join(SURFACES))
    parser.add_argument("--bases", default="2048,4096,8192")
    parser.add_argument("--prompts", default="32768,131072")
    parser.add_argument("--stages", default="2,4,8")
    parser.add_argument("--gate", action="store_true", help="exit 1 when a case misses the goals")
    args = parser.parse_args(argv)
    try:
        bases, prompts, stages = check_args(args)
    except ValueError as error:
        parser.error(str(error))
    print("surface                          base   prompt  P  ours/optimum  /engine-opt  /best-fixed  /upstream")
    misses = []
    for spec in args.surfaces.split(","):
        for row in run_surface(spec, bases, prompts, stages):
            print(
                f"{row['surface'][-32:]:32s} {row['base']:5d} {row['prompt']:7d} {row['stages']:2d}"
                f"  {row['vs_optimum']:12.4f} {row['vs_engine_optimum']:12.4f} {row['vs_fixed']:11.4f}"
                f" {row['vs_upstream']:10.4f}",
                flush=True,
            )
            if row["in_flight_bound"]:
                lifted = row["in_flight_bound"]
                print(f"    bound under the in-flight limit (certified): {lifted:.4f}x the flow-shop one", flush=True)
            optimum_miss = row["vs_optimum"] > OPTIMUM_GATE and row["vs_engine_optimum"] > 1.0
            if optimum_miss or row["vs_fixed"] > FIXED_GATE:
                misses.append(row)
    print(
        f"{len(misses)} case(s) miss ours <= {OPTIMUM_GATE}x the optimum (or the engine's) and <= {FIXED_GATE}x fixed"
    )
    for row in misses:
        print(f"  {row}")
    return 1 if args.gate and misses else 0


if __name__ == "__main__":
    sys.exit(main())
