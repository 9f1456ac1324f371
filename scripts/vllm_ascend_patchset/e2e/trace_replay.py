"""``make bench-e2e`` trace mode: a slice of a public trace replayed on the CPU engine, beside the twin's prediction.

    make bench-e2e BENCH_E2E_ARGS="--trace tests/data/traces/mooncake.jsonl@42:20 --load 0.8 --output-cap 64"

The requests are the twin's trace workload (``twin/traces.py``), built by the same
function from the profile ours' engine saved: the same slice, the same skips (a request
longer, prompt plus output, than the servers' ``--max-model-len`` is skipped, as the twin
skips one longer than its model takes), the same output cap, and arrivals scaled to the
same ``--load`` of the profile's capacity at the base chunk ``--chunk``. Prompt tokens are
the twin's (``workloads.prompt_token_ids``): each 512-token block a function of its
block id alone, so requests that share leading ids share leading tokens and vLLM's
prefix cache (on, in 128-token blocks) finds them.

One run, in order: ours (which profiles at start-up; its profile sets the arrivals), the
twin's prediction of the replay for ours, upstream's CPP and every fixed chunk of
``--fixed``, then the ``--fixed-pick`` fixed chunks the twin ranks best and upstream's
CPP on the real engine. Each server gets one short warm-up request (ids outside the
trace's, so it is never a prefix hit), then the replay: each request sent at its arrival
time on its own thread, streamed, every token's time kept. Figures and goals:
``trace_figures``.

Every server times each step that carries a prefill and logs it (``step_log``). The
twin runs each policy's device at the pace that policy's server served at: its timed
steps' measured time over the profile's time for them, summed (``twin_predict --steps``).
On two shared cores one server runs several percent faster or slower than the profile,
or than the next server, and at a load of 0.8 the queue magnifies that into the mean
TTFT. The requests, their arrivals and ours' start-up samples stay the profile's. The
fixed chunks to serve are picked from a first prediction, with every policy at ours' pace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..twin.slo import Slo
from ..twin.surface_files import load_surface
from ..twin.traces import parse_trace_item, trace_workload
from ..twin.workloads import RequestSpec, Workload, prompt_token_ids
from . import servers as e2e
from . import step_log
from . import trace_figures as tf
from .model import write_tiny_qwen3
from .trace_args import DEFAULT_COUNT, check_trace_args

CACHE_BLOCK_TOKENS = 128  # vLLM's block size on the CPU (given to the servers), as in the twin (engine.BLOCK_TOKENS)
TRACE_MAX_NUM_SEQS = 64  # the twin's MAX_NUM_SEQS (twin/engine.py): both admit the same requests at once
WARM_UP_IDS = list(range(4096, 4128))  # 32 ids the trace prompts never hold (theirs are below VOCAB_TOKENS)
LEAD_S = 0.5  # from building the threads to the first arrival
TWIN_TIMEOUT_S = 1800


def server_args() -> tuple[str, ...]:
    """What a trace server adds to the bench's: the prefix cache on, its block size, the cached tokens of each
    request in its usage report, and the twin's sequence cap."""
    seqs = str(TRACE_MAX_NUM_SEQS)
    caching = ("--enable-prefix-caching", "--block-size", str(CACHE_BLOCK_TOKENS), "--enable-prompt-tokens-details")
    return (*caching, "--max-num-seqs", seqs)


def build_replay(surface_spec: str, trace_item: str, load: float, output_cap: int | None, chunk: int) -> Workload:
    """The twin's trace workload for the e2e servers (module doc); ``trace_item`` is ``PATH[@START[:COUNT]]``."""
    return trace_workload(
        load_surface(surface_spec),
        e2e.PIPELINE_STAGES,
        parse_trace_item(trace_item, DEFAULT_COUNT),
        load,
        reference_chunk_tokens=chunk,
        cache_block_tokens=CACHE_BLOCK_TOKENS,
        max_request_tokens=e2e.MAX_MODEL_LEN,
        output_cap=output_cap,
    )


