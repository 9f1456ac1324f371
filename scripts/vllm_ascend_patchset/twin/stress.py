"""Stress surfaces: latency shapes a quadratic cannot follow, each from a real mechanism.

Whole-model milliseconds of one request's chunk of C new tokens after H tokens of
history, on an accelerator-like base (a per-step cost, linear work per token, reading
the history, causal attention over the chunk's own tokens and the history):

    base(C, H) = fixed + token * C + history * H + pair * C * (H + C / 2)

Each stress surface changes one mechanism:

- ``cache``: a working set that outgrows an on-chip buffer. The linear work costs the
  same per token up to 1536 tokens of activations, then more for each token beyond
  (spilled tiles stream from device memory); attention pairs over history beyond 16k
  tokens cost 2.5x (the KV cache no longer stays resident). Time per token is flat,
  then climbs steeply.
- ``tiles128``, ``tiles256``, ``tiles512``: matrix units work on tiles of 128 (256, 512)
  rows, so a chunk costs as many tokens as the tiles it fills, and attention runs over
  whole tiles of history: time rises in steps. ``tiles128-light`` is the 128-row device
  with a small per-step cost (2 ms, a step launched as one graph) and cheaper tokens:
  a tile's step is then a large share of a small chunk's time.
- ``knee``: part of each step's overhead appears only once a chunk needs more than one
  pass of the compute units (K = 512 tokens): small chunks are cheaper than the line
  through large ones predicts.
- ``waves``: the matrix units' tiles are spread over the device's cores (24 of them, 128
  rows a tile), so the linear work runs in waves of 3072 tokens: time is flat within a
  wave and jumps by a whole wave one token past it. For one prompt at a time: the twin
  costs a batch's requests one by one, so a decode beside it would pay a wave of its own.
- ``attn-switch``: past 24k tokens of history the attention kernel switches to a
  paged variant that costs 0.6x per pair but pays a per-token setup, a 15% jump up at
  the switch, then slower growth.

Noise and slow drift are the twin's ``--noise`` and ``--drift`` options, on any surface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StressSurface:
    """The base surface with one mechanism changed (see the module docstring)."""

    name: str
    mechanism: str
    fixed_ms: float = 40.0
    token_ms: float = 0.05
    history_token_ms: float = 1.5e-5
    pair_ms: float = 3.0e-7
    size_tokens: float = 0.0  # the mechanism's size: buffer, tile, knee or switch point
    # False: for one prompt at a time. The twin costs a batch as its fixed cost plus each request's
    # own, so where one token costs a whole wave every decode beside a prompt would pay one of its
    # own, which no device does (it runs the batch's rows together, in shared waves).
    with_decodes: bool = True

    def time_ms_many(self, chunk_tokens: np.ndarray, history_tokens: float) -> np.ndarray:
        c = np.asarray(chunk_tokens, dtype=np.float64)
        h = np.full_like(c, float(history_tokens))
        token, pair, size = self.token_ms, self.pair_ms, self.size_tokens
        fixed = np.full_like(c, self.fixed_ms)
        if self.mechanism == "cache":
            linear = token * (c + 1.5 * np.maximum(c - size, 0.0) ** 2 / size)
            resident = 16384.0
            attention = pair * c * (np.minimum(h, resident) + 2.5 * np.maximum(h - resident, 0.0) + c / 2)
        elif self.mechanism == "tiles":
            c = np.ceil(c / size) * size
            h = np.ceil(h / size) * size
            linear, attention = token * c, pair * c * (h + c / 2)
        elif self.mechanism == "waves":
            linear, attention = token * np.ceil(c / size) * size, pair * c * (h + c / 2)
        elif self.mechanism == "knee":
            fixed = fixed + 50.0 * (1.0 - np.exp(-c / size))
            linear, attention = token * c, pair * c * (h + c / 2)
        elif self.mechanism == "attn-switch":
            linear = token * c
            plain = c * (h + c / 2)
            paged = c * (0.6 * (h + c / 2) + 0.55 * size)
            attention = pair * np.where(h < size, plain, paged)
        else:  # pragma: no cover - the table below names every mechanism
            raise ValueError(f"unknown mechanism {self.mechanism!r}")
        return fixed + linear + self.history_token_ms * h + attention

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return float(self.time_ms_many(np.array([float(chunk_tokens)]), history_tokens)[0])

    def describe(self) -> str:
        mechanism = f"{self.mechanism} at {self.size_tokens:g} tokens"
        return f"stress:{self.name}: {mechanism} on a per-step cost of {self.fixed_ms:g} ms"


STRESS_SURFACES = {
    "cache": StressSurface("cache", "cache", size_tokens=1536.0),
    "tiles128": StressSurface("tiles128", "tiles", size_tokens=128.0),
    "tiles256": StressSurface("tiles256", "tiles", size_tokens=256.0),
    "tiles512": StressSurface("tiles512", "tiles", size_tokens=512.0),
    "tiles128-light": StressSurface("tiles128-light", "tiles", fixed_ms=2.0, token_ms=0.02, size_tokens=128.0),
    # An empty step costs only the part of the overhead that does not grow with the chunk.
    "knee": StressSurface("knee", "knee", fixed_ms=10.0, size_tokens=512.0),
    "attn-switch": StressSurface("attn-switch", "attn-switch", size_tokens=24576.0),
    "waves": StressSurface("waves", "waves", size_tokens=3072.0, with_decodes=False),
}


def stress_surface(name: str) -> StressSurface:
    """``stress:<name>``; an unknown name lists the known ones."""
    surface = STRESS_SURFACES.get(name)
    if surface is None:
        raise ValueError(f"--surface stress:{name}: unknown; give one of {', '.join(sorted(STRESS_SURFACES))}")
    if not math.isfinite(surface.time_ms(1, 0)):
        raise ValueError(f"--surface stress:{name}: not finite at one token")
    return surface
