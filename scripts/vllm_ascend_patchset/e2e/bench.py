"""``make bench-e2e``: fixed chunks, upstream's CPP and ours on the real CPU engine, with the twin's prediction.

One run serves each policy in turn (PP = 2, one core per stage) and sends it, one at a
time, ``--repeats`` prompts of each length in ``--prompts``, every prompt of fresh
random token ids (no prefix-cache hits). It prints TTFT mean and median and TPOT per
policy and prompt length, the ratios against the best fixed chunk and upstream's CPP,
and the twin's prediction of the same case from the profile ours' engine saved
(twin/real per case, and whether the twin ranks the policies as the engine does).
With ``--mixed`` each server also gets vLLM's own ``vllm bench serve`` (random dataset).
The ``load`` column is the machine's 1-minute load average during that policy's requests:
on a shared machine, policies served under different load are not comparable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..paths import ROOT
from ..twin.engine import MAX_NUM_SEQS as TWIN_MAX_NUM_SEQS
from . import servers as e2e
from .model import TINY_QWEN3, write_tiny_qwen3

FIDELITY_TOLERANCE = 0.10
POLICY_KINDS = ("fixed", "upstream", "ours")
MIXED_RANGE_RATIO = 0.5  # vllm bench serve's --random-range-ratio: lengths up to 1.5x the given ones
STEP_TIMEOUT_S = 1800  # 'vllm bench serve', and the twin's prediction, each get half an hour
MAX_RUNS = 1000  # --repeats, --mixed-prompts: at a second or more a request, 1000 already take a quarter of an hour


class ArgumentError(ValueError):
    """Bad input on the bench's command line: ``run.main`` prints it and exits 2, before any server starts."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default="16384,32768", help="prompt lengths in tokens, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="prompts per length and policy")
    p.add_argument("--fixed", default="512,1024,2048,4096", help="fixed chunk sizes (max_num_batched_tokens)")
    p.add_argument("--chunk", type=int, default=2048, help="CPP base chunk (max_num_batched_tokens)")
    p.add_argument("--policies", default="fixed,upstream,ours", help="subset of fixed,upstream,ours")
    p.add_argument("--output-tokens", type=int, default=8, help="tokens generated per request (TPOT)")
    p.add_argument("--mixed", action="store_true", help="also run 'vllm bench serve' (random dataset) per policy")
    p.add_argument("--mixed-prompts", type=int, default=8)
    p.add_argument("--mixed-input-len", type=int, default=4096)
    p.add_argument("--mixed-output-len", type=int, default=32)
    p.add_argument("--mixed-rate", type=float, default=0.5, help="requests per second")
    p.add_argument("--twin-python", default=str(ROOT / ".venv" / "bin" / "python"), help="Python with the twin")
    p.add_argument("--out", type=Path, default=e2e.E2E_CACHE / "bench", help="logs, profile and results")


