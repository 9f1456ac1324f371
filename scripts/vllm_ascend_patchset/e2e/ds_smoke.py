"""Dual stream in vLLM's CPU engine: the smoke (``run ds-smoke``, in ``make e2e``); ``ds_bench`` times it.

Two cases, each served twice from the same tiny Qwen3 with the same prompts:

- ``tp2``: TP = 2, PP = 1; dual stream off, then on;
- ``pp2-tp2``: PP = 2 x TP = 2 (four ranks); CPP and dual stream both off, then both on.

The prompts go in one request, so every server schedules the same batches: the first
steps are prefills cut by the token budget, the next mix the finished prompts' decodes
with the rest of the prefills, the last are decodes. ``length_threshold`` is set, so
which batches split is decided by the batches alone, not by timings (with CPP on, any batch
of a prefill and another request splits: its batches follow a profile of this host). Checks:

- greedy outputs identical, off against on;
- the patch set's model class on every rank; with dual stream on, dual-stream batches > 0
  on every rank (every stage), none with it off;
- the gate's decisions (tokens, reason, split point) identical on the TP ranks of a stage;
- with CPP on, its latency model adopted and its plan logged;
- each server stops cleanly: no process of its group, no new /dev/shm entry left (vLLM's
  signalled workers' segments excepted and removed: servers.shm_after_stop).
"""

from __future__ import annotations

import http.client
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from . import servers as e2e
from .ds_env import LINK_ENV, REPORT_DIR_ENV
from .model import TINY_QWEN3, write_tiny_qwen3

DS_WORKER = "vllm_ascend_patchset.e2e.ds_worker.DsCpuWorker"
DS_CPP_WORKER = "vllm_ascend_patchset.e2e.ds_cpp_worker.DsCppCpuWorker"
MODEL_CLASS = "DualStreamQwen3ForCausalLM"
PROMPT_LENS = (200, 180, 160, 150, 140, 120)
# With CPP on, the batches follow its plan from a profile measured on a busy host: a profile whose
# fixed cost is small against its cost per token makes one prompt per batch the better plan at P = 2,
# beside the decodes of the prompts before it (a CI run saw 11 such batches of 65-123 tokens, none
# with a 64-token half). So that case cuts batches by request count (``half_batch``) and takes any
# split: every step after the second holds a prefill and a decode, whatever the plan, so every stage
# splits. The tp2 case keeps the default strategy on batches that do not depend on timings.
CPP_PROMPT_LENS = (120, 112, 104, 100, 96, 92, 88, 84, 80, 76, 72, 68)
CPP_DUAL_STREAM = {"split_strategy": "half_batch", "length_threshold": 1}
BUDGET = 512  # --max-num-batched-tokens: the prompts take two prefill steps, the second mixed with decodes
LENGTH_THRESHOLD = 64
MAX_TOKENS = 6
MAX_MODEL_LEN = 1024
# CPP with a small start-up profile (8 sizes, one history length besides 0, the median of 3): four ranks, two cores.
CPP_SMOKE = {"enabled": True, "profile_points": 8, "profile_repeats": 3, "profile_history_points": 1}
CASES = {"tp2": (2, 1), "pp2-tp2": (2, 2)}  # name: (TP, PP)


def serve_command(model_dir: Path, port: int, tp: int, pp: int, dual_stream: bool, cpp: dict | None,
                  cache_dir: Path, budget: int = BUDGET, length_threshold: int | None = LENGTH_THRESHOLD,
                  max_model_len: int = MAX_MODEL_LEN) -> list[str]:  # fmt: skip
    """``vllm serve`` on the CPU engine at TP x PP, dual stream on or off, CPP ours or none; 127.0.0.1 only."""
    command = [sys.executable, "-m", "vllm_ascend_patchset.e2e.serve", "--cpp", "ours" if cpp else "none", "--"]
    command += [str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-qwen3"]
    command += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp), "--enable-chunked-prefill"]
    command += ["--max-num-batched-tokens", str(budget), "--max-model-len", str(max_model_len)]
    command += ["--max-num-seqs", str(e2e.MAX_NUM_SEQS), "--enforce-eager", "--no-async-scheduling"]
    command += ["--disable-log-stats"]
    command += ["--shutdown-timeout", str(e2e.SHUTDOWN_TIMEOUT_S)]
    command += ["--dtype", "float32"]  # bfloat16 has no native kernels on an AVX2-only CPU
    dual = {"enabled": dual_stream, "length_threshold": length_threshold, "cache_dir": str(cache_dir / "ds")}
    additional: dict[str, Any] = {"dual_stream_config": dual}
    if cpp:
        dual.update(CPP_DUAL_STREAM)
        additional["profiling_chunk_config"] = {**cpp, "cache_dir": str(cache_dir / "cpp")}
        command += ["--scheduler-cls", e2e.OURS_SCHEDULER]
    command += ["--worker-extension-cls", DS_CPP_WORKER if cpp else DS_WORKER]
    command += ["--additional-config", json.dumps(additional)]
    return command


def server_env(ranks: int, report_dir: Path, link: str = "") -> dict[str, str]:
    env = {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(r % 2) for r in range(ranks)), REPORT_DIR_ENV: str(report_dir)}
    if link:
        env[LINK_ENV] = link
    return env


def smoke_prompts(
    lengths: tuple[int, ...] = PROMPT_LENS, vocab_size: int = TINY_QWEN3["vocab_size"]
) -> list[list[int]]:
    return [e2e.prompt_ids(length, i, vocab_size, seed=21) for i, length in enumerate(lengths)]


