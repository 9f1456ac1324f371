"""``cpp-twin``: compare fixed chunking, tuned fixed, upstream CPP and ours on one surface.

    python -m vllm_ascend_patchset.twin --workload long:128k,mixed --stages 4 [--plot DIR] [--tune]

For every (stage count, workload) pair the same requests run under each policy in one
invocation: vLLM's fixed chunk at ``--chunk`` (= max_num_batched_tokens), the best
fixed chunk of ``--sweep`` ("tuned fixed", by mean TTFT), upstream v0.23.0's CPP and
ours (when our scheduler is assembled), all with base chunk ``--chunk``. The table's
ratios are mean TTFT over tuned fixed's and over upstream's (< 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..paths import CPU_SURFACE
from . import policies as pol
from .optimum import Optimum, optimum
from .options import (
    MAX_NOISE,
    MAX_SLO_MS,
    MAX_STAGES,
    TINY_MODEL_MAX_POSITIONS,
    add_workload_arguments,
    build_workloads,
    check_chunk,
    check_noise,
    check_number,
    parse_chunks,
    parse_layers,
    parse_smooth_factors,
    parse_stages,
    slo_for,
    tokens_option,
    validate_workload_args,
)
from .report import Figures, all_figures, figures_from_result, format_table, run_problems
from .surface_files import load_surface


def check_writable(path: Path, option: str, *, folder: bool) -> None:
    """Fail now, not after the run, when an output cannot be written; leave no file or folder behind."""
    nearest = next((parent for parent in (path if folder else path.parent, *path.parents) if parent.exists()), None)
    if nearest is not None and not nearest.is_dir():
        raise ValueError(f"{option} {path}: {nearest} is a file, not a folder; give a path in a folder")
    try:
        if not folder and path.exists() and not path.is_file():
            raise ValueError(f"{option} {path}: not a regular file; give a file path for the JSON")
        # Where the folders to make would go; they are made when the outputs are written (the plots, the
        # workers' logs, the figures), so a run refused later leaves none behind.
        tempfile.NamedTemporaryFile(dir=nearest or Path.cwd(), prefix=f".{path.name}.", suffix=".tmp").close()
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write there ({exc.strerror or exc}); give a writable path") from None


def _write_json(path: Path, dump: list) -> bool:
    """Write the figures beside the file and rename them into place; on failure say so (the tables are printed)."""
    handle = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # (the check before the run made none)
        handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
        with handle:
            json.dump(dump, handle, indent=1)
        Path(handle.name).replace(path)
    except OSError as exc:
        if handle is not None:
            Path(handle.name).unlink(missing_ok=True)
        reason = exc.strerror or exc
        message = f"cpp-twin: error: --json {path}: could not write ({reason}); the tables above hold the figures"
        print(message, file=sys.stderr)
        return False
    return True


def validate_args(args: argparse.Namespace) -> None:
    """Every option checked before a worker starts; an error names the option and what to give."""
    if args.surface is not None and not args.surface.strip():
        raise ValueError("--surface '': give a .csv, a profile .json, 'synthetic', quadratic:C0,...,C4 or leave it out")
    check_chunk(args.chunk, "--chunk")
    if args.smooth_factor is not None and not 0 < args.smooth_factor <= 1:  # (NaN too) whatever the policies
        raise ValueError(f"--smooth-factor must be in (0, 1], got {args.smooth_factor}")
    check_noise(args.noise)
    check_number(args.drift, "--drift", 0.0, 0.99)
    validate_workload_args(args)
    if args.min_chunk is not None:
        why = "tokens; above --chunk CPP clamps it to --chunk, and no chunk of the twin's is longer"
        check_number(args.min_chunk, "--min-chunk", 1, TINY_MODEL_MAX_POSITIONS, why=why)
    if args.target_tpot_ms is not None:
        check_number(args.target_tpot_ms, "--target-tpot-ms", 0.0, MAX_SLO_MS, low_open=True, why="ms; a day at most")
    stage_counts = parse_stages(args.stages)
    if min(stage_counts) < 2 and policy_names(args) & {"ours", "upstream"}:
        raise ValueError(
            f"--stages {args.stages}: CPP (ours, upstream) needs pipeline parallelism, P >= 2;"
            " give --stages 2 or more, or --policies fixed,tuned"
        )
    if args.layers:
        parse_layers(args.layers, args.stages)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.sweep is not None:
        parse_chunks(args.sweep, "--sweep")
    unused = [
        flag for flag, value in (("--target-tpot-ms", args.target_tpot_ms), ("--min-chunk", args.min_chunk)) if value
    ]
    if args.tune and unused:  # (the candidates run with the scheduler's own settings but the two searched)
        raise ValueError(f"--tune searches the base chunk and smooth factor alone: leave out {' and '.join(unused)}")
    if args.tune_base_chunks is not None:
        parse_chunks(args.tune_base_chunks, "--tune-base-chunks")
    if args.tune_smooth_factors is not None:
        parse_smooth_factors(args.tune_smooth_factors, "--tune-smooth-factors")
    if not policy_names(args):
        raise ValueError(f"--policies {args.policies!r}: give at least one of fixed,tuned,upstream,ours")
    unknown = policy_names(args) - {"fixed", "tuned", "upstream", "ours"}
    if unknown:
        raise ValueError(f"--policies: unknown {sorted(unknown)}; choose from fixed,tuned,upstream,ours")
    for path, option in ((args.plot, "--plot"), (args.log_dir, "--log-dir")):
        if path is not None:
            check_writable(path, option, folder=True)
    if args.json is not None:
        check_writable(args.json, "--json", folder=False)


def default_surface() -> str:
    return str(CPU_SURFACE) if CPU_SURFACE.exists() else "synthetic"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpp-twin", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--surface",
        default=None,
        help="latency surface: a CSV (chunk_tokens,history_tokens,latency_ms), the profile JSON the engine saved,\n"
        "'synthetic', or quadratic:C0,C1,C2,C3,C4 (default: tests/data/cpu_surface.csv if present, else synthetic)",
    )
    p.add_argument(
        "--stages", default="4", help=f"pipeline stages P, comma-separated (e.g. 2,4,8; at most {MAX_STAGES})"
    )
    add_workload_arguments(p)
    p.add_argument("--chunk", type=tokens_option, default=8192, help="max_num_batched_tokens / CPP base chunk")
    p.add_argument(
        "--sweep",
        default=None,
        help="fixed chunk sizes searched for tuned fixed (default 128..32768; with --slo-tpot-ms 64..32768 in\n"
        "1-1.5-2 steps, for the SLO-tuned fixed chunk too)",
    )
    p.add_argument("--policies", default="fixed,tuned,upstream,ours", help="subset of fixed,tuned,upstream,ours")
    p.add_argument("--smooth-factor", type=float, default=None, help="CPP smooth_factor (default: each scheduler's)")
    p.add_argument("--min-chunk", type=tokens_option, default=None, help="CPP min_chunk (default: each scheduler's)")
    p.add_argument(
        "--target-tpot-ms",
        type=float,
        default=None,
        help="CPP's target_tpot_ms (ours, upstream; default: --slo-tpot-ms, else none); 1e6 puts TTFT first",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the mixed workload and of stage-time noise")
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help=f"sigma of log-normal multiplicative stage-time noise, relative (at most {MAX_NOISE:g})",
    )
    p.add_argument("--drift", type=float, default=0.0, help="amplitude of a slow drift of stage times (e.g. 0.05)")
    p.add_argument("--layers", default=None, help="layers per stage, comma-separated (uneven split), e.g. 15,16,16,17")
    p.add_argument(
        "--async-scheduling",
        action="store_true",
        help="vLLM's asynchronous scheduling (AsyncScheduler, ours' async variant; upstream has none)",
    )
    p.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write Gantt and chunk PNGs here")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write all figures as JSON")
    p.add_argument("--tune", action="store_true", help="search base chunk and smooth factor for the CPP scheduler")
    p.add_argument("--tune-base-chunks", default=None, help="--tune: base chunks to try (default 4096..16384)")
    p.add_argument("--tune-smooth-factors", default=None, help="--tune: smooth factors to try (default 0.5,0.75,1)")
    p.add_argument("--log-dir", type=Path, default=None, help="keep the policy subprocesses' logs here")
    return p


def cpp_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.smooth_factor is not None:
        if not 0 < args.smooth_factor <= 1:
            raise ValueError(f"--smooth-factor must be in (0, 1], got {args.smooth_factor}")
        options["smooth_factor"] = args.smooth_factor
    if args.min_chunk is not None:
        options["min_chunk"] = args.min_chunk
    if getattr(args, "slo_tpot_ms", None) is not None:
        options["target_tpot_ms"] = args.slo_tpot_ms  # ours keeps to the bound goodput is judged by
    if getattr(args, "target_tpot_ms", None) is not None:
        options["target_tpot_ms"] = args.target_tpot_ms
    return options


def policy_names(args: argparse.Namespace) -> set[str]:
    """The names ``--policies`` gives (fixed, tuned, upstream, ours; unchecked)."""
    return {w.strip() for w in args.policies.split(",") if w.strip()}


def comparison_policies(args: argparse.Namespace) -> tuple[list[pol.Policy], list[str]]:
    wanted = policy_names(args)
    unknown = wanted - {"fixed", "tuned", "upstream", "ours"}
    if unknown:
        raise ValueError(f"--policies: unknown {sorted(unknown)}; choose from fixed,tuned,upstream,ours")
    notes = []
    # Tuned fixed chunks share the deployment's token budget (max_num_batched_tokens = --chunk), as CPP does.
    sweep_text = args.sweep
    if sweep_text is None:  # with a TPOT bound the small chunks matter: the SLO-tuned chunk is often one of them
        sweep_text = ",".join(
            map(str, pol.SLO_SWEEP_TOKENS if args.slo_tpot_ms is not None else pol.FIXED_SWEEP_TOKENS)
        )
    sweep = sorted({c for c in parse_chunks(sweep_text, "--sweep") if c <= args.chunk} | {args.chunk})
    policies: list[pol.Policy] = []
    if "tuned" in wanted:
        policies += [pol.fixed(c) for c in sweep]
    elif "fixed" in wanted:
        policies.append(pol.fixed(args.chunk))
    if "upstream" in wanted:
        policies.append(pol.upstream(args.chunk, **cpp_options(args)))
    if "ours" in wanted:
        if pol.ours_available():
            policies.append(pol.ours(args.chunk, **cpp_options(args)))
        else:
            notes.append("ours: not run (the assembled tree lacks the current overlay scheduler: make assemble)")
    return policies, notes


def summarize_case(
    results: Sequence[dict[str, Any]],
    num_stages: int,
    chunk_tokens: int,
    wanted: set[str],
    computed: Sequence[Figures | None] | None = None,
    slo_tpot_ms: float | None = None,
) -> tuple[list[Figures], Figures | None, Figures | None, list[str]]:
    """Rows to print: vLLM fixed, tuned fixed, SLO-tuned fixed (with ``slo_tpot_ms``), upstream, ours;
    plus failures as notes.

    ``computed``: each result's figures, if already computed (``all_figures``)."""
    notes, fixed_rows = [], []
    rows: list[Figures] = []
    upstream = ours = None
    for index, result in enumerate(results):
        if "error" in result:
            notes.append(f"{result['policy']['name']}: FAILED {result['error']}")
            continue
        if result.get("start_up"):
            notes.append(f"{result['policy']['name']}: {result['start_up']}")
        figures = computed[index] if computed else figures_from_result(result, num_stages)
        kind = result["policy"]["kind"]
        if kind == "fixed":
            fixed_rows.append((result["policy"]["max_num_batched_tokens"], figures))
        elif kind == "upstream":
            upstream = figures
        else:
            ours = figures
    default = next((f for c, f in fixed_rows if c == chunk_tokens), None)
    tuned = None
    if fixed_rows and "tuned" in wanted:
        best_chunk, best = min(fixed_rows, key=lambda item: (item[1].ttft_mean_ms, item[0]))
        tuned = Figures(**{**asdict(best), "name": f"tuned-fixed-{best_chunk}"})
    slo_tuned = None
    if fixed_rows and "tuned" in wanted and slo_tpot_ms is not None:
        slo_chunk, slo_best = slo_tuned_fixed(fixed_rows, slo_tpot_ms)
        slo_tuned = Figures(**{**asdict(slo_best), "name": f"slo-tuned-fixed-{slo_chunk}"})
    if default is not None and "fixed" in wanted:
        rows.append(Figures(**{**asdict(default), "name": f"vllm-fixed-{chunk_tokens}"}))
    rows += [f for f in (tuned, slo_tuned, upstream, ours) if f is not None]
    return rows, tuned, upstream, notes


