"""The e2e servers and their client: ``vllm serve`` on the CPU engine for a twin policy, and TTFT as a client sees it.

Every server binds 127.0.0.1, runs in a session of its own, is bounded in time, and is
stopped through its own PID (its process group), then checked for leftover processes
and /dev/shm files. The servers run the twin's policies (``twin/policies.py``), so that
names and settings match the twin's prediction. Run with the e2e environment's Python
(scripts/setup_e2e_env.sh).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..paths import BENCH_DIR, DEFAULT_CACHE, SCRIPTS_DIR
from ..twin import policies as twin_policies
from ..twin.policies import Policy

sys.path.insert(0, str(BENCH_DIR))
import serve_ab  # noqa: E402  (scripts/bench: start, wait for /health, stop a server's process group)

E2E_CACHE = Path(os.environ.get("E2E_CACHE", DEFAULT_CACHE / "e2e"))
PIPELINE_STAGES = 2
MAX_MODEL_LEN = 33792  # a 32k prompt plus its output
MAX_NUM_SEQS = 16  # every server's: vLLM needs max_num_batched_tokens >= it
READY_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
STOP_GRACE_S = 60.0
# vLLM's default (0) aborts: the engine core is killed at once and its workers' shared memory stays
# in /dev/shm. A few seconds let it stop its workers, which remove theirs.
SHUTDOWN_TIMEOUT_S = 10
# vLLM's executor, when its workers outlive its fixed 4 s grace (then it signals them)
WORKERS_SIGNALLED = "workers still running after grace period"
_DIST_INIT_PORT = re.compile(r"distributed_init_method=\S*?:(\d+)\b")  # the workers' init line
_CPU_SHM_MARK = "-cpushm_"  # the CPU engine's shared-memory communicator segments
OURS_SCHEDULER = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
UPSTREAM_SCHEDULER = OURS_SCHEDULER  # the same path in the pristine tree
WORKER_EXTENSION = "vllm_ascend_patchset.e2e.worker.CppCpuWorker"
# Ours' profiling settings on the CPU engine (the twin predicts with the same); docs/e2e.md gives the runs.
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


def ours(chunk_tokens: int, **overrides: int) -> Policy:
    """Ours with the e2e profiling settings (the twin predicts with the same)."""
    return twin_policies.ours(chunk_tokens, **{**OURS_PROFILE, **overrides})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(
    policy: Policy,
    model_dir: Path,
    port: int,
    profile_dir: Path,
    max_model_len: int = MAX_MODEL_LEN,
    extra_args: tuple[str, ...] = (),
) -> list[str]:
    """``vllm serve`` for the twin's ``policy`` on the CPU engine, PP = 2, chunked prefill, 127.0.0.1 only.

    ``extra_args`` come last, so a later ``--max-num-seqs`` (say) replaces the default above it."""
    cpp = {"fixed": "none"}.get(policy.kind, policy.kind)
    command = [sys.executable, "-m", "vllm_ascend_patchset.e2e.serve", "--cpp", cpp, "--", str(model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-qwen3"]
    command += ["--pipeline-parallel-size", str(PIPELINE_STAGES), "--enable-chunked-prefill"]
    command += ["--max-num-batched-tokens", str(policy.max_num_batched_tokens)]
    command += ["--max-model-len", str(max_model_len)]
    command += ["--max-num-seqs", str(MAX_NUM_SEQS), "--enforce-eager", "--no-async-scheduling", "--disable-log-stats"]
    command += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    command += ["--dtype", "float32"]  # bfloat16 has no native kernels on an AVX2-only CPU
    # Every server gets the worker extension: its clock runs only on steps a scheduler marks (step_log).
    command += ["--worker-extension-cls", WORKER_EXTENSION]
    if policy.kind != "fixed":
        config = dict(policy.additional_config["profiling_chunk_config"])
        if policy.kind == "ours":
            config["cache_dir"] = str(profile_dir)  # the twin's runs keep none; a server keeps its profile
        command += ["--scheduler-cls", OURS_SCHEDULER]
        command += ["--additional-config", json.dumps({"profiling_chunk_config": config})]
    return command + list(extra_args)


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


class ServerProcess:
    """One server process group with its log; a context manager that always stops it.

    ``command_for_port`` gives the command line for the free port picked here.
    """

    def __init__(
        self, command_for_port: Callable[[int], list[str]], log_path: Path, extra_env: dict | None = None
    ) -> None:
        self.extra_env = extra_env or {}
        self.port = free_port()
        self.log_path = log_path
        self.command = command_for_port(self.port)
        self.proc: subprocess.Popen | None = None
        self._shm_before: set[str] = set()
        self.leftovers: list[str] = []  # what a clean stop must not leave
        self.notes: list[str] = []  # what vLLM's own shutdown left, and the stop removed

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
        if new_shm and not _group_alive(pgid):
            leftovers, note = shm_after_stop(new_shm, self.log_text(), _remove_shm)
            self.leftovers += leftovers
            if note:
                self.notes.append(note)
                print(f"note: {note}", file=sys.stderr)
        elif new_shm:
            self.leftovers.append(f"/dev/shm entries left: {new_shm}")
        self.proc = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class Server(ServerProcess):
    """``vllm serve`` for one of the twin's policies (``serve_command``): CPU engine, PP = 2."""

    def __init__(
        self,
        policy: Policy,
        model_dir: Path,
        log_path: Path,
        profile_dir: Path,
        extra_env: dict | None = None,
        max_model_len: int = MAX_MODEL_LEN,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            lambda port: serve_command(policy, model_dir, port, profile_dir, max_model_len, extra_args),
            log_path,
            extra_env,
        )
        self.policy = policy


