"""A rank for test_ds_bench.py: rank 0 fails at once, rank 1 waits forever (as in a collective its peer never joins)."""

import json
import sys
import time

if __name__ == "__main__":
    rank, out = int(sys.argv[1]), sys.argv[-1]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rank": 0, "errors": ["injected: rank 0 failed"]}, f)
        sys.exit(1)
    while True:
        time.sleep(1)
