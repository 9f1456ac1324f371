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
- ``odd1``, ``odd3``, ``odd10``: isolated points where a kernel's choice of tiling makes a
  step faster or slower than its neighbours, reproducibly (one, three, ten of them, at
  small chunks and deep histories). A point scales the time above the fixed cost at one
  chunk size and history; a grid measured there, read linearly in between, spreads it
  to the sizes of the 1-1.5-2 ladder either side and ``ODD_HISTORY_SPAN`` tokens of
  history either side. ``odd1`` is a 768-token chunk at depth that takes less than a
  512-token one; ``odd3`` three points 30-45% below a smaller chunk or a shallower
  history; ``odd10`` seven fast and three slow. These surfaces fall where their points are
  fast.
- ``sweet``: sweet-spot sizes, a size that hits a better kernel (whole tiles on every
  core): exactly 384, 768 and 1536 tokens cost 35% less above the fixed cost, at every
  history; one token more or less costs the surface's own time.
- ``bent1k-sharp``, ``bent1k-soft``, ``bent1536``: time per token flat up to a knee (1024
  or 1536 tokens: activations that fit a buffer), then steep (the time per token grows by
  four times its flat value over the next ``knee`` tokens), with a small
  per-step cost (2 ms, a captured graph), so the best fixed chunk is a few hundred
  tokens; the bend is sharp (64 tokens wide) or soft (768). ``bent1536`` bends at 1536
  over 256 tokens.

Noise and slow drift are the twin's ``--noise`` and ``--drift`` options, on any surface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .ladder import ladder


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
    # odd: (chunk, history, factor) of each odd point; sweet: (size, factor) of each sweet spot
    points: tuple[tuple[float, ...], ...] = field(default=(), hash=False)
    width_tokens: float = 0.0  # bent: how wide the knee is

    @property
    def monotone(self) -> bool:
        """Whether time never falls as the chunk or the history grows (odd and sweet points make it fall)."""
        return self.mechanism not in ("odd", "sweet")

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
        elif self.mechanism in ("odd", "sweet", "bent"):
            linear, attention = token * c, pair * c * (h + c / 2)
            if self.mechanism == "bent":
                linear = linear * (1.0 + 4.0 * _smooth_excess(c, size, self.width_tokens) / size)
            variable = linear + self.history_token_ms * h + attention
            return fixed + variable * self._point_factors(c, float(history_tokens))
        elif self.mechanism == "attn-switch":
            linear = token * c
            plain = c * (h + c / 2)
            paged = c * (0.6 * (h + c / 2) + 0.55 * size)
            attention = pair * np.where(h < size, plain, paged)
        else:  # pragma: no cover - the table below names every mechanism
            raise ValueError(f"unknown mechanism {self.mechanism!r}")
        return fixed + linear + self.history_token_ms * h + attention

    def _point_factors(self, chunks: np.ndarray, history: float) -> np.ndarray:
        """The odd points' (or sweet spots') factors on the time above the fixed cost."""
        factors = np.ones_like(chunks)
        for point in self.points:
            if self.mechanism == "sweet":
                size, factor = point
                factors = np.where(chunks == size, factors * factor, factors)
                continue
            size, depth, factor = point
            below, above = _ladder_neighbours(size)
            across = np.where(chunks <= size, (chunks - below) / (size - below), (above - chunks) / (above - size))
            along = max(0.0, 1.0 - abs(history - depth) / ODD_HISTORY_SPAN)
            factors = factors * (1.0 + (factor - 1.0) * np.clip(across, 0.0, 1.0) * along)
        return factors

    def time_ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return float(self.time_ms_many(np.array([float(chunk_tokens)]), history_tokens)[0])

    def describe(self) -> str:
        mechanism = f"{self.mechanism} at {self.size_tokens:g} tokens"
        return f"stress:{self.name}: {mechanism} on a per-step cost of {self.fixed_ms:g} ms"


ODD_HISTORY_SPAN = 8192.0  # an odd point reaches this many tokens of history either side


LADDER = ladder(32, 98304)  # the odd points' neighbours: 32 .. 96k


def _ladder_neighbours(size: float) -> tuple[float, float]:
    """The sizes of the 1-1.5-2 ladder (32, 64, 96, 128, 192, ...) either side of ``size``."""
    below = max([c for c in LADDER if c < size], default=size / 2)
    above = min([c for c in LADDER if c > size], default=size * 2)
    return below, above


def _smooth_excess(chunks: np.ndarray, knee: float, width: float) -> np.ndarray:
    """Tokens past ``knee``, rounded over the knee's ``width``: 0 before it, a parabola across it, then linear."""
    past = np.maximum(chunks - knee + width / 2, 0.0)
    return np.where(past < width, past * past / (2 * width), past - width / 2)


# Odd points: (chunk, history, factor on the time above the fixed cost), at small chunks and depth.
_ODD_ONE = ((768.0, 28672.0, 0.57),)
_ODD_THREE = ((128.0, 24576.0, 0.45), (192.0, 16384.0, 0.5), (384.0, 28672.0, 0.55))
_ODD_TEN = (
    *_ODD_THREE,
    (96.0, 30720.0, 1.5),
    (256.0, 20480.0, 0.6),
    (512.0, 12288.0, 1.4),
    (768.0, 98304.0, 0.6),
    (1024.0, 114688.0, 1.35),
    (1536.0, 65536.0, 0.65),
    (3072.0, 122880.0, 0.7),
)

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
    # One prompt at a time, as waves: a device's odd points, sweet spots and buffer follow the rows of the
    # whole batch, while the twin would give each request of a batch with decodes its own.
    "odd1": StressSurface("odd1", "odd", fixed_ms=4.0, points=_ODD_ONE, with_decodes=False),
    "odd3": StressSurface("odd3", "odd", fixed_ms=4.0, points=_ODD_THREE, with_decodes=False),
    "odd10": StressSurface("odd10", "odd", fixed_ms=4.0, points=_ODD_TEN, with_decodes=False),
    "sweet": StressSurface(
        "sweet", "sweet", fixed_ms=10.0, points=((384.0, 0.65), (768.0, 0.65), (1536.0, 0.65)), with_decodes=False
    ),
    **{
        name: StressSurface(name, "bent", fixed_ms=2.0, size_tokens=knee, width_tokens=width, with_decodes=False)
        for name, knee, width in (
            ("bent1k-sharp", 1024.0, 64.0),
            ("bent1k-soft", 1024.0, 768.0),
            ("bent1536", 1536.0, 256.0),
        )
    },
}


def stress_surface(name: str) -> StressSurface:
    """``stress:<name>``; an unknown name lists the known ones."""
    surface = STRESS_SURFACES.get(name)
    if surface is None:
        raise ValueError(f"--surface stress:{name}: unknown; give one of {', '.join(sorted(STRESS_SURFACES))}")
    if not math.isfinite(surface.time_ms(1, 0)):
        raise ValueError(f"--surface stress:{name}: not finite at one token")
    return surface
