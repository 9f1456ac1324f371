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

from . import policies as pol
from .engine import MAX_NUM_SEQS, MODEL_LEN_SLACK_TOKENS, TINY_MODEL_MAX_POSITIONS
from .optimum import Optimum, optimum
from .report import Figures, figures_from_result, format_table
from .surface_files import load_surface
from .workloads import Workload, long_prompt, mixed

CPU_SURFACE = pol.ROOT / "tests" / "data" / "cpu_surface.csv"


def parse_tokens(text: str, what: str = "token count") -> int:
    """``4096``, ``128k`` (x1024) -> tokens: a whole number > 0."""
    clean = text.strip().lower()
    factor = 1024 if clean.endswith("k") else 1
    try:
        number = float(clean[:-1] if factor > 1 else clean) * factor
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0 and number.is_integer()):
        raise ValueError(f"{what} {text!r}: give a whole number > 0, optionally with k (e.g. 4096 or 128k)")
    return int(number)


def _tokens_option(text: str) -> int:
    """argparse type of a token-count option: argparse names the option in the error."""
    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_counts(text: str, option: str) -> list[int]:
    """``2,4,8`` -> [2, 4, 8]: whole numbers >= 1."""
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"{option} {text!r}: give whole numbers >= 1, comma-separated (e.g. 2,4,8)")
    return counts


def check_chunk(tokens: int, option: str) -> int:
    """A max_num_batched_tokens the twin's vLLM config accepts."""
    if not MAX_NUM_SEQS <= tokens <= TINY_MODEL_MAX_POSITIONS:
        raise ValueError(
            f"{option} {tokens}: a chunk budget must lie in [{MAX_NUM_SEQS}, {TINY_MODEL_MAX_POSITIONS}] tokens"
            f" (vLLM needs max_num_batched_tokens >= max_num_seqs, {MAX_NUM_SEQS} in the twin)"
        )
    return tokens


def parse_chunks(text: str, option: str) -> list[int]:
    """``4k,8192`` -> chunk budgets, each checked by ``check_chunk``."""
    chunks = [check_chunk(parse_tokens(v, f"{option} item"), option) for v in text.split(",") if v.strip()]
    if not chunks:
        raise ValueError(f"{option} {text!r}: give at least one chunk size")
    return chunks


def parse_smooth_factors(text: str, option: str) -> list[float]:
    """``0.5,1`` -> CPP smooth factors, each in (0, 1]."""
    try:
        factors = [float(v) for v in text.split(",")]
    except ValueError:
        factors = []
    if not factors or not all(0 < f <= 1 for f in factors):
        raise ValueError(f"{option} {text!r}: give numbers in (0, 1], comma-separated (e.g. 0.5,0.75,1)")
    return factors


def _check_number(value: float, option: str, low: float, high: float = math.inf, *, low_open: bool = False) -> None:
    inside = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not inside:
        interval = f"{'(' if low_open else '['}{low:g}, {'inf)' if high == math.inf else f'{high:g}]'}"
        raise ValueError(f"{option} must be a finite number in {interval}, got {value}")


def _check_writable(path: Path, option: str, *, folder: bool) -> None:
    """Fail now, not after the run, when an output cannot be written; leave no file behind."""
    try:
        if folder:
            path.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        else:
            existed = path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
            if not existed:
                path.unlink()
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write there ({exc.strerror or exc}); give a writable path") from None


