#!/usr/bin/env python3
"""Latency surfaces of mechanisms the committed ones do not have, as twin CSVs, for probing CPP.

Each is whole-model milliseconds of one request's chunk of C tokens after H tokens of
history, on a grid dense enough (every 32 tokens up to 8192, and both sides of every
tile or wave boundary) that the twin's linear interpolation keeps the mechanism:

- ``moe``: an MoE layer reads the weights of the experts a chunk's tokens touch (8 of
  128 each): time jumps within the first 50 tokens, then grows linearly;
- ``heavyfixed``: a 120 ms per-step cost (a step launched eagerly), cheap tokens;
- ``attndom``: attention dominates (1.2e-6 ms per token pair);
- ``ramp``: small chunks use the matrix units poorly (4x the cost per token at 1 token);
- ``tiles96``: 96-row tiles, a size the profile's tile probe (64-512, powers of two) does not try;
- ``wave20``, ``wave24``: 128-row tiles spread over 20 or 24 cores, so time steps by a
  whole wave every 2560 or 3072 tokens and is flat between.

    PYTHONPATH=scripts .venv/bin/python scripts/bench/probe_surfaces.py [--out build/probe-surfaces]
    PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_surfaces.py --gate \\
        --surfaces build/probe-surfaces/moe.csv,build/probe-surfaces/wave24.csv,...

It writes the files and prints the second command; it asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

HISTORIES = (0, 2048, 4096, 8192, 16384, 32768, 65536, 98304, 131072, 139264)
LADDER = sorted({1, 8, 16, 24, *range(32, 8193, 32)})


def _moe(c: float, h: float) -> float:
    experts, per_token = 128, 8
    touched = experts * (1 - (1 - per_token / experts) ** c)
    return 30 + 0.4 * touched + 0.03 * c + 2e-7 * c * (h + c / 2) + 1e-5 * h


def _heavy_fixed(c: float, h: float) -> float:
    return 120 + 0.02 * c + 2e-7 * c * (h + c / 2) + 1e-5 * h


def _attention_dominated(c: float, h: float) -> float:
    return 20 + 0.02 * c + 1.2e-6 * c * (h + c / 2) + 4e-5 * h


def _ramp(c: float, h: float) -> float:
    return 10 + 0.05 * c * (1 + 3 * math.exp(-c / 256)) + 3e-7 * c * (h + c / 2) + 1.5e-5 * h


def _tiles96(c: float, h: float) -> float:
    rows, history = math.ceil(c / 96) * 96, math.ceil(h / 96) * 96
    return 5 + 0.03 * rows + 2.5e-7 * rows * (history + rows / 2) + 1.2e-5 * history


def _waves(cores: int) -> Callable[[float, float], float]:
    span = 128 * cores

    def time_ms(c: float, h: float) -> float:
        waves = math.ceil(math.ceil(c / 128) / cores)
        return 40 + 100.0 * span / 2560 * waves + 0.005 * c + 3e-7 * c * (h + c / 2) + 1.5e-5 * h

    return time_ms


def _edges(step: int) -> list[int]:
    """Both sides of every boundary of a staircase of ``step`` tokens up to 8192, with the ladder."""
    return sorted({*LADDER, *range(step, 8193, step), *range(1, 8194, step)})


SURFACES: dict[str, tuple[Callable[[float, float], float], list[int]]] = {
    "moe": (_moe, LADDER),
    "heavyfixed": (_heavy_fixed, LADDER),
    "attndom": (_attention_dominated, LADDER),
    "ramp": (_ramp, LADDER),
    "tiles96": (_tiles96, _edges(96)),
    "wave20": (_waves(20), _edges(128)),
    "wave24": (_waves(24), _edges(128)),
}


def write_surfaces(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (time_ms, chunks) in SURFACES.items():
        path = out_dir / f"{name}.csv"
        rows = [f"{c},{h},{time_ms(float(c), float(h)):.6f}" for h in HISTORIES for c in chunks]
        path.write_text("chunk_tokens,history_tokens,latency_ms\n" + "\n".join(rows) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/probe-surfaces"))
    args = parser.parse_args(argv)
    nearest = next(p for p in (args.out, *args.out.parents) if p.exists() or p == Path(p.anchor))
    if nearest.exists() and not nearest.is_dir():
        parser.error(f"--out {args.out}: {nearest} is a file, not a folder; give a folder for the surfaces")
    try:
        paths = write_surfaces(args.out)
    except OSError as error:
        parser.error(f"--out {args.out}: cannot write there ({error.strerror or error}); give a writable folder")
    print(f"{len(paths)} surfaces in {args.out}; the one-prompt gate on them:")
    print(
        "PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_surfaces.py --gate --surfaces "
        + ",".join(str(p) for p in paths)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
