"""scripts/bench/serve_ab.py: the server lifecycle the two serving benchmarks share, on tiny real processes.

The commands, dry run and tables are tested through the scripts (tests/cpp_engine/test_cpp_serve_script.py,
tests/dual_stream/test_bench_script.py); here: readiness, its two failures, and a stop that reaches the
server's workers and never hangs.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_ascend_patchset.paths import BENCH_DIR

spec = importlib.util.spec_from_file_location("serve_ab", BENCH_DIR / "serve_ab.py")
serve_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_ab)

POLL_S = 0.05


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _health_server(directory: Path, port: int) -> list[str]:
    """A stand-in for vllm serve: GET /health answers 200 (a file of that name)."""
    (directory / "health").write_text("ok")
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _until(condition, limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return condition()


def test_ready_server_is_benchmarked_then_stopped_with_the_stop_signal(tmp_path):
    port = _free_port()
    args = argparse.Namespace(host="127.0.0.1", port=port, ready_timeout_s=30)
    result = tmp_path / "out" / "variant.json"
    bench = [sys.executable, "-c", "import json, sys, urllib.request; "
             f"status = urllib.request.urlopen('http://127.0.0.1:{port}/health').status; "
             f"open({str(result)!r}, 'w').write(json.dumps({{'health_status': status}}))"]  # fmt: skip
    result.parent.mkdir()
    assert serve_ab.serve_and_bench(
        args, _health_server(tmp_path, port), bench, result, signal.SIGTERM, ready_poll_s=POLL_S
    ) == {"health_status": 200}
    server = serve_ab.start_server(_health_server(tmp_path, port))
    serve_ab.wait_ready(server, f"http://127.0.0.1:{port}/health", 30, POLL_S)
    serve_ab.stop_server(server, signal.SIGTERM)
    assert server.returncode == -signal.SIGTERM


def test_a_server_that_exits_before_ready_is_reported_with_its_code():
    server = serve_ab.start_server([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="exited with code 3 before it was ready"):
        serve_ab.wait_ready(server, f"http://127.0.0.1:{_free_port()}/health", 30, POLL_S)


def test_a_server_that_never_answers_times_out_and_is_stopped():
    # (SIGINT's handler set again: a shell starts a background job with SIGINT ignored, and Python keeps that)
    child = "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); time.sleep(600)"
    server = serve_ab.start_server([sys.executable, "-c", child])  # stopped long before
    try:
        with pytest.raises(TimeoutError, match="not ready after 0.3 s"):
            serve_ab.wait_ready(server, f"http://127.0.0.1:{_free_port()}/health", 0.3, POLL_S)
        assert server.poll() is None
    finally:
        serve_ab.stop_server(server, signal.SIGINT)
    assert server.returncode == -signal.SIGINT


def test_a_server_deaf_to_the_stop_signal_is_killed_with_its_workers(tmp_path):
    worker_pid_file = tmp_path / "worker.pid"
    # SIG_IGN survives fork and exec: the worker ignores SIGTERM as its server does
    script = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(worker_pid_file)!r}, 'w').write(str(worker.pid)); time.sleep(60)")  # fmt: skip
    server = serve_ab.start_server([sys.executable, "-c", script])
    assert _until(lambda: worker_pid_file.exists() and worker_pid_file.read_text() != "")
    worker_pid = int(worker_pid_file.read_text())
    serve_ab.stop_server(server, signal.SIGTERM, grace_s=0.5)
    assert server.returncode == -signal.SIGKILL
    assert _until(lambda: _gone(worker_pid)), "the worker outlived its server"


class _Unkillable:
    """A Popen stand-in that never exits, as a process stuck in the NPU driver would."""

    pid = 424242
    returncode = None

    def poll(self):
        return None

    def wait(self, timeout=None):
        raise subprocess.TimeoutExpired("vllm serve", timeout)


def test_stop_gives_up_with_a_warning_instead_of_hanging(monkeypatch, capsys):
    sent = []
    monkeypatch.setattr(serve_ab.os, "killpg", lambda pid, signum: sent.append((pid, signum)))
    serve_ab.stop_server(_Unkillable(), signal.SIGINT, grace_s=0.1, kill_wait_s=0.1)
    assert sent == [(424242, signal.SIGINT), (424242, signal.SIGKILL)]
    assert "still alive 0.1 s after SIGKILL" in capsys.readouterr().err


def test_stop_leaves_an_exited_server_alone(monkeypatch):
    monkeypatch.setattr(serve_ab.os, "killpg", lambda pid, signum: pytest.fail("signalled an exited server"))
    server = subprocess.Popen([sys.executable, "-c", "pass"])
    server.wait()
    serve_ab.stop_server(server, signal.SIGTERM)
    assert server.returncode == 0
