"""Which scheduler each policy runs, from which vllm_ascend tree, and the subprocess runner.

Policies (``kind``):

- ``fixed``: vLLM 0.23.0's own ``Scheduler`` with chunks of ``max_num_batched_tokens``
  (vLLM's chunked prefill). A sweep over chunk sizes gives "tuned fixed".
- ``upstream``: vllm-ascend v0.23.0's ``ProfilingChunkScheduler`` from the pristine
  pinned tree (never committed), with upstream's engine patch for profiling and timing.
- ``ours``: our ``ProfilingChunkScheduler`` from the assembled tree ``build/<target>``.

Both CPP schedulers import as ``vllm_ascend.core.scheduler_profiling_chunk``, so each
tree runs in its own subprocess (``worker``); the two subprocesses run side by side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import OVERLAY_DIR, PACKAGE, SCRIPTS_DIR, assembled_root
from ..trees import ASSEMBLED, PRISTINE, tree_root
from .ladder import ladder
from .workloads import Workload

OUR_SCHEDULER = OVERLAY_DIR / "core" / "scheduler_profiling_chunk.py"

TWIN_ONLY_KEYS = frozenset({"cache_dir"})  # set by the twin for its own runs, not advice for a server
FIXED_SWEEP_TOKENS = (128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
# 64 .. 32768 in 1-1.5-2 steps: what a user sweeps to find the fixed chunk that meets a TPOT bound
SLO_SWEEP_TOKENS = tuple(ladder(64, 32768))


@dataclass(frozen=True)
class Policy:
    name: str
    kind: str  # fixed | upstream | ours
    max_num_batched_tokens: int
    additional_config: dict[str, Any] = field(default_factory=dict, hash=False)
    # ours only: start from this saved profile's samples (an engine's), as a server restarting
    # from its cache does, instead of profiling the twin's surface
    start_profile: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "additional_config": self.additional_config,
            "start_profile": self.start_profile,
        }

    @property
    def tree(self) -> str:
        return ASSEMBLED if self.kind == "ours" else PRISTINE


def fixed(chunk_tokens: int, name: str | None = None) -> Policy:
    return Policy(name or f"fixed-{chunk_tokens}", "fixed", chunk_tokens)


def upstream(base_chunk_tokens: int, **options: Any) -> Policy:
    config = {"profiling_chunk_config": {"enabled": True, **options}}
    return Policy("upstream-cpp", "upstream", base_chunk_tokens, config)


def ours(base_chunk_tokens: int, **options: Any) -> Policy:
    # No profile cache: every twin run profiles its own surface, as a fresh server would.
    config = {"profiling_chunk_config": {"enabled": True, "cache_dir": "", **options}}
    return Policy("ours", "ours", base_chunk_tokens, config)


def ours_available() -> bool:
    """Our scheduler is in the overlay and the assembled tree carries exactly that file."""
    assembled = assembled_root() / PACKAGE / "core" / OUR_SCHEDULER.name
    return OUR_SCHEDULER.exists() and assembled.exists() and assembled.read_bytes() == OUR_SCHEDULER.read_bytes()


@dataclass(frozen=True)
class Setup:
    """Everything but the policy: the same for every policy of a comparison."""

    surface: str
    num_stages: int
    workload: Workload
    seed: int = 0
    layers: tuple[int, ...] | None = None
    noise_sigma: float = 0.0
    async_scheduling: bool = False
    drift: float = 0.0

    def case(self, policies: list[Policy]) -> dict[str, Any]:
        return {
            "surface": self.surface,
            "num_stages": self.num_stages,
            "workload": self.workload.to_json(),
            "seed": self.seed,
            "layers": list(self.layers) if self.layers else None,
            "noise_sigma": self.noise_sigma,
            "drift": self.drift,
            "async_scheduling": self.async_scheduling,
            "policies": [p.to_json() for p in policies],
        }


class WorkerFailed(RuntimeError):
    pass


def _run_worker(job: dict[str, Any], log_path: Path | None) -> list[list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="cpp-twin-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        env = dict(os.environ, VLLM_PLUGINS="", TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_ascend_patchset.twin.worker", str(job_path), str(result_path)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not result_path.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            raise WorkerFailed(f"twin worker for {job['tree']} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(result_path.read_text())["cases"]


def run_cases(cases: list[tuple[Setup, list[Policy]]], log_dir: Path | None = None) -> list[list[dict[str, Any]]]:
    """Run each case's policies on its setup: one subprocess per tree for all cases, side by side.

    Returns, per case, one result per policy in the order given (a result with an
    ``error`` key when that policy failed).
    """
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(
            f"vLLM is not importable by {sys.executable}; run the twin with the test environment's Python"
            " (.venv/bin/python, made by 'make venv')"
        )
    trees = sorted({p.tree for _, policies in cases for p in policies})
    jobs = {}
    for tree in trees:
        jobs[tree] = {
            "tree": str(tree_root(tree)),
            "cases": [setup.case([p for p in policies if p.tree == tree]) for setup, policies in cases],
        }
    with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
        futures = {
            tree: pool.submit(_run_worker, job, log_dir / f"worker-{tree}.log" if log_dir else None)
            for tree, job in jobs.items()
        }
        by_tree = {tree: future.result() for tree, future in futures.items()}
    out = []
    for index, (_, policies) in enumerate(cases):
        by_name = {r["policy"]["name"]: r for tree in trees for r in by_tree[tree][index]}
        out.append([by_name[p.name] for p in policies])
    return out
