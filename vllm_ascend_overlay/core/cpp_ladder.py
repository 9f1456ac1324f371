"""The 1-1.5-2 ladder of chunk sizes: 32, 64, 96, 128, 192, 256, 384, 512, ... tokens.

Powers of two from 32 and, from 96, one and a half times each: the sizes CPP profiles
(core/cpp_profile_plan.py ``chunk_ladder``), the fixed chunks its safety net weighs a plan
against (core/cpp_chunk_check.py ``fixed_sweep``), and the sizes the pipeline twin sweeps
and shapes its stress surfaces on. Stated here once for all of them.

Imports nothing, so the tooling can load it from the overlay's source without a build.
"""

from __future__ import annotations

__all__ = ["SMALLEST_LADDER_CHUNK", "ladder"]

SMALLEST_LADDER_CHUNK = 32  # the ladder's first size; its 1.5x sizes start at 1.5x the next (96)


def ladder(low: float, high: float) -> list[int]:
    """The ladder's sizes from ``low`` to ``high`` tokens (both included), ascending; ValueError for an
    unbounded ``high``."""
    if not high < 1 << 62:
        raise ValueError(f"the chunk ladder up to {high!r} tokens: give a finite token count")
    sizes = []
    power = SMALLEST_LADDER_CHUNK
    while power <= high:
        for size in (power, power * 3 // 2) if power > SMALLEST_LADDER_CHUNK else (power,):
            if low <= size <= high:
                sizes.append(size)
        power *= 2
    return sizes
