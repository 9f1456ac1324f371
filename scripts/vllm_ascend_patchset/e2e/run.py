"""Servers, the TTFT client, the smoke test and the benchmark of end-to-end CPP on the CPU engine.

    python -m vllm_ascend_patchset.e2e.run smoke   # CI: ours profiles, serves, restarts from the cache
    python -m vllm_ascend_patchset.e2e.run bench   # fixed chunks, upstream's CPP and ours, side by side

Run with the e2e environment's Python (scripts/setup_e2e_env.sh). Every server binds
127.0.0.1, runs in a session of its own, is bounded in time, and is stopped through its
own PID (its process group), then checked for leftover processes and /dev/shm files. A
failure prints the tail of the server's log.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..twin import policies as twin_policies
from ..twin.policies import ROOT, SCRIPTS_DIR, Policy
from .model import TINY_QWEN3, write_tiny_qwen3

sys.path.insert(0, str(SCRIPTS_DIR / "bench"))
import serve_ab  # noqa: E402  (scripts/bench: start, wait for /health, stop a server's process group)

E2E_CACHE = Path(os.environ.get("E2E_CACHE", ROOT / ".cache" / "e2e"))
PIPELINE_STAGES = 2
MAX_MODEL_LEN = 33792  # a 32k prompt plus its output
READY_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
STOP_GRACE_S = 60.0
OURS_SCHEDULER = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
UPSTREAM_SCHEDULER = OURS_SCHEDULER  # the same path in the pristine tree
WORKER_EXTENSION = "vllm_ascend_patchset.e2e.worker.CppCpuWorker"
# Fewer profiling runs than the NPU defaults (64 sizes x 3 + history): two CPU cores.
OURS_PROFILE = {"profile_points": 32, "profile_repeats": 3, "profile_history_points": 4}
# "[CPP] latency model from SOURCE: ..." (and the older "[CPP] latency model t = ...; from SOURCE")
PROFILED_RE = re.compile(r"\[CPP\] latency model (?:.* )?from (profiled [^:\n]*|cache [^:\n]*)")
WORKER_PROFILE_MARK = "[CPP e2e] start-up profiling run"
UPSTREAM_PROFILED_MARK = "[ProfilingChunk] Profiling completed successfully"
UPSTREAM_PROFILED = "profiled (upstream's start-up profiling)"
CPP_LOG_MARK = "[CPP] "  # ours' decisions (the e2e workers' per-run lines are "[CPP e2e]")


# The servers run the twin's policies, so that names and settings match its prediction.
fixed = twin_policies.fixed
upstream = twin_policies.upstream


# The smoke checks the path (profile, accept, save, adopt), not how a CPU's tiniest steps fit:
# under ~100 tokens a CPU step is no fixed cost plus linear work, and 32 sizes from 64
# tokens put that bend at the edge of the range the fit is judged on. 16 sizes start at 128.
SMOKE_PROFILE_POINTS = 16


def ours(chunk_tokens: int, **overrides: int) -> Policy:
    """Ours with the e2e profiling settings (the twin predicts with the same)."""
    return twin_policies.ours(chunk_tokens, **{**OURS_PROFILE, **overrides})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(
    policy: Policy, model_dir: Path, port: int, profile_dir: Path, max_model_len: int = MAX_MODEL_LEN
) -> list[str]:
    """``vllm serve`` for the twin's ``policy`` on the CPU engine, PP = 2, chunked prefill, 127.0.0.1 only."""
    cpp = {"fixed": "none"}.get(policy.kind, policy.kind)
    command = [sys.executable, "-m", "vllm_ascend_patchset.e2e.serve", "--cpp", cpp, "--", str(model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-qwen3"]
    command += ["--pipeline-parallel-size", str(PIPELINE_STAGES), "--enable-chunked-prefill"]
    command += ["--max-num-batched-tokens", str(policy.max_num_batched_tokens)]
    command += ["--max-model-len", str(max_model_len)]
    command += ["--max-num-seqs", "16", "--enforce-eager", "--no-async-scheduling", "--disable-log-stats"]
    command += ["--dtype", "float32"]  # bfloat16 has no native kernels on an AVX2-only CPU
    if policy.kind != "fixed":
        config = dict(policy.additional_config["profiling_chunk_config"])
        if policy.kind == "ours":
            config["cache_dir"] = str(profile_dir)  # the twin's runs keep none; a server keeps its profile
        command += ["--scheduler-cls", OURS_SCHEDULER, "--worker-extension-cls", WORKER_EXTENSION]
        command += ["--additional-config", json.dumps({"profiling_chunk_config": config})]
    return command


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="2",  # GiB
        VLLM_CPU_OMP_THREADS_BIND="0|1",  # one core per pipeline stage
        VLLM_CACHE_ROOT=str(E2E_CACHE / "vllm-cache"),
        VLLM_PLUGINS="",  # the pristine tree carries vllm_ascend's dist-info: never load its NPU platform
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SCRIPTS_DIR), env.get("PYTHONPATH", "")) if p)
    return env