def validate_args(args: argparse.Namespace) -> None:
    """Every option checked before a worker starts; an error names the option and what to give."""
    check_chunk(args.chunk, "--chunk")
    _check_number(args.noise, "--noise", 0.0)
    _check_number(args.drift, "--drift", 0.0, 0.99)
    _check_number(args.load, "--load", 0.0, low_open=True)
    _check_number(args.prefix_hit_share, "--prefix-hit-share", 0.0, 1.0)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    parse_chunks(args.sweep, "--sweep")
    if args.tune_base_chunks is not None:
        parse_chunks(args.tune_base_chunks, "--tune-base-chunks")
    if args.tune_smooth_factors is not None:
        parse_smooth_factors(args.tune_smooth_factors, "--tune-smooth-factors")
    if not {w.strip() for w in args.policies.split(",") if w.strip()}:
        raise ValueError(f"--policies {args.policies!r}: give at least one of fixed,tuned,upstream,ours")
    for path, option in ((args.plot, "--plot"), (args.log_dir, "--log-dir")):
        if path is not None:
            _check_writable(path, option, folder=True)
    if args.json is not None:
        _check_writable(args.json, "--json", folder=False)


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
    p.add_argument("--stages", default="4", help="pipeline stages P, comma-separated (e.g. 2,4,8)")
    p.add_argument(
        "--workload",
        default="long:128k",
        help="comma-separated: long:<tokens> (one prompt, e.g. long:128k) or mixed (Poisson traffic)",
    )
    p.add_argument("--chunk", type=_tokens_option, default=8192, help="max_num_batched_tokens / CPP base chunk")
    p.add_argument(
        "--sweep",
        default=",".join(str(c) for c in pol.FIXED_SWEEP_TOKENS),
        help="fixed chunk sizes searched for tuned fixed",
    )
    p.add_argument("--policies", default="fixed,tuned,upstream,ours", help="subset of fixed,tuned,upstream,ours")
    p.add_argument("--smooth-factor", type=float, default=None, help="CPP smooth_factor (default: each scheduler's)")
    p.add_argument("--min-chunk", type=_tokens_option, default=None, help="CPP min_chunk (default: each scheduler's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mixed workload and of stage-time noise")
    p.add_argument("--requests", type=int, default=24, help="mixed: number of requests")
    p.add_argument("--load", type=float, default=0.6, help="mixed: offered prefill load (fraction of capacity)")
    p.add_argument("--prompt-range", default="4k-64k", help="mixed: prompt lengths, log-uniform (e.g. 4k-64k)")
    p.add_argument("--prefix-hit-share", type=float, default=0.25, help="mixed: share of prefix-cache hits")
    p.add_argument("--output-range", default="16-128", help="mixed: output tokens per request")
    p.add_argument("--noise", type=float, default=0.0, help="sigma of log-normal multiplicative stage-time noise")
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


def _range(text: str, what: str) -> tuple[int, int]:
    try:
        low, high = (parse_tokens(v) for v in text.split("-"))
    except ValueError:
        raise ValueError(f"--{what} expects LOW-HIGH, whole numbers > 0 (e.g. 4k-64k), got {text!r}") from None
    if low > high:
        raise ValueError(f"--{what} {text!r}: LOW must not exceed HIGH")
    return low, high


def build_workloads(args: argparse.Namespace, surface_spec: str, num_stages: int) -> list[Workload]:
    out = []
    for item in args.workload.split(","):
        item = item.strip()
        if item.startswith("long:"):
            workload = long_prompt(parse_tokens(item.split(":", 1)[1], f"--workload {item!r}: token count"))
        elif item == "mixed":
            low, high = _range(args.prompt_range, "prompt-range")
            out_low, out_high = _range(args.output_range, "output-range")
            workload = mixed(
                load_surface(surface_spec),
                num_stages,
                seed=args.seed,
                num_requests=args.requests,
                load=args.load,
                min_prompt_tokens=low,
                max_prompt_tokens=high,
                prefix_hit_share=args.prefix_hit_share,
                min_output_tokens=out_low,
                max_output_tokens=out_high,
                reference_chunk_tokens=args.chunk,
            )
        else:
            raise ValueError(f"--workload item {item!r}: use long:<tokens> (e.g. long:128k) or mixed")
        longest = TINY_MODEL_MAX_POSITIONS - MODEL_LEN_SLACK_TOKENS
        if workload.max_request_tokens > longest:
            source = "--prompt-range/--output-range" if item == "mixed" else f"--workload {item}"
            raise ValueError(
                f"{source}: a request of {workload.max_request_tokens} tokens (prompt + output) is longer than"
                f" the twin's model takes ({longest})"
            )
        out.append(workload)
    return out


def cpp_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.smooth_factor is not None:
        if not 0 < args.smooth_factor <= 1:
            raise ValueError(f"--smooth-factor must be in (0, 1], got {args.smooth_factor}")
        options["smooth_factor"] = args.smooth_factor
    if args.min_chunk is not None:
        options["min_chunk"] = args.min_chunk
    return options


