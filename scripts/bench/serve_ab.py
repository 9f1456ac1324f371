"""Serve A and B variants of a server one after the other and benchmark each.

The machinery shared by the side-by-side serving benchmarks (``cpp_serve.py``,
``dual_stream_ttft.py``); each script owns its CLI, its ``vllm serve`` command per variant
and its table. For one variant: start ``vllm serve`` in a session of its own, poll
``/health`` until it answers 200 (failing at once if the server exits, and after
``--ready-timeout-s`` if it never answers), run ``vllm bench serve`` on the random dataset
saving its result JSON, stop the server's whole process group (the stop signal, SIGKILL
after a grace period, then give up with a warning rather than wait for ever), and read the
result JSON. A dry run prints each variant's two commands instead.

The scripts import this module as ``serve_ab`` from their own directory, whether they run
as ``python scripts/bench/<name>.py`` or are loaded by file path in the tests.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

READY_POLL_S = 5.0
STOP_GRACE_S = 120.0
KILL_WAIT_S = 30.0
# Bounds of the flags both scripts hand to vLLM, checked before any server starts: on a device a server
# takes minutes to start, and vLLM refuses (or a bench never ends on) these only then.
MAX_TOKENS = 1 << 25  # a prompt, an output or a token budget of 32 Mi tokens is past any model's context
MAX_PROMPTS = 100_000  # requests of one bench: hours of serving at any rate a device sustains
MAX_WAIT_S = 86_400  # a day: --ready-timeout-s, and the arrivals of --num-prompts at --request-rate
MAX_PARALLEL = 64  # --pipeline-parallel-size, --tensor-parallel-size: past any deployment's device count


def within(parser: argparse.ArgumentParser, flag: str, value: int, low: int, high: int) -> None:
    """``value`` in [low, high], else ``parser.error`` naming ``flag`` (exit 2)."""
    if not low <= value <= high:
        parser.error(f"{flag} must be in [{low}, {high}], got {value}")


def check_serving_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags both scripts share (``bench_serve_command``'s, the port, the timeout, ``--result-dir``,
    ``--serve-arg``)."""
    for extra in args.serve_arg:  # split like a shell would when the commands are made
        try:
            shlex.split(extra)
        except ValueError as error:
            parser.error(
                f"--serve-arg {extra!r}: not words a shell could split ({error}); balance its quotes or escape one"
            )
    within(parser, "--port", args.port, 1, 65535)
    within(parser, "--input-len", args.input_len, 1, MAX_TOKENS)
    within(parser, "--output-len", args.output_len, 1, MAX_TOKENS)
    within(parser, "--num-prompts", args.num_prompts, 1, MAX_PROMPTS)
    within(parser, "--ready-timeout-s", args.ready_timeout_s, 1, MAX_WAIT_S)
    within(parser, "--seed", args.seed, 0, 2**32 - 1)  # vllm bench serve seeds numpy with it
    arrivals_s = args.num_prompts / float(args.request_rate)  # 'inf' or > 0, checked by the script
    if arrivals_s > MAX_WAIT_S:
        parser.error(
            f"--request-rate {args.request_rate}: {args.num_prompts} prompts arrive over {arrivals_s:g} s, more than"
            " a day; give a higher rate or fewer --num-prompts"
        )
    nearest = next(p for p in (args.result_dir, *args.result_dir.parents) if p.exists() or p == Path(p.anchor))
    if nearest.exists() and not nearest.is_dir():
        parser.error(f"--result-dir {args.result_dir}: {nearest} is a file, not a folder; give a folder")
    try:
        tempfile.TemporaryFile(dir=nearest if nearest.exists() else Path.cwd()).close()
    except OSError as error:
        parser.error(f"--result-dir {args.result_dir}: cannot write in {nearest} ({error.strerror}); give a folder")


