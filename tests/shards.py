"""Run pytest as N processes that share the selected tests, one per core: ``make test-fast`` runs two.

    python tests/shards.py N [pytest arguments]      # e.g. python tests/shards.py 2 tests --fast -q

Process K runs ``pytest ARGS --shard K/N``: every N-th selected test from the K-th
(tests/conftest.py). Their outputs are printed one after the other when all are done; the
exit status is the first failing process's (0 when every one passed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

NO_TESTS = 5  # pytest's exit status when a process was given no test


def shard_option(text: str) -> tuple[int, int]:
    """``--shard K/N``: (K, N) with 0 <= K < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: give K/N with 0 <= K < N, e.g. 0/2")
    return index, count


def run(count: int, pytest_args: list[str]) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shards-") as tmp:
        logs = [open(f"{tmp}/shard-{index}.log", "w+") for index in range(count)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "pytest", *pytest_args, "--shard", f"{index}/{count}"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for index, log in enumerate(logs)
        ]
        codes = [proc.wait() for proc in procs]
        for index, log in enumerate(logs):
            log.seek(0)
            print(f"---- shard {index}/{count} (exit {codes[index]}) ----\n{log.read()}", end="")
            log.close()
    ran = [code for code in codes if code != NO_TESTS] or [NO_TESTS]
    status = next((code for code in ran if code != 0), 0)
    print(f"{count} shards in {time.monotonic() - started:.1f} s: exit {' '.join(map(str, codes))}")
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python tests/shards.py N [pytest arguments]  (N >= 1 processes)", file=sys.stderr)
        return 2
    return run(int(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main())