def slo_tuned_fixed(fixed_rows: Sequence[tuple[int, Figures]], tpot_ms: float) -> tuple[int, Figures]:
    """The fixed chunk a user tunes for a TPOT bound: the least mean TTFT among the chunks whose TPOT P99
    is within ``tpot_ms``; when none is, the least TPOT P99 (ties: the smaller chunk)."""
    meeting = [(c, f) for c, f in fixed_rows if f.tpot_p99_ms is not None and f.tpot_p99_ms <= tpot_ms]
    if meeting:
        return min(meeting, key=lambda item: (item[1].ttft_mean_ms, item[0]))
    return min(fixed_rows, key=lambda item: (math.inf if item[1].tpot_p99_ms is None else item[1].tpot_p99_ms, item[0]))


def case_optimum(surface, setup: pol.Setup, base_chunk_tokens: int) -> Optimum | None:
    """The least TTFT of a one-prompt case with chunks within the token budget (twin/optimum.py); None otherwise."""
    requests = setup.workload.requests
    if len(requests) != 1:
        return None
    shares = None
    if setup.layers:
        shares = [n / sum(setup.layers) for n in setup.layers]
    return optimum(surface, requests[0].prompt_tokens, setup.num_stages, shares, base_chunk_tokens=base_chunk_tokens)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, RuntimeError) as exc:
        print(f"cpp-twin: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    validate_args(args)
    surface_spec = args.surface or default_surface()
    surface = load_surface(surface_spec)
    stage_counts = parse_stages(args.stages)
    wanted = policy_names(args)
    layers = parse_layers(args.layers, args.stages) if args.layers else None
    print(f"surface: {surface.describe()}")
    if args.tune:
        from .tune import run_tune

        return run_tune(args, surface_spec, stage_counts, layers)
    policies, notes = comparison_policies(args)
    if not policies:
        raise ValueError(f"--policies {args.policies}: nothing to run ({'; '.join(notes)})")
    cases = []
    for num_stages in stage_counts:
        for workload in build_workloads(args, surface_spec, num_stages):
            setup = pol.Setup(
                surface_spec, num_stages, workload, args.seed, layers, args.noise, args.async_scheduling, args.drift
            )
            cases.append((setup, policies))
    all_results = pol.run_cases(cases, args.log_dir)
    dump = []
    problems = []
    for (setup, _), results in zip(cases, all_results, strict=True):
        computed = all_figures(results, setup.num_stages)
        show_tpot = any(r.max_output_tokens > 1 for r in setup.workload.requests)
        slo_tpot_ms = args.slo_tpot_ms if show_tpot else None
        rows, tuned, upstream, case_notes = summarize_case(
            results, setup.num_stages, args.chunk, wanted, computed, slo_tpot_ms
        )
        best = case_optimum(surface, setup, args.chunk)
        case_problems = run_problems(results, setup.num_stages, computed)
        problems += [f"{setup.workload.name} P={setup.num_stages}: {p}" for p in case_problems]
        title = f"\n== {setup.workload.name}, P={setup.num_stages}, {len(setup.workload.requests)} request(s) =="
        slo = slo_for(args, surface, setup.num_stages) if show_tpot else None
        print(format_table(title, rows, tuned, upstream, show_tpot, best.lower_ms if best else None, slo))
        if slo is not None:
            print(f"  goodput SLO: TTFT <= {slo.ttft_ms / 1000:.3f} s, TPOT <= {slo.tpot_ms:.1f} ms ({slo.basis})")
        if best is not None:
            print(
                f"  optimum: {best.lower_ms / 1000:.3f} s ({len(best.chunks)} chunks, first {best.chunks[0]} tokens"
                f"{', certified' if best.certified else ', best found'}); under the P-in-flight rule"
                f" {best.in_flight_ms / 1000:.3f} s ({best.in_flight_ms / best.lower_ms:.3f}x)"
            )
        for note in [*setup.workload.notes, *notes, *case_notes]:
            print(f"  note: {note}")
        dump.append(
            {
                "surface": surface_spec,
                "workload": setup.workload.name,
                "stages": setup.num_stages,
                "requests": len(setup.workload.requests),
                "rows": [
                    {**asdict(r), "vs_optimum": r.ttft_mean_ms / best.lower_ms if best else None}
                    | ({"goodput": r.goodput(slo)} if slo else {})
                    for r in rows
                ],
                "optimum": best.to_json() if best else None,
                "slo": slo.to_json() if slo else None,
                "notes": list(setup.workload.notes),
            }
        )
        if args.plot:
            from .plot import plot_case

            for path in plot_case(args.plot, setup, results, rows, args.chunk):
                print(f"  wrote {path}")
    if args.json and not _write_json(args.json, dump):
        return 1
    if problems:
        print(f"cpp-twin: {len(problems)} problem(s); these figures are not to be trusted:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0