def shm_after_stop(new_entries: list[str], log_text: str, remove: Callable[[list[str]], None]) -> tuple[list[str], str]:
    """What a stopped server left in /dev/shm: (leftovers, a note), the engine's own segments removed.

    The CPU engine's shared-memory communicator names its segments after the distributed
    init port its workers log (``PORT-GROUP-cpushm_RANK``), so the segments of this server,
    and only they, are known. vLLM's executor gives its workers 4 s to exit and then signals
    them (it logs ``WORKERS_SIGNALLED``); signalled workers leave their segments. On a busy
    2-core host the four workers of PP = 2 x TP = 2 can need longer: vLLM's own shutdown, not
    a fault of the server's code, so it is a note. Segments left by workers that exited on
    their own, or entries of another name, are leftovers. The server's segments are removed
    either way: its processes are gone, and they hold memory.
    """
    ports = set(_DIST_INIT_PORT.findall(log_text))
    owned = [name for name in new_entries if name.split("-", 1)[0] in ports and _CPU_SHM_MARK in name]
    others = [name for name in new_entries if name not in owned]
    if owned:
        remove(owned)
    leftovers = [f"/dev/shm entries left: {others}"] if others else []
    if owned and WORKERS_SIGNALLED in log_text:
        note = (
            f"vLLM's executor signalled its workers after its 4 s grace; the {len(owned)} CPU-communicator "
            "segments they left in /dev/shm were removed"
        )
        return leftovers, note
    if owned:
        leftovers.append(f"/dev/shm entries left by workers that exited on their own (removed): {owned}")
    return leftovers, ""


def _remove_shm(names: list[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


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


def stream_completion(port: int, token_ids: list[int], max_tokens: int) -> tuple[list[float], dict[str, Any]]:
    """One streamed completion of exactly ``max_tokens`` tokens: the time of each streamed token, in seconds
    from the moment the request is sent, as the client sees it, and the usage the server reports at the end
    (with ``prompt_tokens_details.cached_tokens`` when it runs ``--enable-prompt-tokens-details``)."""
    body = json.dumps(
        {"model": "tiny-qwen3", "prompt": token_ids, "max_tokens": max_tokens, "min_tokens": max_tokens,
         "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0}
    )  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    usage: dict[str, Any] = {}
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
                usage = chunk.get("usage") or usage
    finally:
        conn.close()
    if not token_times:
        raise RuntimeError("completion returned no tokens")
    return token_times, usage


def stream_token_times(port: int, token_ids: list[int], max_tokens: int) -> list[float]:
    """``stream_completion``'s token times."""
    return stream_completion(port, token_ids, max_tokens)[0]


def complete(port: int, token_ids: list[int], max_tokens: int) -> dict[str, float]:
    """One streamed completion: TTFT and TPOT in seconds, as the client sees them."""
    token_times = stream_token_times(port, token_ids, max_tokens)
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else 0.0
    return {"ttft_s": token_times[0], "tpot_s": tpot, "tokens": len(token_times)}


def profile_source(log: str) -> str | None:
    """Where the CPP latency model came from, per the engine's log line (None: no model)."""
    match = PROFILED_RE.search(log)
    if match:
        return match.group(1)
    return UPSTREAM_PROFILED if UPSTREAM_PROFILED_MARK in log else None