def patchset_module(name: str, flags: str) -> ModuleType | None:
    """``vllm_ascend.<name>``, to check ``flags`` with the server's own parser before any server starts: from
    this checkout's assembled tree (``make assemble``: what the wheel packs) when there is one, else from the
    installed vllm_ascend. None, with one warning, when neither has it: the server checks them at its start."""
    scripts = str(Path(__file__).resolve().parents[1])  # the tooling package
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from vllm_ascend_patchset.paths import PACKAGE, assembled_root

    tree = assembled_root()
    if (tree / PACKAGE / "__init__.py").is_file() and str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    try:
        return importlib.import_module(f"{PACKAGE}.{name}")
    except Exception as error:  # any failure to import only defers the check to the server
        print(
            f"warning: {flags} not checked before the servers start ({PACKAGE}.{name}: {error}); the server checks "
            "them at its start. Run 'make assemble' in this checkout, or install the patched wheel, to check here",
            file=sys.stderr,
        )
        return None


def split_serve_args(serve_args: Iterable[str]) -> list[str]:
    """The repeatable ``--serve-arg`` values, each split like a shell would."""
    return [part for extra in serve_args for part in shlex.split(extra)]


def bench_serve_command(
    args: argparse.Namespace,
    result: Path,
    *,
    percentile_metrics: str,
    metric_percentiles: str = "50,99",
    extra_flags: Sequence[str] = (),
) -> list[str]:
    """``vllm bench serve`` on random prompts, saving its result JSON to ``result``.

    ``args`` carries ``vllm, model, host, port, input_len, output_len, num_prompts,
    request_rate, seed``; ``extra_flags`` follow the dataset flags.
    """
    return [
        args.vllm,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        *extra_flags,
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        str(args.request_rate),
        "--seed",
        str(args.seed),
        "--ignore-eos",
        "--percentile-metrics",
        percentile_metrics,
        "--metric-percentiles",
        metric_percentiles,
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def print_dry_run(runs: Iterable[tuple[str, Sequence[str], Sequence[str]]]) -> None:
    """Each variant's label, serve command and bench command, shell-quoted."""
    for label, serve, bench in runs:
        print(f"# {label}")
        print(shlex.join(serve))
        print(shlex.join(bench))


def start_server(command: Sequence[str]) -> subprocess.Popen:
    """The server in a session of its own, so that stopping it reaches its workers too."""
    return subprocess.Popen(list(command), start_new_session=True)


def wait_ready(server: subprocess.Popen, url: str, timeout_s: float, poll_s: float = READY_POLL_S) -> None:
    """Return once ``url`` answers 200; raise if the server exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {server.returncode} before it was ready")
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError(f"vllm serve at {url} not ready after {timeout_s} s")
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, remaining_s)) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _signal_group(server: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(server.pid, signum)
    except ProcessLookupError:
        pass  # the whole group is gone already


def stop_server(
    server: subprocess.Popen,
    stop_signal: int,
    grace_s: float = STOP_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> None:
    """Send ``stop_signal`` to the server's process group, SIGKILL it after ``grace_s``; never hang."""
    if server.poll() is not None:
        return
    _signal_group(server, stop_signal)
    try:
        server.wait(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    _signal_group(server, signal.SIGKILL)
    try:
        server.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:
        print(f"warning: vllm serve (pid {server.pid}) still alive {kill_wait_s} s after SIGKILL", file=sys.stderr)


def load_result(path: Path) -> dict:
    return json.loads(path.read_text())


def serve_and_bench(
    args: argparse.Namespace,
    serve: Sequence[str],
    bench: Sequence[str],
    result: Path,
    stop_signal: int,
    ready_poll_s: float = READY_POLL_S,
) -> dict:
    """Serve one variant, benchmark it, stop it, and return its result JSON.

    ``args`` carries ``host, port, ready_timeout_s``.
    """
    server = start_server(serve)
    try:
        wait_ready(server, f"http://{args.host}:{args.port}/health", args.ready_timeout_s, ready_poll_s)
        subprocess.run(list(bench), check=True)
    finally:
        stop_server(server, stop_signal)
    return load_result(result)