def complete_batch(port: int, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """Greedy completions of all ``prompts``, sent in one request (one arrival: the same batches every run)."""
    body = json.dumps({"model": "tiny-qwen3", "prompt": prompts, "max_tokens": max_tokens, "min_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0.0})  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=e2e.REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"completion failed: HTTP {response.status}: {payload[:500]!r}")
    choices = sorted(json.loads(payload)["choices"], key=lambda c: c["index"])
    return [c["text"] for c in choices]


def read_reports(report_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(report_dir.glob("rank*.json"), key=lambda p: int(p.stem[4:]))]


def check_reports(reports: list[dict], ranks: int, dual_stream: bool) -> list[str]:
    """What the workers' reports must show; one line per problem."""
    problems = []
    if len(reports) != ranks:
        return [f"{len(reports)} of {ranks} ranks wrote a report"]
    for r in reports:
        where = f"rank {r['rank']} (stage {r['stage']}, TP rank {r['tp_rank']})"
        if r["model_class"] != MODEL_CLASS:
            problems.append(f"{where}: model class {r['model_class']}, not {MODEL_CLASS}")
        if dual_stream and r["dual_stream_batches"] <= 0:
            problems.append(f"{where}: no dual-stream batch; reasons {sorted({d[1] for d in r['decisions']})}")
        if not dual_stream and r["dual_stream_batches"] != 0:
            problems.append(f"{where}: {r['dual_stream_batches']} dual-stream batches with dual stream off")
    for stage in sorted({r["stage"] for r in reports}):
        members = [r for r in reports if r["stage"] == stage]
        if any(m["decisions"] != members[0]["decisions"] for m in members):
            problems.append(f"stage {stage}: the TP ranks' gate decisions differ")
    return problems


def summary(reports: list[dict]) -> str:
    return "; ".join(
        f"rank {r['rank']} stage {r['stage']} tp {r['tp_rank']}: {r['dual_stream_batches']} dual-stream of "
        f"{len(r['decisions'])} forwards, splits {[d[2] for d in r['decisions'] if d[2]]}"
        for r in reports
    )


def run_case(name: str, tp: int, pp: int, model_dir: Path, work: Path) -> list[str]:
    failures: list[str] = []
    outputs: dict[bool, list[str]] = {}
    prompts = smoke_prompts(CPP_PROMPT_LENS if pp > 1 else PROMPT_LENS)
    for on in (False, True):
        label = f"{name} {'on' if on else 'off'}"
        cpp = CPP_SMOKE if on and pp > 1 else None
        report_dir = work / name / ("on" if on else "off")
        shutil.rmtree(report_dir, ignore_errors=True)
        report_dir.mkdir(parents=True)
        server = e2e.ServerProcess(
            lambda port, on=on, cpp=cpp: serve_command(model_dir, port, tp, pp, on, cpp, work / name / "cache"),
            report_dir / "server.log",
            server_env(tp * pp, report_dir),
        )
        try:
            with server:
                started = time.monotonic()
                outputs[on] = complete_batch(server.port, prompts, MAX_TOKENS)
                served_s = time.monotonic() - started
            reports = read_reports(report_dir)
            problems = check_reports(reports, tp * pp, on)
            if cpp and e2e.profile_source(server.log_text()) is None:
                problems.append("CPP logged no latency model / plan")
            cpp_line = next((line for line in server.log_text().splitlines() if "[CPP] latency model" in line), "")
            print(f"ds-smoke {label}: ready in {server.ready_s:.0f} s, served in {served_s:.1f} s; {summary(reports)}")
            if cpp_line:
                print(f"ds-smoke {label}: {cpp_line[cpp_line.index('[CPP]'):]}")
            failures += [f"{label}: {p}" for p in problems]
        except Exception as error:
            failures.append(f"{label}: {type(error).__name__}: {error}")
        failures += [f"{label}: {leftover}" for leftover in server.leftovers]
        if failures:
            print(f"--- tail of {server.log_path} ---\n{server.log_tail()}", file=sys.stderr)
            return failures
    same = [a == b for a, b in zip(outputs[False], outputs[True], strict=True)]
    print(f"ds-smoke {name}: greedy outputs identical off/on for {sum(same)} of {len(same)} prompts")
    if not all(same):
        failures.append(f"{name}: outputs differ for prompts {[i for i, s in enumerate(same) if not s]}: "
                        f"{[(outputs[False][i], outputs[True][i]) for i, s in enumerate(same) if not s]}")  # fmt: skip
    return failures


def smoke(cases: list[str]) -> int:
    """Runs ``cases`` in order and stops at the first that fails (the rest are reported as not run)."""
    unknown = [name for name in cases if name not in CASES]
    if unknown:
        print(f"ds-smoke: unknown case(s) {unknown}; the cases are {', '.join(CASES)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    work = e2e.E2E_CACHE / "ds-smoke"
    shutil.rmtree(work, ignore_errors=True)  # CPP profiles afresh, as from a clean clone
    model_dir = write_tiny_qwen3(e2e.E2E_CACHE / "model")
    failures: list[str] = []
    passed = 0
    for name in cases:
        tp, pp = CASES[name]
        failures = run_case(name, tp, pp, model_dir, work)
        if failures:
            break
        passed += 1
    for failure in failures:
        print(f"ds-smoke: FAIL {failure}", file=sys.stderr)
    print(f"ds-smoke: {time.monotonic() - started:.0f} s")
    failed = 1 if failures else 0
    print(f"{passed} passed, {failed} failed, {len(cases) - passed - failed} not run")
    return 1 if failures else 0
