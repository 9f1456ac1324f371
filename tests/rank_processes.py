"""One process per rank for the gloo tests: start them, bound them in time, collect their JSON results.

``run_ranks(module, world, work, timeout_s, extra_args)`` runs
``python -m MODULE RANK WORLD PORT *EXTRA_ARGS WORK/rankN.json`` for every rank with the
assembled tree, tests/ and scripts/ on the path, never leaves a rank running (a rank still running
at the deadline, a hung collective, is killed and marked ``timed_out``), and returns each
rank's result with its ``stderr_tail``; a rank that wrote none, or reported ``errors``,
fails the test with its stderr or its errors.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import conftest
from vllm_ascend_patchset.paths import SCRIPTS_DIR, TESTS_DIR

FULL_TIER = "every rank runs vLLM and torch in a process of its own"  # tiers.py: what it needs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(module: str, world: int, work: Path, timeout_s: float, extra_args: Sequence[str] = ()) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(conftest.ASSEMBLED),
            str(TESTS_DIR),
            str(SCRIPTS_DIR),
            env.get("PYTHONPATH", ""),
        ]
    )
    port = free_port()
    procs = []
    for rank in range(world):
        cmd = [
            sys.executable,
            "-m",
            module,
            str(rank),
            str(world),
            str(port),
            *extra_args,
            str(work / f"rank{rank}.json"),
        ]
        procs.append(subprocess.Popen(cmd, env=env, cwd=work, stderr=subprocess.PIPE))
    stderr, timed_out = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        for rank, proc in enumerate(procs):
            try:
                out = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
            except subprocess.TimeoutExpired:
                timed_out.add(rank)
                proc.kill()
                out = proc.communicate()[1]
            stderr.append(out.decode(errors="replace"))
    finally:
        for proc in procs:  # never leave a rank behind (a hung collective)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for rank in range(world):
        path = work / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result:\n{stderr[rank][-4000:]}"
        result = json.loads(path.read_text())
        assert not result["errors"], f"rank {rank} failed:\n" + "\n".join(result["errors"])
        result["timed_out"] = rank in timed_out
        result["stderr_tail"] = stderr[rank][-4000:]
        results.append(result)
    return results