class Server:
    """One ``vllm serve`` process group with its log; a context manager that always stops it."""

    def __init__(
        self,
        policy: Policy,
        model_dir: Path,
        log_path: Path,
        profile_dir: Path,
        extra_env: dict | None = None,
        max_model_len: int = MAX_MODEL_LEN,
    ) -> None:
        self.policy = policy
        self.extra_env = extra_env or {}
        self.port = free_port()
        self.log_path = log_path
        self.command = serve_command(policy, model_dir, self.port, profile_dir, max_model_len)
        self.proc: subprocess.Popen | None = None
        self._shm_before: set[str] = set()
        self.leftovers: list[str] = []

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._shm_before = _shm_entries()
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**server_env(), **self.extra_env},
            start_new_session=True,
        )
        log.close()
        started = time.monotonic()
        try:
            serve_ab.wait_ready(self.proc, f"http://127.0.0.1:{self.port}/health", READY_TIMEOUT_S, poll_s=2.0)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - started
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGINT to the process group (vLLM's own clean shutdown), SIGKILL after a grace period."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        serve_ab.stop_server(self.proc, signal.SIGINT, grace_s=STOP_GRACE_S, kill_wait_s=30.0)
        deadline = time.monotonic() + 30.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)  # workers exit a moment after the API server
        if _group_alive(pgid):
            self.leftovers.append(f"processes of group {pgid} still running after the stop")
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        new_shm = sorted(_shm_entries() - self._shm_before)
        if new_shm:
            self.leftovers.append(f"/dev/shm entries left: {new_shm}")
        self.proc = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def prompt_ids(length: int, index: int, vocab_size: int, seed: int = 0) -> list[int]:
    """Unique token ids for request ``index`` (no prefix-cache hits between requests)."""
    rng = random.Random(f"{seed}:{length}:{index}")
    return [rng.randrange(3, vocab_size) for _ in range(length)]


def complete(port: int, token_ids: list[int], max_tokens: int) -> dict[str, float]:
    """One streamed completion: TTFT and TPOT in seconds, as the client sees them."""
    body = json.dumps(
        {"model": "tiny-qwen3", "prompt": token_ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
         "ignore_eos": True, "stream": True, "temperature": 0.0}
    )  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    try:
        started = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"completion failed: HTTP {response.status}: {response.read()[:500]!r}")
        token_times = []
        for raw in response:
            line = raw.strip()
            if line.startswith(b"data:") and line != b"data: [DONE]":
                chunk = json.loads(line[5:])
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    token_times.append(time.perf_counter() - started)
    finally:
        conn.close()
    if not token_times:
        raise RuntimeError("completion returned no tokens")
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else 0.0
    return {"ttft_s": token_times[0], "tpot_s": tpot, "tokens": len(token_times)}


def profile_source(log: str) -> str | None:
    """Where the CPP latency model came from, per the engine's log line (None: no model)."""
    match = PROFILED_RE.search(log)
    if match:
        return match.group(1)
    return UPSTREAM_PROFILED if UPSTREAM_PROFILED_MARK in log else None


# --------------------------------------------------------------------------- smoke
def smoke(args: argparse.Namespace) -> int:
    """Ours comes up, profiles, serves a long prompt; a restart adopts the cache; both stop cleanly."""
    started = time.monotonic()
    work = E2E_CACHE / "smoke"
    shutil.rmtree(work, ignore_errors=True)
    model_dir = write_tiny_qwen3(E2E_CACHE / "model")
    profile_dir = work / "profiles"
    policy = ours(args.chunk, profile_points=SMOKE_PROFILE_POINTS)
    # The context the prompt needs, not the bench's 32k: the profile's history range, where
    # the fit must hold, is what the smoke serves.
    max_model_len = args.prompt_tokens + 1024
    failures: list[str] = []
    for attempt, expect in ((1, "profiled"), (2, "cache")):
        server = Server(policy, model_dir, work / f"server-{attempt}.log", profile_dir, max_model_len=max_model_len)
        try:
            with server:
                log = server.log_text()
                source = profile_source(log)
                worker_runs = log.count(WORKER_PROFILE_MARK)
                result = complete(server.port, prompt_ids(args.prompt_tokens, attempt, TINY_QWEN3["vocab_size"]), 4)
                print(
                    f"smoke {attempt}: ready in {server.ready_s:.0f} s; latency model from {source}; "
                    f"workers logged {worker_runs} profiling runs; {args.prompt_tokens}-token prompt: "
                    f"TTFT {result['ttft_s']:.2f} s, {result['tokens']} tokens",
                    flush=True,
                )
                if source is None or not source.startswith(expect):
                    failures.append(f"start {attempt}: expected a latency model from {expect}, got {source}")
                if (worker_runs == 0) == (expect == "profiled"):
                    failures.append(f"start {attempt}: {worker_runs} worker profiling runs logged")
        except Exception as error:
            failures.append(f"start {attempt}: {type(error).__name__}: {error}")
        failures += [f"start {attempt}: {leftover}" for leftover in server.leftovers]
        if failures:
            print(f"--- tail of {server.log_path} ---\n{server.log_tail()}", file=sys.stderr)
            cpp_lines = [line for line in server.log_text().splitlines() if CPP_LOG_MARK in line]
            print("--- its CPP lines ---", *cpp_lines, sep="\n", file=sys.stderr)  # why no model, last
            break
    saved = sorted(p.name for p in profile_dir.glob("cpp-profile-*.json"))
    print(f"smoke: profiles saved {saved}; {time.monotonic() - started:.0f} s")
    for failure in failures:
        print(f"smoke: FAIL {failure}", file=sys.stderr)
    print(f"{2 - min(2, len(failures))} passed, {min(2, len(failures))} failed")
    return 1 if failures else 0


