#!/usr/bin/env python3
"""CPP under mixed traffic on every latency surface at hand: ours against the tuned fixed chunk.

For each surface, base chunk (``max_num_batched_tokens``) and seed, the twin runs the
mixed workload (Poisson arrivals, long and short prompts, decodes) at P stages through
ours and through every fixed chunk of the sweep up to the base chunk; the tuned fixed
chunk is the one with the least mean TTFT on that very workload. It prints ours' mean
TTFT and TPOT P99 over the tuned chunk's, and the goodput of both (the share of requests
within the twin's default TTFT and TPOT bounds, twin/slo.py), per case and per surface.
With ``--target-tpot-ms`` ours gets that ``target_tpot_ms`` (the comparator is still the
tuned chunk): a target longer than any batch is CPP's TTFT-first setting. It asserts nothing.

    PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_mixed.py [--surfaces a,b] [--bases 2048,4096,8192] \
        [--seeds 0,1,2,3,4] [--stages 4] [--sweep 128,256,...] [--target-tpot-ms MS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from cpp_surfaces import SURFACES  # noqa: E402
from vllm_ascend_patchset.twin import policies as pol  # noqa: E402
from vllm_ascend_patchset.twin.ladder import ladder  # noqa: E402
from vllm_ascend_patchset.twin.options import (  # noqa: E402
    MAX_SLO_MS,
    check_number,
    parse_chunks,
    parse_seeds,
    parse_stages,
)
from vllm_ascend_patchset.twin.report import figures_from_result  # noqa: E402
from vllm_ascend_patchset.twin.slo import default_slo  # noqa: E402
from vllm_ascend_patchset.twin.stress import STRESS_SURFACES  # noqa: E402
from vllm_ascend_patchset.twin.surface_files import load_surface  # noqa: E402
from vllm_ascend_patchset.twin.workloads import mixed  # noqa: E402

# Traffic has decodes: the stress surfaces made for one prompt at a time are left out (twin/stress.py).
MIXED_SURFACES = [
    spec for spec in SURFACES if not spec.startswith("stress:") or STRESS_SURFACES[spec.split(":", 1)[1]].with_decodes
]

# Steps of 1.5x and 4/3 alternately: the tuned fixed chunk is within about 15% of the best size there is
# (a power-of-two sweep misses, e.g., the 768 that beats both 512 and 1024 on a surface with tile steps).
SWEEP = ",".join(map(str, ladder(128, 8192)))


def check_args(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    """Every flag before the twin's workers start (a ValueError names it); the bases, seeds and sweep."""
    for spec in args.surfaces.split(","):
        load_surface(spec)
    (stages,) = parse_stages(str(args.stages))
    if args.target_tpot_ms is not None:
        check_number(args.target_tpot_ms, "--target-tpot-ms", 0.0, MAX_SLO_MS, low_open=True, why="ms; a day at most")
    if stages < 2:
        raise ValueError(f"--stages {args.stages}: ours needs pipeline parallelism, P >= 2")
    return parse_chunks(args.bases, "--bases"), parse_seeds(args.seeds, "--seeds"), parse_chunks(args.sweep, "--sweep")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--surfaces", default=",".join(MIXED_SURFACES))
    parser.add_argument("--bases", default="8192")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--sweep", default=SWEEP, help="fixed chunk sizes the tuned fixed chunk is the best of")
    parser.add_argument(
        "--target-tpot-ms", type=float, default=None,
        help="ours' target_tpot_ms (default none: CPP weighs the decodes' wait itself)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        bases, seeds, sweep = check_args(args)
    except ValueError as error:
        parser.error(str(error))
    cases, slos = [], {}
    options = {} if args.target_tpot_ms is None else {"target_tpot_ms": args.target_tpot_ms}
    for spec in args.surfaces.split(","):
        surface = load_surface(spec)
        slos[spec] = default_slo(surface, args.stages)
        for base in bases:
            for seed in seeds:
                workload = mixed(surface, args.stages, seed=seed, reference_chunk_tokens=base)
                policies = [pol.fixed(c) for c in sweep if c <= base] + [pol.ours(base, **options)]
                cases.append(((spec, base, seed), pol.Setup(spec, args.stages, workload, seed), policies))
    results = pol.run_cases([(setup, policies) for _, setup, policies in cases])
    ratios: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    print(
        f"{'surface':34s} {'base':>5s} seed  tuned        TTFT ours/tuned  TPOT P99 ours/tuned  goodput % ours, tuned"
    )
    for (key, _, _), runs in zip(cases, results, strict=True):
        figures = {}
        for run in runs:
            if "error" in run:
                print(f"{key}: {run['policy']['name']} failed: {run['error'][:200]}")
                continue
            figures[run["policy"]["name"]] = figures_from_result(run, args.stages)
        fixed = {name: f for name, f in figures.items() if name.startswith("fixed")}
        if "ours" not in figures or not fixed:
            continue
        tuned = min(fixed, key=lambda name: fixed[name].ttft_mean_ms)
        ours, best = figures["ours"], fixed[tuned]
        ttft, tpot = ours.ttft_mean_ms / best.ttft_mean_ms, ours.tpot_p99_ms / best.tpot_p99_ms
        good = 100.0 * ours.goodput(slos[key[0]]), 100.0 * best.goodput(slos[key[0]])
        ratios.setdefault(key[:2], []).append((ttft, tpot, *good))
        print(
            f"{key[0]:34s} {key[1]:5d} {key[2]:4d}  {tuned:11s}  {ttft:15.3f}  {tpot:19.3f}"
            f"  {good[0]:5.0f} {good[1]:5.0f}",
            flush=True,
        )
    print("\nper surface and base: TTFT ours/tuned mean and max; TPOT P99 ours/tuned max; mean goodput % ours, tuned")
    for (spec, base), values in ratios.items():
        ttfts, tpots = [v[0] for v in values], [v[1] for v in values]
        ours_good, tuned_good = statistics.mean(v[2] for v in values), statistics.mean(v[3] for v in values)
        print(
            f"{spec:34s} {base:5d}  {statistics.mean(ttfts):.3f}  {max(ttfts):.3f}  {max(tpots):.2f}"
            f"  {ours_good:5.1f} {tuned_good:5.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
