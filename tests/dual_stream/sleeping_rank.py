"""A rank for test_ds_bench.py that runs until it is stopped; rank 1 ignores SIGTERM, so only SIGKILL ends it."""

import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    rank, out = int(sys.argv[1]), Path(sys.argv[-1])
    if rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out.parent / f"rank{rank}.ready").write_text("")  # the disposition above is in place
    while True:
        time.sleep(1)
