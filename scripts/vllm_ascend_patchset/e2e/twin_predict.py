"""The twin's prediction for the e2e benchmark's cases, from the profile the engine saved.

    python -m vllm_ascend_patchset.e2e.twin_predict --surface PROFILE.json --stages 2 \
        --prompts 16384,32768 --fixed 512,2048 --chunk 2048 --json OUT

Runs with the test environment's Python (the twin's, which has SciPy); prints and writes
``{policy: {prompt_tokens: ttft_mean_s}}`` for fixed chunks, upstream's CPP and ours, the
same policies and settings the real engine served.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..twin import policies as pol
from ..twin.report import figures_from_result
from ..twin.workloads import long_prompt
from . import servers


def predict(
    surface: str, stages: int, prompts: list[int], fixed: list[int], chunk: int, policies: set[str]
) -> dict[str, dict[int, float]]:
    wanted = [servers.fixed(c) for c in fixed] if "fixed" in policies else []
    if "upstream" in policies:
        wanted.append(servers.upstream(chunk))
    if "ours" in policies:
        wanted.append(servers.ours(chunk))  # the e2e profiling settings
    cases = [(pol.Setup(surface, stages, long_prompt(tokens)), wanted) for tokens in prompts]
    out: dict[str, dict[int, float]] = {}
    for tokens, results in zip(prompts, pol.run_cases(cases), strict=True):
        for policy, result in zip(wanted, results, strict=True):
            if "error" in result:
                raise RuntimeError(f"twin: {policy.name} at {tokens} tokens failed: {result['error']}")
            out.setdefault(policy.name, {})[tokens] = figures_from_result(result, stages).ttft_mean_ms / 1000.0
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm_ascend_patchset.e2e.twin_predict")
    p.add_argument("--surface", required=True)
    p.add_argument("--stages", type=int, required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--fixed", default="")
    p.add_argument("--chunk", type=int, required=True)
    p.add_argument("--policies", default="fixed,upstream,ours")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    prediction = predict(
        args.surface,
        args.stages,
        [int(v) for v in args.prompts.split(",")],
        [int(v) for v in args.fixed.split(",") if v],
        args.chunk,
        set(args.policies.split(",")),
    )
    args.json.write_text(json.dumps(prediction))
    print(json.dumps(prediction))
    return 0


if __name__ == "__main__":
    sys.exit(main())