def prompts_of(workload: Workload) -> dict[str, list[int]]:
    """Each request's prompt token ids, exactly as the twin makes them."""
    return {spec.req_id: prompt_token_ids(spec, workload.seed) for spec in workload.requests}


def same_requests(a: Workload, b: Workload) -> bool:
    """The same requests, lengths, blocks and arrivals (to the microsecond)."""
    return a.requests == b.requests


@dataclass
class Outcome:
    req_id: str
    sent_s: float  # from the replay's time 0 (its first arrival)
    late_ms: float  # sent this much after its arrival time
    token_s: list[float]  # each streamed token's time from the send
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache (its usage report)

    @property
    def ttft_ms(self) -> float | None:
        return self.token_s[0] * 1000.0 if self.token_s else None


Send = Callable[[list[int], int], tuple[list[float], int | None]]  # (prompt, max tokens) -> (token times, cached)


def replay(
    requests: tuple[RequestSpec, ...],
    prompts: dict[str, list[int]],
    send: Send,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    on_done: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Send each request at its arrival time (on its own thread) with ``send(prompt, max_tokens)``; in request order."""
    zero = clock() + LEAD_S
    lock = threading.Lock()

    def one(spec: RequestSpec) -> Outcome:
        wait = zero + spec.arrival_ms / 1000.0 - clock()
        if wait > 0:
            sleep(wait)
        sent = clock()
        outcome = Outcome(spec.req_id, sent - zero, (sent - zero) * 1000.0 - spec.arrival_ms, [])
        try:
            outcome.token_s, outcome.cached_tokens = send(prompts[spec.req_id], spec.max_output_tokens)
        except Exception as error:  # a failed request misses its goals; the replay goes on
            outcome.error = f"{type(error).__name__}: {error}"
        if on_done is not None:
            with lock:
                on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(len(requests), 1)) as pool:
        return list(pool.map(one, requests))


def request_times(outcomes: list[Outcome]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Per request TTFT and TPOT in ms (``trace_figures`` definitions)."""
    return {o.req_id: o.ttft_ms for o in outcomes}, {o.req_id: tf.tpot_ms(o.token_s) for o in outcomes}


def serve_replay(args: argparse.Namespace, policy: e2e.Policy, model_dir: Path, workload: Workload | None) -> dict:
    """Start ``policy``'s server, warm it, replay ``workload`` (or the one its own profile makes: ours), stop it."""
    record: dict[str, Any] = {"policy": policy.name, "kind": policy.kind, "outcomes": [], "errors": [], "loads": []}
    log = args.out / f"server-{policy.name}.log"
    step_times = {step_log.STEP_LOG_ENV: "1"}  # its prefill steps timed and logged: its pace
    server = e2e.Server(policy, model_dir, log, args.out / "profiles", step_times, extra_args=server_args())
    try:
        with server:
            record["ready_s"] = server.ready_s
            record["profile"] = e2e.profile_source(server.log_text())
            print(f"{policy.name}: ready in {server.ready_s:.0f} s; CPP model from {record['profile']}", flush=True)
            if workload is None:
                workload, slo = twin_workload(args, saved_profile(args))
                record["workload"], record["slo"] = workload.to_json(), slo.to_json()
            e2e.stream_token_times(server.port, WARM_UP_IDS, 2)
            prompts = prompts_of(workload)
            record["loads"].append(os.getloadavg()[0])
            started = time.monotonic()

            def done(outcome: Outcome) -> None:
                record["loads"].append(os.getloadavg()[0])
                ttft = "no token" if outcome.ttft_ms is None else f"TTFT {outcome.ttft_ms / 1000:.2f} s"
                print(f"  {outcome.req_id} at {outcome.sent_s:.1f} s: {ttft} {outcome.error or ''}", flush=True)

            outcomes = replay(workload.requests, prompts, lambda ids, n: send(server.port, ids, n), on_done=done)
            record["replay_s"] = time.monotonic() - started
            record["outcomes"] = [asdict(o) for o in outcomes]
            record["errors"] += [f"{o.req_id}: {o.error}" for o in outcomes if o.error]
            record["steps"] = step_log.timed_steps(server.log_text())
    except Exception as error:
        record["errors"].append(f"{type(error).__name__}: {error}")
        print(f"{policy.name}: FAILED {error}\n--- tail of {server.log_path} ---\n{server.log_tail()}", file=sys.stderr)
    record["errors"] += server.leftovers
    return record


def send(port: int, token_ids: list[int], max_tokens: int) -> tuple[list[float], int | None]:
    """One streamed request: its token times and the prompt tokens the server's prefix cache held (None: the
    server sent no usage; vLLM leaves the details out when nothing was cached)."""
    token_s, usage = e2e.stream_completion(port, token_ids, max_tokens)
    return token_s, (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) if usage else None


def saved_profile(args: argparse.Namespace) -> Path:
    profiles = sorted((args.out / "profiles").glob("cpp-profile-*.json"), key=lambda p: p.stat().st_mtime)
    if not profiles:
        if args.report_only:
            raise SystemExit(
                f"--report-only: no saved profile in {args.out / 'profiles'}; run the trace mode without"
                " --report-only first (same --out)"
            )
        raise RuntimeError("ours saved no profile (its log says why): the arrivals need it")
    return profiles[-1]


def _twin(args: argparse.Namespace, profile: Path, out: Path, *extra: str) -> dict[str, Any]:
    """Run ``twin_predict`` on the trace mode's replay with the twin's Python; its JSON."""
    command = [args.twin_python, "-m", "vllm_ascend_patchset.e2e.twin_predict", "--surface", str(profile)]
    command += ["--stages", str(e2e.PIPELINE_STAGES), "--trace", args.trace, "--load", str(args.load)]
    command += ["--output-cap", str(args.output_cap), "--chunk", str(args.chunk), "--json", str(out), *extra]
    if args.target_tpot_ms is not None:
        command += ["--target-tpot-ms", str(args.target_tpot_ms)]
    env = {**e2e.server_env(), "PYTHONPATH": str(e2e.SCRIPTS_DIR)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, timeout=TWIN_TIMEOUT_S)
    return json.loads(out.read_text())


def twin_workload(args: argparse.Namespace, profile: Path) -> tuple[Workload, Slo]:
    """The replay's requests and arrivals from ``profile``, and the SLO bounds it sets, built in the twin's Python
    (``build_replay``, ``slo.default_slo``: reading a profile as a surface needs SciPy, which the engine's lacks)."""
    data = _twin(args, profile, args.out / "workload.json", "--workload-only")
    for note in data["notes"]:
        print(f"  {note}", flush=True)
    return Workload.from_json(data["workload"]), judged_at(args, Slo(**data["slo"]))


def judged_at(args: argparse.Namespace, slo: Slo) -> Slo:
    """The goodput bounds: with ``--target-tpot-ms`` its TPOT, as ours is asked to keep."""
    target = getattr(args, "target_tpot_ms", None)
    return slo if target is None else Slo(slo.ttft_ms, target, f"TTFT as the twin's default; TPOT {target:g} ms")


def slo_tuned(real: dict[str, tf.Serving], target_ms: float) -> str | None:
    """The served fixed chunk a user tunes for ``target_ms``: the least mean TTFT among those whose TPOT P99
    meets it, else the least TPOT P99 (``twin.command.slo_tuned_fixed``, on measured figures)."""
    fixed = [n for n in real if n.startswith("fixed-") and real[n].tpot_p99_ms is not None]
    meeting = [n for n in fixed if real[n].tpot_p99_ms <= target_ms]
    if meeting:
        return min(meeting, key=lambda n: real[n].ttft_mean_s)
    return min(fixed, key=lambda n: real[n].tpot_p99_ms, default=None)


def twin_prediction(args: argparse.Namespace, profile: Path, records: list[dict]) -> dict[str, Any]:
    """The twin's replay of the same slice at the same load from ``profile``, each policy's device at the pace
    of the steps its server timed in ``records``: its JSON (``twin_predict``)."""
    policies = ["--fixed", args.fixed, "--policies", "fixed,upstream,ours"]
    steps = {r["policy"]: r["steps"] for r in records if r.get("steps")}
    if steps:
        (args.out / "steps.json").write_text(json.dumps(steps))
        policies += ["--steps", str(args.out / "steps.json")]
    return _twin(args, profile, args.out / "twin.json", *policies)


def fixed_to_serve(args: argparse.Namespace, twin: dict[str, tf.Serving]) -> list[int]:
    """The chunks of ``--fixed`` the twin ranks best (``--fixed-pick``; 0 or no twin: all of them): by mean
    TTFT; with ``--target-tpot-ms`` those whose TPOT P99 meets the target first, the rest by TPOT P99."""
    chunks = [int(c) for c in args.fixed.split(",") if c.strip()]
    target = getattr(args, "target_tpot_ms", None)

    def rank(chunk: int) -> tuple:
        figures = twin[f"fixed-{chunk}"]
        if target is None:
            return (figures.ttft_mean_s,)
        tpot = math.inf if figures.tpot_p99_ms is None else figures.tpot_p99_ms
        return (0, figures.ttft_mean_s) if tpot <= target else (1, tpot)

    ranked = sorted((c for c in chunks if f"fixed-{c}" in twin), key=rank)
    if args.fixed_pick <= 0 or not ranked:
        return chunks
    return ranked[: args.fixed_pick]


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    check_trace_args(args)
    if args.report_only:
        return report_again(args, started)
    wanted = {w.strip() for w in args.policies.split(",") if w.strip()}
    if "ours" not in wanted:
        raise SystemExit("--trace: the policies must include ours: its profile sets the arrivals and the twin")
    args.out = args.out / "trace"
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [] if args.keep_profile else (args.out / "profiles").glob("cpp-profile-*.json"):
        old.unlink()  # ours profiles afresh; the arrivals and the twin read what this run's engine saved
    model_dir = write_tiny_qwen3(e2e.E2E_CACHE / "model")
    target = {} if args.target_tpot_ms is None else {"target_tpot_ms": args.target_tpot_ms}
    records = [serve_replay(args, e2e.ours(args.chunk, **target), model_dir, None)]
    if "workload" not in records[0]:
        print(f"ours: {'; '.join(records[0]['errors'])}", file=sys.stderr)
        return 1
    workload, slo = Workload.from_json(records[0]["workload"]), Slo(**records[0]["slo"])
    first = twin_figures(args, saved_profile(args), workload, slo, records)
    if not first.figures:
        print("twin: no prediction; serving every chunk of --fixed", file=sys.stderr)
    others = [e2e.fixed(c) for c in fixed_to_serve(args, first.figures)]
    others = (others if "fixed" in wanted else []) + ([e2e.upstream(args.chunk)] if "upstream" in wanted else [])
    records += [serve_replay(args, policy, model_dir, workload) for policy in others]
    (args.out / "records.json").write_text(json.dumps(records, indent=1))
    twin = twin_figures(args, saved_profile(args), workload, slo, records)  # every server's pace now
    return report(records, twin, slo, workload, time.monotonic() - started, args.target_tpot_ms)


@dataclass
class TwinReplay:
    """The twin's figures of the replay per policy, the prompt tokens its prefix cache held, and the pace
    (``twin_predict.Pace`` as a dict) of each server that timed steps; all empty if the twin failed."""

    figures: dict[str, tf.Serving] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    paces: dict[str, dict] = field(default_factory=dict)


def twin_figures(
    args: argparse.Namespace, profile: Path, workload: Workload, slo: Slo, records: list[dict]
) -> TwinReplay:
    """The twin's replay, each policy's device at its server's pace in ``records`` (``twin_prediction``)."""
    try:
        twin = twin_prediction(args, profile, records)
    except (subprocess.SubprocessError, OSError, RuntimeError) as error:
        print(f"twin: not run ({error})", file=sys.stderr)
        return TwinReplay()
    if not same_requests(workload, Workload.from_json(twin["workload"])):
        print("twin: its requests differ from the replay's; its figures are left out", file=sys.stderr)
        return TwinReplay()
    figures = {
        name: tf.serving(times["request_ttft_ms"], times["request_tpot_ms"], slo)
        for name, times in twin["policies"].items()
    }
    hits = {name: sum(t["request_cached_tokens"].values()) for name, t in twin["policies"].items()}
    return TwinReplay(figures, hits, twin.get("paces", {}))


def report_again(args: argparse.Namespace, started: float) -> int:
    """The table of the last run in ``--out`` (its records and ours' saved profile), with the twin run anew."""
    args.out = args.out / "trace"
    saved = args.out / "records.json"
    again = "run the trace mode without --report-only first (same --out)"
    if not saved.is_file():
        raise SystemExit(f"--report-only: no {saved}; {again}")
    try:
        records = json.loads(saved.read_text())
        workload, slo = Workload.from_json(records[0]["workload"]), Slo(**records[0]["slo"])
    except (OSError, ValueError, TypeError, KeyError, IndexError) as error:
        raise SystemExit(f"--report-only: {saved} is not a trace run's records ({error!r:.80}); {again}") from None
    twin = twin_figures(args, saved_profile(args), workload, slo, records)
    return report(records, twin, slo, workload, time.monotonic() - started, args.target_tpot_ms)


def report(
    records: list[dict],
    replayed: TwinReplay,
    slo: Slo,
    workload: Workload,
    elapsed_s: float,
    target: float | None = None,
) -> int:
    real, ttft_by_policy, loads = {}, {}, {}
    for record in records:
        outcomes = [Outcome(**o) for o in record["outcomes"]]
        if not outcomes:
            continue
        ttft, tpot = request_times(outcomes)
        real[record["policy"]] = tf.serving(ttft, tpot, slo)
        ttft_by_policy[record["policy"]] = ttft
        loads[record["policy"]] = sum(record["loads"]) / len(record["loads"]) if record["loads"] else float("nan")
    twin = replayed.figures
    fixed_names = [n for n in real if n.startswith("fixed-")]
    best_fixed = min(fixed_names, key=lambda n: real[n].ttft_mean_s) if fixed_names else None
    upstream = "upstream-cpp" if "upstream-cpp" in real else None
    print(f"\n== {workload.name}, PP={e2e.PIPELINE_STAGES}, {len(workload.requests)} requests, prefix caching on ==")
    for line in tf.format_table(real, twin, loads, slo):
        print(line)
    if twin:
        twin_best = min((n for n in twin if n.startswith("fixed-")), key=lambda n: twin[n].ttft_mean_s, default=None)
        print(f"  best fixed chunk: real {best_fixed}, twin {twin_best} (of every chunk it replayed)")
    failed = [r for r in records if r["errors"]]
    for record in failed:
        print(f"{record['policy']}: {'; '.join(record['errors'])}", file=sys.stderr)
    comparator = slo_tuned(real, target) if target is not None else best_fixed
    if target is not None and comparator:
        print(f"  SLO-tuned fixed chunk for TPOT {target:g} ms: real {comparator}")
    for goal in tf.goals(real, twin, ttft_by_policy, comparator, upstream, target_tpot_ms=target):
        print(f"goal {'met   ' if goal.met else 'MISSED'}: {goal.what}: {goal.value}")
    for record in records:
        cached = [o.get("cached_tokens") for o in record["outcomes"]]
        real_hits = "-" if None in cached or not cached else str(sum(cached))
        twin_hit = replayed.hits.get(record["policy"], "-")
        print(f"  {record['policy']}: prefix-cache hits {real_hits} prompt tokens (twin {twin_hit})")
        pace = replayed.paces.get(record["policy"])
        if pace:
            print(f"  {record['policy']}: {pace['steps']} timed prefill steps ran at {pace['ratio']:.3f} x"
                  f" the profile's time (steps' quartiles {pace['low']:.2f} .. {pace['high']:.2f}): the twin's"
                  " device ran at that pace")  # fmt: skip
        elif twin:
            print(f"  {record['policy']}: no timed steps; the twin's device ran at the others'"
                  " median pace")  # fmt: skip
    print(f"bench-e2e trace: {len(records)} policies in {elapsed_s:.0f} s")
    return 1 if failed else 0