def parse_whole_numbers(text: str, flag: str, low: int, high: int, what: str, example: str) -> list[int]:
    """``512,1024`` -> [512, 1024]: whole numbers in [low, high], at least one; an error names ``flag``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(low <= v <= high for v in values):
        raise ArgumentError(
            f"{flag} {text!r}: give {what}, whole numbers in [{low}, {high}], comma-separated (e.g. {example})"
        )
    return values


def within(value: int, flag: str, low: int, high: int | None, what: str) -> None:
    """``value`` in [low, high] (``high`` None: no upper bound); else an ``ArgumentError`` naming ``flag``."""
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ArgumentError(f"{flag} must be {bounds} ({what}), got {value}")


def _writable_folder(given: Path, inside: str, flag: str) -> None:
    """``given/inside`` can be made (with its parents) and written in; nothing is made or left behind."""
    path = given / inside
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        raise ArgumentError(f"{flag} {given}: {nearest} is a file, not a folder; give a folder for the run's files")
    try:
        tempfile.TemporaryFile(dir=nearest).close()
    except OSError as error:
        raise ArgumentError(
            f"{flag} {given}: cannot write in {nearest} ({error.strerror}); give a writable folder"
        ) from None


def check_args(args: argparse.Namespace) -> None:
    """Every bench flag, checked before any server starts (a server takes a minute or more to start and
    profile, and a run clears the profile ours saved before); an error names the flag and what to give."""
    most = e2e.MAX_MODEL_LEN
    within(args.output_tokens, "--output-tokens", 1, most - 1, "tokens generated per request")
    lengths = f"prompt lengths in tokens (with --output-tokens, within the servers' max_model_len {most})"
    parse_whole_numbers(args.prompts, "--prompts", 1, most - args.output_tokens, lengths, "16384,32768")
    within(args.repeats, "--repeats", 1, MAX_RUNS, "prompts per length and policy")
    chunks = f"chunk budgets: max_num_batched_tokens is at least max_num_seqs ({TWIN_MAX_NUM_SEQS} in the twin)"
    parse_whole_numbers(args.fixed, "--fixed", TWIN_MAX_NUM_SEQS, most, chunks, "512,1024,2048,4096")
    within(args.chunk, "--chunk", TWIN_MAX_NUM_SEQS, most, chunks)
    wanted_policies(args)
    within(args.mixed_prompts, "--mixed-prompts", 1, MAX_RUNS, "requests of 'vllm bench serve'")
    within(args.mixed_input_len, "--mixed-input-len", 1, None, "prompt tokens of 'vllm bench serve'")
    within(args.mixed_output_len, "--mixed-output-len", 1, None, "output tokens of 'vllm bench serve'")
    longest_mixed = math.floor((args.mixed_input_len + args.mixed_output_len) * (1 + MIXED_RANGE_RATIO))
    if longest_mixed > e2e.MAX_MODEL_LEN:
        raise ArgumentError(
            f"--mixed-input-len/--mixed-output-len: 'vllm bench serve' draws lengths up to {1 + MIXED_RANGE_RATIO:g}x"
            f" these, {longest_mixed} tokens, more than the servers' {e2e.MAX_MODEL_LEN}; give shorter ones"
        )
    if not args.mixed_rate > 0:  # inf is vllm bench serve's "all at once"; nan is refused too
        raise ArgumentError(
            f"--mixed-rate must be > 0 (requests per second; inf sends all at once), got {args.mixed_rate}"
        )
    arrivals_s = args.mixed_prompts / args.mixed_rate
    if arrivals_s > STEP_TIMEOUT_S:
        raise ArgumentError(
            f"--mixed-rate {args.mixed_rate:g}: {args.mixed_prompts} requests at {args.mixed_rate:g} a second arrive"
            f" over {arrivals_s:g} s, more than the {STEP_TIMEOUT_S} s 'vllm bench serve' is given; give a higher"
            " rate or fewer --mixed-prompts"
        )
    twin = Path(args.twin_python)
    if not (twin.is_file() and os.access(twin, os.X_OK)):
        raise ArgumentError(
            f"--twin-python {twin}: not an executable file; give the test environment's Python (.venv/bin/python,"
            " made by 'make venv')"
        )
    trace_mode = getattr(args, "trace", None)
    _writable_folder(args.out, "trace/profiles" if trace_mode else "profiles", "--out")


def wanted_policies(args: argparse.Namespace) -> set[str]:
    """The kinds ``--policies`` names, checked."""
    wanted = {w.strip() for w in args.policies.split(",") if w.strip()}
    unknown = wanted - set(POLICY_KINDS)
    if unknown or not wanted:
        what = f"unknown {sorted(unknown)}" if unknown else "none given"
        raise ArgumentError(f"--policies {args.policies!r}: {what}; choose from {','.join(POLICY_KINDS)}")
    return wanted


def policies_for(args: argparse.Namespace) -> list[e2e.Policy]:
    wanted = wanted_policies(args)
    out = [e2e.fixed(int(c)) for c in args.fixed.split(",") if c.strip()] if "fixed" in wanted else []
    if "upstream" in wanted:
        out.append(e2e.upstream(args.chunk))
    if "ours" in wanted:
        out.append(e2e.ours(args.chunk))
    return out


def mixed_traffic(args: argparse.Namespace, server: e2e.Server, model_dir: Path, result: Path) -> dict[str, Any]:
    """vLLM's own ``vllm bench serve`` on the random dataset against ``server``."""
    bench = [str(Path(sys.executable).with_name("vllm")), "bench", "serve", "--backend", "vllm"]
    bench += ["--model", "tiny-qwen3", "--tokenizer", str(model_dir), "--host", "127.0.0.1"]
    bench += ["--port", str(server.port), "--dataset-name", "random", "--random-input-len", str(args.mixed_input_len)]
    bench += ["--random-output-len", str(args.mixed_output_len), "--random-range-ratio", str(MIXED_RANGE_RATIO)]
    bench += ["--num-prompts", str(args.mixed_prompts), "--request-rate", str(args.mixed_rate), "--seed", "0"]
    bench += ["--ignore-eos", "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50"]
    bench += ["--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]
    subprocess.run(bench, check=True, env=e2e.server_env(), timeout=STEP_TIMEOUT_S, stdout=subprocess.DEVNULL)
    data = json.loads(result.read_text())
    return {k: data.get(k) for k in ("mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "completed")}


def serve_policy(args: argparse.Namespace, policy: e2e.Policy, model_dir: Path, prompts: list[int]) -> dict[str, Any]:
    record: dict[str, Any] = {"policy": policy.name, "kind": policy.kind, "runs": {}, "errors": []}
    server = e2e.Server(policy, model_dir, args.out / f"server-{policy.name}.log", args.out / "profiles")
    try:
        with server:
            record["ready_s"] = server.ready_s
            record["profile"] = e2e.profile_source(server.log_text())
            print(f"{policy.name}: ready in {server.ready_s:.0f} s; CPP model from {record['profile']}", flush=True)
            for tokens in prompts:
                runs = []
                for repeat in range(args.repeats):
                    ids = e2e.prompt_ids(tokens, repeat, TINY_QWEN3["vocab_size"], seed=1)
                    runs.append({**e2e.complete(server.port, ids, args.output_tokens), "load": os.getloadavg()[0]})
                    print(f"  {tokens} tokens #{repeat}: TTFT {runs[-1]['ttft_s']:.2f} s", flush=True)
                record["runs"][tokens] = runs
            if args.mixed:
                record["mixed"] = mixed_traffic(args, server, model_dir, args.out / f"mixed-{policy.name}.json")
    except Exception as error:
        record["errors"].append(f"{type(error).__name__}: {error}")
        print(f"{policy.name}: FAILED {error}\n--- tail of {server.log_path} ---\n{server.log_tail()}", file=sys.stderr)
    record["errors"] += server.leftovers
    return record


def twin_prediction(args: argparse.Namespace, profile: Path, prompts: list[int]) -> dict[str, dict[int, float]]:
    out = args.out / "twin.json"
    command = [args.twin_python, "-m", "vllm_ascend_patchset.e2e.twin_predict", "--surface", str(profile)]
    command += ["--stages", str(e2e.PIPELINE_STAGES), "--prompts", ",".join(map(str, prompts))]
    command += ["--fixed", args.fixed, "--chunk", str(args.chunk), "--policies", args.policies]
    command += ["--json", str(out)]
    env = {**e2e.server_env(), "PYTHONPATH": str(e2e.SCRIPTS_DIR)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S)
    return {name: {int(k): v for k, v in by_len.items()} for name, by_len in json.loads(out.read_text()).items()}


def _ratio(value: float, reference: float | None) -> str:
    return f"{value / reference:.3f}" if reference else "-"


def report(records: list[dict[str, Any]], prompts: list[int], twin: dict[str, dict[int, float]]) -> list[str]:
    """The table; returns the fidelity failures (twin/real outside 1 +/- tolerance, or another ranking)."""
    problems = []
    for tokens in prompts:
        rows = []
        for record in records:
            runs = record["runs"].get(tokens)
            if not runs:
                continue
            ttfts = [r["ttft_s"] for r in runs]
            tpot_s = statistics.mean(r["tpot_s"] for r in runs)
            load = statistics.mean(r.get("load", float("nan")) for r in runs)
            rows.append((record, statistics.mean(ttfts), statistics.median(ttfts), tpot_s, load))
        fixed_rows = [row for row in rows if row[0]["kind"] == "fixed"]
        best_fixed = min(fixed_rows, key=lambda row: row[1]) if fixed_rows else None
        upstream = next((row for row in rows if row[0]["kind"] == "upstream"), None)
        repeats = len(rows[0][0]["runs"][tokens]) if rows else 0
        print(f"\n== {tokens}-token prompts, PP={e2e.PIPELINE_STAGES}, {repeats} each ==")
        print(f"{'policy':<14}{'TTFT mean s':>12}{'median s':>10}{'TPOT ms':>9}{'vs best fixed':>14}"
              f"{'vs upstream':>12}{'twin s':>9}{'twin/real':>10}{'load':>6}")  # fmt: skip
        for record, mean_s, median_s, tpot_s, load in rows:
            predicted = twin.get(record["policy"], {}).get(tokens)
            fidelity = predicted / mean_s if predicted else None
            print(
                f"{record['policy']:<14}{mean_s:>12.3f}{median_s:>10.3f}{tpot_s * 1000:>9.1f}"
                f"{_ratio(mean_s, best_fixed[1] if best_fixed else None):>14}"
                f"{_ratio(mean_s, upstream[1] if upstream else None):>12}"
                f"{predicted if predicted else float('nan'):>9.3f}{fidelity if fidelity else float('nan'):>10.3f}"
                f"{load:>6.1f}"
            )
            if fidelity is not None and abs(fidelity - 1.0) > FIDELITY_TOLERANCE:
                problems.append(f"{tokens} tokens, {record['policy']}: twin/real {fidelity:.3f}")
        if best_fixed:
            print(f"  best fixed chunk: {best_fixed[0]['policy']}")
        real_order = [row[0]["policy"] for row in sorted(rows, key=lambda row: row[1])]
        twin_order = sorted((p for p in real_order if tokens in twin.get(p, {})), key=lambda p: twin[p][tokens])
        if twin_order:
            same = twin_order == real_order
            print(f"  ranking real: {' < '.join(real_order)}")
            print(f"  ranking twin: {' < '.join(twin_order)}{'' if same else '  (differs)'}")
            if not same:
                problems.append(f"{tokens} tokens: the twin ranks {twin_order}, the engine {real_order}")
    for record in records:
        if record.get("mixed"):
            m = record["mixed"]
            print(f"mixed ({record['policy']}): TTFT mean {m['mean_ttft_ms']:.0f} ms, median "
                  f"{m['median_ttft_ms']:.0f} ms, TPOT {m['mean_tpot_ms']:.1f} ms, {m['completed']} done")  # fmt: skip
    return problems


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    prompts = [int(v) for v in args.prompts.split(",") if v.strip()]  # checked by check_args
    args.out.mkdir(parents=True, exist_ok=True)
    for old in (args.out / "profiles").glob("cpp-profile-*.json"):
        old.unlink()  # ours profiles afresh, and the twin reads what this run's engine saved
    model_dir = write_tiny_qwen3(e2e.E2E_CACHE / "model")
    records = [serve_policy(args, policy, model_dir, prompts) for policy in policies_for(args)]
    (args.out / "records.json").write_text(json.dumps(records, indent=1))
    twin: dict[str, dict[int, float]] = {}
    profiles = sorted((args.out / "profiles").glob("cpp-profile-*.json"))
    if profiles:
        try:
            twin = twin_prediction(args, profiles[-1], prompts)
        except (subprocess.SubprocessError, OSError, RuntimeError) as error:
            print(f"twin: not run ({error})", file=sys.stderr)
    else:
        print("twin: no saved profile (ours did not run or did not profile): no prediction", file=sys.stderr)
    problems = report(records, prompts, twin)
    failed = [r for r in records if r["errors"]]
    for record in failed:
        print(f"{record['policy']}: {'; '.join(record['errors'])}", file=sys.stderr)
    for problem in problems:
        print(f"fidelity: {problem}")
    print(f"bench-e2e: {len(records)} policies in {time.monotonic() - started:.0f} s; results in {args.out}")
    return 1 if failed else 0