def comparison_policies(args: argparse.Namespace) -> tuple[list[pol.Policy], list[str]]:
    wanted = {w.strip() for w in args.policies.split(",") if w.strip()}
    unknown = wanted - {"fixed", "tuned", "upstream", "ours"}
    if unknown:
        raise ValueError(f"--policies: unknown {sorted(unknown)}; choose from fixed,tuned,upstream,ours")
    notes = []
    # Tuned fixed chunks share the deployment's token budget (max_num_batched_tokens = --chunk), as CPP does.
    sweep = sorted({c for c in parse_chunks(args.sweep, "--sweep") if c <= args.chunk} | {args.chunk})
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
    results: Sequence[dict[str, Any]], num_stages: int, chunk_tokens: int, wanted: set[str]
) -> tuple[list[Figures], Figures | None, Figures | None, list[str]]:
    """Rows to print: vLLM fixed, tuned fixed, upstream, ours; plus failures as notes."""
    notes, fixed_rows = [], []
    rows: list[Figures] = []
    upstream = ours = None
    for result in results:
        if "error" in result:
            notes.append(f"{result['policy']['name']}: FAILED {result['error']}")
            continue
        if result.get("start_up"):
            notes.append(f"{result['policy']['name']}: {result['start_up']}")
        figures = figures_from_result(result, num_stages)
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
    if default is not None and "fixed" in wanted:
        rows.append(Figures(**{**asdict(default), "name": f"vllm-fixed-{chunk_tokens}"}))
    rows += [f for f in (tuned, upstream, ours) if f is not None]
    return rows, tuned, upstream, notes


def case_optimum(surface, setup: pol.Setup, max_chunk_tokens: int) -> Optimum | None:
    """The least TTFT of a one-prompt case with chunks within the token budget (twin/optimum.py); None otherwise."""
    requests = setup.workload.requests
    if len(requests) != 1:
        return None
    shares = None
    if setup.layers:
        shares = [n / sum(setup.layers) for n in setup.layers]
    return optimum(surface, requests[0].prompt_tokens, setup.num_stages, shares, max_chunk_tokens=max_chunk_tokens)


def run_problems(results: Sequence[dict[str, Any]], num_stages: int) -> list[str]:
    """Why a case's figures cannot be trusted: a policy failed, ran incomplete or gave an invalid figure."""
    problems = []
    for result in results:
        name = result["policy"]["name"]
        if "error" in result:
            problems.append(f"{name}: failed")
            continue
        figures = figures_from_result(result, num_stages)
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
    stage_counts = parse_counts(args.stages, "--stages")
    layers = tuple(parse_counts(args.layers, "--layers")) if args.layers else None
    if layers and (any(p != len(layers) for p in stage_counts) or min(layers) <= 0):
        raise ValueError(f"--layers {args.layers}: give one positive layer count per stage for --stages {args.stages}")
    print(f"surface: {surface.describe()}")
    if args.tune:
        from .tune import run_tune

        return run_tune(args, surface_spec, stage_counts, layers)
    policies, notes = comparison_policies(args)
    if not policies:
        raise ValueError(f"--policies {args.policies}: nothing to run ({'; '.join(notes)})")
    wanted = {w.strip() for w in args.policies.split(",")}
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
        rows, tuned, upstream, case_notes = summarize_case(results, setup.num_stages, args.chunk, wanted)
        best = case_optimum(surface, setup, args.chunk)
        problems += [
            f"{setup.workload.name} P={setup.num_stages}: {p}" for p in run_problems(results, setup.num_stages)
        ]
        title = f"\n== {setup.workload.name}, P={setup.num_stages}, {len(setup.workload.requests)} request(s) =="
        show_tpot = any(r.max_output_tokens > 1 for r in setup.workload.requests)
        print(format_table(title, rows, tuned, upstream, show_tpot, best.lower_ms if best else None))
        if best is not None:
            print(
                f"  optimum: {best.lower_ms / 1000:.3f} s ({len(best.chunks)} chunks, first {best.chunks[0]} tokens"
                f"{', certified' if best.certified else ', best found'}); under the P-in-flight rule"
                f" {best.in_flight_ms / 1000:.3f} s ({best.in_flight_ms / best.lower_ms:.3f}x)"
            )
        for note in notes + case_notes:
            print(f"  note: {note}")
        dump.append(
            {
                "workload": setup.workload.name,
                "stages": setup.num_stages,
                "rows": [{**asdict(r), "vs_optimum": r.ttft_mean_ms / best.lower_ms if best else None} for r in rows],
                "optimum": best.to_json() if best else None,
            }
        )
        if args.plot:
            from .plot import plot_case

            for path in plot_case(args.plot, setup, results, rows, args.chunk):
                print(f"  wrote {path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dump, indent=1))
    if problems:
        print(f"cpp-twin: {len(problems)} problem(s); these figures are not to be trusted:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0
