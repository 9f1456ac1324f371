"""``--tune``: search the CPP scheduler's base chunk and smooth factor on a surface.

Every candidate (base chunk x smooth factor, the default among them) runs on the same
cases (stage counts x workloads) in one invocation. A candidate's score is the mean over
cases of its mean TTFT divided by the default's; the lowest score wins, and a candidate
must beat the default (score < 1) to be recommended, so the recommendation is never
measured worse than the default on the cases it was tuned on.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from . import policies as pol
from .options import build_workloads, parse_chunks, parse_smooth_factors
from .report import figures_from_result

DEFAULT_BASE_CHUNKS = (4096, 6144, 8192, 12288, 16384)
DEFAULT_SMOOTH_FACTORS = (0.5, 0.75, 1.0)
Case = tuple[pol.Setup, list[pol.Policy]]  # what run_cases takes: a setup and the policies to run on it


@dataclass(frozen=True)
class Candidate:
    kind: str
    base_chunk_tokens: int
    smooth_factor: float | None  # None: the scheduler's own default

    @property
    def name(self) -> str:
        smooth = "default" if self.smooth_factor is None else f"{self.smooth_factor:g}"
        return f"{self.kind}-base{self.base_chunk_tokens}-smooth{smooth}"

    def policy(self) -> pol.Policy:
        options = {} if self.smooth_factor is None else {"smooth_factor": self.smooth_factor}
        make = pol.ours if self.kind == "ours" else pol.upstream
        made = make(self.base_chunk_tokens, **options)
        return pol.Policy(self.name, made.kind, made.max_num_batched_tokens, made.additional_config)

    def serve_flags(self) -> str:
        """What to pass to ``vllm serve`` (without the twin's own no-cache setting)."""
        config = self.policy().additional_config
        config = {key: {k: v for k, v in value.items() if k not in pol.TWIN_ONLY_KEYS} for key, value in config.items()}
        return f"--max-num-batched-tokens {self.base_chunk_tokens} --additional-config '{json.dumps(config)}'"


@dataclass(frozen=True)
class TuneResult:
    default: Candidate
    best: Candidate
    ttft_ms: dict[str, list[float]]  # candidate name -> mean TTFT per case
    case_names: list[str]

    def score(self, candidate: Candidate) -> float:
        own, base = self.ttft_ms[candidate.name], self.ttft_ms[self.default.name]
        return float(sum(o / b for o, b in zip(own, base, strict=True)) / len(own))


def choose(default: Candidate, candidates: Sequence[Candidate], ttft_ms: dict[str, list[float]]) -> Candidate:
    """The lowest score, if it beats the default; the default otherwise (also on any failure)."""
    base = ttft_ms[default.name]
    best, best_score = default, 1.0
    for candidate in candidates:
        own = ttft_ms.get(candidate.name)
        if not own or any(math.isnan(v) for v in own):
            continue
        score = sum(o / b for o, b in zip(own, base, strict=True)) / len(own)
        if score < best_score - 1e-12:
            best, best_score = candidate, score
    return best


def grid(kind: str, default_base: int, base_chunks: Sequence[int], smooth_factors: Sequence[float]) -> list[Candidate]:
    """The default (the scheduler's own settings at ``default_base``) first, then every pair."""
    default = Candidate(kind, default_base, None)
    return [default] + [Candidate(kind, b, s) for b in sorted(set(base_chunks)) for s in sorted(set(smooth_factors))]


def tune(
    setups: Sequence[pol.Setup],
    kind: str,
    default_base: int,
    base_chunks: Sequence[int],
    smooth_factors: Sequence[float],
    log_dir=None,
) -> TuneResult:
    candidates = grid(kind, default_base, base_chunks, smooth_factors)
    results = pol.run_cases(tune_cases(setups, candidates), log_dir)
    return tune_result(setups, candidates, results)


def tune_cases(
    setups: Sequence[pol.Setup], candidates: Sequence[Candidate]
) -> list[tuple[pol.Setup, list[pol.Policy]]]:
    """Every candidate on every setup: what ``tune`` runs (``run_cases``' argument)."""
    policies = [c.policy() for c in candidates]
    return [(setup, policies) for setup in setups]


def tune_result(
    setups: Sequence[pol.Setup], candidates: Sequence[Candidate], results: Sequence[Sequence[dict]]
) -> TuneResult:
    """The scores of ``candidates`` (the default first, as ``grid`` gives them) from the results of ``tune_cases``."""
    default = candidates[0]
    ttft_ms: dict[str, list[float]] = {c.name: [] for c in candidates}
    for setup, case_results in zip(setups, results, strict=True):
        for candidate, result in zip(candidates, case_results, strict=True):
            if "error" in result:
                ttft_ms[candidate.name].append(math.nan)
                continue
            figures = figures_from_result(result, setup.num_stages)
            ttft_ms[candidate.name].append(math.nan if figures.problems else figures.ttft_mean_ms)
    if any(math.isnan(v) for v in ttft_ms[default.name]):
        raise RuntimeError(f"the default setting {default.name} failed in the twin; see --log-dir")
    best = choose(default, candidates[1:], ttft_ms)
    names = [f"{s.workload.name} P={s.num_stages}" for s in setups]
    return TuneResult(default, best, ttft_ms, names)


def run_tune(args: argparse.Namespace, surface_spec: str, stage_counts: list[int], layers) -> int:
    kind = "ours" if pol.ours_available() and "ours" in args.policies else "upstream"
    if kind == "upstream" and "ours" in args.policies:
        print("note: our scheduler is not assembled (make assemble); tuning upstream's CPP instead")
    setups = [
        pol.Setup(surface_spec, p, w, args.seed, layers, args.noise, args.async_scheduling, args.drift)
        for p in stage_counts
        for w in build_workloads(args, surface_spec, p)
    ]
    bases = parse_chunks(args.tune_base_chunks or ",".join(map(str, DEFAULT_BASE_CHUNKS)), "--tune-base-chunks")
    smooths = parse_smooth_factors(
        args.tune_smooth_factors or ",".join(map(str, DEFAULT_SMOOTH_FACTORS)), "--tune-smooth-factors"
    )
    result = tune(setups, kind, args.chunk, bases, smooths, args.log_dir)
    print(f"tuned {kind} CPP over {len(result.ttft_ms)} settings on: {', '.join(result.case_names)}")
    for label, candidate in (("default", result.default), ("recommended", result.best)):
        print(f"{label}: {candidate.serve_flags()}")
        for case, ttft in zip(result.case_names, result.ttft_ms[candidate.name], strict=True):
            ratio = ttft / result.ttft_ms[result.default.name][result.case_names.index(case)]
            print(f"  {case}: mean TTFT {ttft / 1000:.3f} s ({ratio:.3f}x default)")
    if result.best == result.default:
        print("no setting beat the default on these cases: keep the default")
    failed = [name for name, ttft in result.ttft_ms.items() if any(math.isnan(v) for v in ttft)]
    if failed:
        print(f"cpp-twin: {len(failed)} setting(s) failed or ran incomplete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
