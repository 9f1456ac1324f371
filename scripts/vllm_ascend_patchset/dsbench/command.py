"""``vllm-ascend-patchset ds-bench`` (``make bench-ds``): dual stream against single stream on the CPU, TP = 2.

Starts two rank processes (``rank``) on the assembled tree, bounds them in time, and
prints per link preset the measured gate's decision and the figures of every batch
(``report``), with the machine's load average before and after: the ranks share the
host's cores with whatever else runs, which the interleaved rounds and the ratios absorb
but the absolute times do not.

SIGTERM or SIGINT (``timeout``, a cancelled CI job, Ctrl-C) stops the run in order: the
ranks get SIGTERM, then SIGKILL after ``STOP_GRACE_S``, the temporary folder goes, and the
command exits with 128 + the signal's number, writing no result.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..paths import ROOT, assembled_root
from . import cases as bench_cases
from . import report
from . import saved as saved_result

WORLD = 2
PEER_GRACE_S = 30.0
STOP_GRACE_S = 5.0  # a rank's time to exit on SIGTERM before it is killed
# vLLM binds IPC sockets at TMPDIR/<uuid4>, and a socket's path holds at most 107 bytes
IPC_DIR_MAX = 107 - 1 - 36


class Stopped(Exception):
    """The run was stopped by a signal; its ranks are gone."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """SIGTERM and SIGINT noted rather than raised while installed, so cleanup is never cut short.

    ``run_ranks`` polls ``signum`` and stops the ranks; a second signal changes nothing.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _note(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum


MAX_ROUNDS = 1000  # --repeats, --gate-repeats: a round of the full bench takes minutes already
MAX_TIMEOUT_S = 86_400.0  # --timeout-s: a day; the full bench takes well under an hour


def _positive(kind, high: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not 0 < value <= high:  # NaN fails both
            raise argparse.ArgumentTypeError(f"must be > 0 and at most {high:g}, got {text}")
        return value

    return parse


# The emulated link's flags: finite, and within what a device interconnect can be, so the emulated
# waits stay finite and the figures mean something. Zero latency is a link of bandwidth alone.
ALPHA_US_RANGE = (0.0, 10_000.0)  # 10 ms per message is slower than any collective's launch across nodes
# 10 MB/s: a 16k-token batch's 16 MB all-reduce then takes 1.6 s, a forward of it half a minute;
# 10 TB/s is past any device link, and its wire time vanishes beside alpha
BETA_GBPS_RANGE = (0.01, 10_000.0)


def _within(low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not low <= value <= high:  # NaN fails both
            raise argparse.ArgumentTypeError(f"must be a number in [{low:g}, {high:g}], got {text}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm-ascend-patchset ds-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset",
        default="bare,comm20,comm35,comm55",
        help=f"comma-separated link presets, of {', '.join(bench_cases.PRESETS)} (default: all)",
    )
    parser.add_argument(
        "--alpha-us",
        type=_within(*ALPHA_US_RANGE),
        default=bench_cases.ALPHA_S * 1e6,
        help=f"per-message latency of the emulated links, us, in [{ALPHA_US_RANGE[0]:g}, {ALPHA_US_RANGE[1]:g}]: "
        "0 is a link of bandwidth alone, 10 ms is slower than any collective's launch across nodes "
        f"(default {bench_cases.ALPHA_S * 1e6:g})",
    )
    parser.add_argument(
        "--beta-gbps",
        type=_within(*BETA_GBPS_RANGE),
        help="also run a 'custom' link of --alpha-us and this bandwidth, GB/s, in "
        f"[{BETA_GBPS_RANGE[0]:g}, {BETA_GBPS_RANGE[1]:g}]: below 10 MB/s one forward of a large batch takes "
        "minutes on the link, and 10 TB/s is past any device interconnect",
    )
    parser.add_argument(
        "--link-data",
        choices=("token", "real"),
        default="token",
        help="what gloo all-reduces on an emulated link: one element per message (the ranks meet; the payload's "
        "transfer is emulated) or the payload itself (gloo's copies then take CPU from the compute threads)",
    )
    rounds, seconds = _positive(int, MAX_ROUNDS), _positive(float, MAX_TIMEOUT_S)
    parser.add_argument("--repeats", type=rounds, default=3, help="rounds over every batch per preset")
    parser.add_argument("--gate-repeats", type=rounds, default=2, help="the measured gate's probes per class")
    parser.add_argument("--quick", action="store_true", help="small batches only (a smoke run)")
    parser.add_argument(
        "--cases",
        help=f"comma-separated batches to run (default: all), of {', '.join(c.name for c in bench_cases.CASES)}",
    )
    parser.add_argument("--timeout-s", type=seconds, default=3600.0, help="stop the ranks after this long")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-ds" / "result.json", help="raw results")
    parser.add_argument("--from-json", type=Path, help="print the tables of a saved --out file; run nothing")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.preset.split(",") if n.strip()]
    unknown = [n for n in names if n not in bench_cases.PRESETS]
    if unknown:
        parser.error(f"--preset: unknown {', '.join(unknown)}; choose from {', '.join(bench_cases.PRESETS)}")
    chosen = bench_cases.QUICK_CASES if args.quick else bench_cases.CASES
    if args.cases is not None:
        wanted = [n.strip() for n in args.cases.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in bench_cases.BY_NAME]
        if unknown or not wanted:
            parser.error(f"--cases: unknown {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(bench_cases.BY_NAME)}")  # fmt: skip
        chosen = [bench_cases.BY_NAME[n] for n in wanted]
    args.case_names = [c.name for c in chosen]
    if args.beta_gbps is not None:
        names.append("custom")
    if not names:
        parser.error("--preset: name at least one preset, or give --beta-gbps")
    args.presets = names
    return args


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written, found by making a file in its nearest existing folder now; or None.
    The folders it needs are made when the result is written: a run that fails leaves none."""
    if path.is_dir():
        return "is a folder"
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable"
    return None


def plan_of(args: argparse.Namespace) -> dict:
    return {
        "quick": args.quick,
        "cases": args.case_names,
        "reference": (bench_cases.QUICK_REFERENCE if args.quick else bench_cases.REFERENCE).name,
        "max_num_batched_tokens": (
            bench_cases.QUICK_MAX_NUM_BATCHED_TOKENS if args.quick else bench_cases.MAX_NUM_BATCHED_TOKENS
        ),
        "repeats": args.repeats,
        "gate_repeats": args.gate_repeats,
        "presets": args.presets,
        "alpha_us": args.alpha_us,
        "link_data": args.link_data,
        "beta_gbps": args.beta_gbps,
    }


def _inductor_cache() -> str:
    """The folder torch compiles its CPU helpers into by default (per user, under the temporary folder)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return str(Path(tempfile.gettempdir()) / f"torchinductor_{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    plan: dict,
    work: Path,
    timeout_s: float,
    module: str = "vllm_ascend_patchset.dsbench.rank",
    stop: StopSignals | None = None,
) -> list[dict]:
    """Both ranks to completion; their results, or an error with their output.

    A rank still running at the deadline is killed; so is a rank left alone for
    ``PEER_GRACE_S`` after its peer failed (it would wait in a collective the failed rank
    never joins). Once ``stop`` notes a signal the ranks are stopped (``_stop``) and
    ``Stopped`` is raised. Each rank runs in a session of its own, so a Ctrl-C reaches
    this process alone and the ranks are stopped in order.
    """
    assembled = assembled_root()
    if not (assembled / "vllm_ascend" / "__init__.py").exists():
        raise RuntimeError(f"{assembled}/vllm_ascend is not assembled; run 'make assemble' first")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(assembled), str(ROOT / "scripts"), env.get("PYTHONPATH", "")])
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if len(str(work)) <= IPC_DIR_MAX:  # what vLLM leaves in TMPDIR when a rank is stopped goes with this folder
        env["TMPDIR"] = str(work)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_cache())  # torch's cache stays where it is kept warm
    (work / "plan.json").write_text(json.dumps(plan))
    port = _free_port()
    procs, killed = [], {}
    for rank in range(WORLD):
        command = [sys.executable, "-m", module, str(rank), str(WORLD), str(port),
                   str(work / "plan.json"), str(work / f"rank{rank}.json")]  # fmt: skip
        with open(work / f"rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(command, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
    deadline, failed_at = time.monotonic() + timeout_s, None
    try:
        while any(proc.poll() is None for proc in procs):
            if stop is not None and stop.signum is not None:
                break
            now = time.monotonic()
            if failed_at is None and any(proc.poll() not in (None, 0) or _failed(work, r) for r, proc in
                                         enumerate(procs) if proc.poll() is not None):  # fmt: skip
                failed_at = now
            for rank, proc in enumerate(procs):
                if proc.poll() is None and (now > deadline or (failed_at and now - failed_at > PEER_GRACE_S)):
                    os.killpg(proc.pid, signal.SIGKILL)  # its session: what it started goes too
                    killed[rank] = "--timeout-s" if now > deadline else "its peer failed"
                    with open(work / f"rank{rank}.log", "a") as log:
                        log.write(f"\n(killed: {killed[rank]})\n")
            time.sleep(0.2)
    finally:
        _stop(procs)
    if stop is not None and stop.signum is not None:
        raise Stopped(stop.signum)
    results = []
    for rank in range(WORLD):
        output = (work / f"rank{rank}.log").read_text(errors="replace")[-4000:]
        path = work / f"rank{rank}.json"
        if not path.exists():
            raise RuntimeError(f"rank {rank} wrote no result:\n{output}")
        result = json.loads(path.read_text())
        if result["errors"]:
            raise RuntimeError(f"rank {rank} failed:\n" + "\n".join(result["errors"]))
        results.append(result)
    return results


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every running rank's process group, SIGKILL to what is left after ``STOP_GRACE_S``; reaped."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)  # the rank leads its own session: anything it started goes too
                except ProcessLookupError:
                    pass
        until = time.monotonic() + (grace or 0.0)
        while time.monotonic() < until and any(proc.poll() is None for proc in procs):
            time.sleep(0.05)
    for proc in procs:
        proc.wait()


def _failed(work: Path, rank: int) -> bool:
    path = work / f"rank{rank}.json"
    try:
        return bool(json.loads(path.read_text())["errors"])
    except (OSError, ValueError, KeyError):
        return True


def render(results: list[dict], plan: dict, load_before: tuple, load_after: tuple, seconds: float) -> tuple[str, list]:
    cases = [bench_cases.BY_NAME[name] for name in plan["cases"]]
    reference = plan["reference"]
    config = bench_cases.MODEL_CONFIG
    lines = [
        f"dual-stream bench, CPU, TP={WORLD} (gloo), one compute thread per rank, {os.cpu_count()} cores; "
        f"load average {_load(load_before)} at start",
        f"model: Qwen3 dense, {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
        f"MLP {config['intermediate_size']}, {config['num_attention_heads']} query / "
        f"{config['num_key_value_heads']} KV heads of {config['head_dim']}; fp32",
        f"{plan['repeats']} rounds per preset, each running every batch single- and dual-stream back to back; a "
        "forward's time is the slower rank's; figures from the fastest forwards, [min, max] of the rounds' ratios",
        f"dual-stream outputs equal single-stream's within {max(r['max_rel_diff'] for r in results):.1e} "
        "(largest difference relative to the output's scale, every batch and split)",
        "",
    ]
    failures = []
    for name in plan["presets"]:
        preset = bench_cases.PRESETS.get(name)
        info = results[0]["presets"][name]
        gate = results[0]["gate"][name]
        lines.append(report.link_line(name, info, preset.share if preset else None, reference))
        lines.append(report.gate_line(gate))
        table, failed = report.preset_table(results, name, cases, gate)
        lines += [table, ""]
        failures += failed
    lines.append(f"goals: efficiency >= 80% where a micro-batch's communication is at most its compute (emulated "
                 f"links); no batch the gate lets through slower than {report.GOAL_SLOWDOWN:.2f}x")  # fmt: skip
    lines += [f"  not met: {f}" for f in failures] or ["  met on every batch"]
    lines.append(f"took {seconds:.0f} s; load average {_load(load_after)} at the end")
    return "\n".join(lines), failures


def _load(values: tuple) -> str:
    return " / ".join(f"{v:.2f}" for v in values) + " (1 / 5 / 15 min)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        try:
            saved = saved_result.load(args.from_json)
            text, _failures = render(saved["ranks"], saved["plan"], saved["load_before"], saved["load_after"],
                                     saved["seconds"])  # fmt: skip
        except (OSError, ValueError, LookupError, TypeError, AttributeError, ArithmeticError, RecursionError) as error:
            why = error if isinstance(error, OSError | ValueError) else f"{type(error).__name__}: {error}"
            print(f"error: --from-json {args.from_json}: not a saved ds-bench result ({why})", file=sys.stderr)
            return 2
        print(text)
        return 0
    if fault := _unwritable(args.out):  # before the run, not after it
        print(f"error: --out {args.out}: {fault}; name a file in a folder you can write", file=sys.stderr)
        return 2
    plan = plan_of(args)
    load_before = os.getloadavg()
    started = time.monotonic()
    with StopSignals() as stop:
        try:
            with tempfile.TemporaryDirectory(prefix="ds-bench-") as work:
                results = run_ranks(plan, Path(work), args.timeout_s, stop=stop)
        except Stopped as stopped:
            print(f"ds-bench: {stopped}: the ranks are stopped and the temporary folder removed; no result written",
                  file=sys.stderr)  # fmt: skip
            return 128 + stopped.signum
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        seconds = time.monotonic() - started
        text, _failures = render(results, plan, load_before, os.getloadavg(), seconds)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"plan": plan, "ranks": results, "load_before": load_before,
                                        "load_after": os.getloadavg(), "seconds": seconds}))  # fmt: skip
        print(text)
        print(f"raw results: {args.out}")
    if stop.signum is not None:  # met after the ranks had finished: the result is whole, the exit says so
        print(f"ds-bench: {signal.Signals(stop.signum).name} received while writing the result", file=sys.stderr)
        return 128 + stop.signum
    return 0