# --------------------------------------------------------------------------- uneven stages
TIMED_STEP_RE = re.compile(r"\[CPP\] batch of \d+ requests, (\d+) tokens: predicted ([\d.]+) ms, measured ([\d.]+) ms")
PROFILE_RUN_RE = re.compile(r"start-up profiling run: (\d+) tokens after (\d+), ([\d.]+) ms \(rank (\d+)\)")


def uneven_stages(args: argparse.Namespace) -> int:
    """Ours with uneven stages: what the timed steps report against the profile's prediction.

    The profile records the slowest stage's time; a timed step must report the same
    quantity. Prints each rank's profiled time of the base chunk (how uneven the stages
    are) and measured / predicted over the timed steps (about 1 when both are the
    slowest stage; the heavy stage's share of it if only the last stage were timed).
    """
    work = E2E_CACHE / "uneven"
    shutil.rmtree(work, ignore_errors=True)
    model_dir = write_tiny_qwen3(E2E_CACHE / "model")
    extra_env = {"VLLM_PP_LAYER_PARTITION": args.layers, "VLLM_LOGGING_LEVEL": "DEBUG"}
    server = Server(ours(args.chunk), model_dir, work / "server.log", work / "profiles", extra_env)
    try:
        with server:
            result = complete(server.port, prompt_ids(args.prompt_tokens, 0, TINY_QWEN3["vocab_size"]), 4)
    except Exception as error:
        print(f"uneven: FAIL {type(error).__name__}: {error}\n{server.log_tail()}", file=sys.stderr)
        return 1
    log = server.log_text()
    base_ms: dict[int, list[float]] = {}
    for chunk, history, ms, rank in PROFILE_RUN_RE.findall(log):
        if int(chunk) == args.chunk and int(history) == 0:
            base_ms.setdefault(int(rank), []).append(float(ms))
    steps = [(int(t), float(p), float(m)) for t, p, m in TIMED_STEP_RE.findall(log)]
    print(f"uneven stages {args.layers}: TTFT {result['ttft_s']:.2f} s for {args.prompt_tokens} tokens")
    for rank, values in sorted(base_ms.items()):
        print(f"  rank {rank}: profiled {args.chunk}-token chunk, median {statistics.median(values):.1f} ms")
    if not steps:
        print("uneven: FAIL no timed step reached the scheduler", file=sys.stderr)
        return 1
    ratios = [measured / predicted for _, predicted, measured in steps if predicted > 0]
    print(f"  {len(steps)} timed steps: measured / predicted median {statistics.median(ratios):.3f}")
    for tokens, predicted, measured in steps[:8]:
        print(f"    {tokens} tokens: predicted {predicted:.1f} ms, measured {measured:.1f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm_ascend_patchset.e2e.run", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_smoke = sub.add_parser("smoke", help="CI smoke test: profile, serve, restart from the cache, stop cleanly")
    p_smoke.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens / CPP base chunk")
    p_smoke.add_argument("--prompt-tokens", type=int, default=16384)
    p_uneven = sub.add_parser("uneven", help="uneven stages: timed steps report the slowest stage")
    p_uneven.add_argument("--layers", default="3,1", help="layers per stage (VLLM_PP_LAYER_PARTITION)")
    p_uneven.add_argument("--chunk", type=int, default=2048)
    p_uneven.add_argument("--prompt-tokens", type=int, default=16384)
    p_ds = sub.add_parser("ds-smoke", help="dual stream at TP=2 and, with CPP, at PP=2 x TP=2: outputs, counters")
    p_ds.add_argument("--cases", default="tp2,pp2-tp2", help="comma-separated: tp2, pp2-tp2")
    p_ds_bench = sub.add_parser("ds-bench", help="dual stream's prefill time on / off at TP=2 over an emulated link")
    from . import bench, ds_smoke

    ds_smoke.add_bench_arguments(p_ds_bench)
    p_bench = sub.add_parser("bench", help="fixed chunks, upstream's CPP and ours side by side, with the twin")

    bench.add_arguments(p_bench)
    args = parser.parse_args(argv)
    if args.command == "smoke":
        return smoke(args)
    if args.command == "ds-smoke":
        return ds_smoke.smoke([c.strip() for c in args.cases.split(",") if c.strip()])
    if args.command == "ds-bench":
        return ds_smoke.bench(args)
    if args.command == "uneven":
        return uneven_stages(args)
    return bench.run(args)


if __name__ == "__main__":
    sys.exit(main())
