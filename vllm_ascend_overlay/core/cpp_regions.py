"""One prompt planned around sweet spots: a constant chunk per stretch of history, chosen by dynamic programming.

Where the cost per token dips at some sizes and histories (a kernel or tiling that suits
them: the odd points and sweet spots a profile keeps, core/cpp_falls.py), the least TTFT
of one prompt runs different sizes in different stretches of its history: the size the
dip favours where it is, another elsewhere. The chunk rule's one target cannot say that.

``region_plan`` cuts the prompt into ``REGIONS`` stretches of history and gives each a
constant chunk of one of the sizes the rule may run (the profiled sizes and the fixed
sweep's, on the granule), minimising

    sum of the batch times + (P - 1) x (the last batch + every fall from one batch to the next)

by dynamic programming over the stretches (the size of the stretch before is the state).
Through P stages with at most P batches in flight, batches whose times do not fall finish
after their sum plus (P - 1) times the last one; a batch shorter than the one before it
cannot start earlier, and the stages idle for about (P - 1) times the fall
(core/cpp_chunk_check.py ``pipeline_done_ms`` is the exact count). Within a stretch the
batches are read at its middle history (work) and at its ends (the falls between
stretches). The plan's chunk at any history is its stretch's size (``EfficientChunks`` as a
step curve, with a target every chunk fits); core/cpp_chunk_check.py weighs it chunk by
chunk against the rule's plan and constant chunks, and the best one runs.

Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule, EfficientChunks, Plan

__all__ = ["REGIONS", "region_plan"]

REGIONS = 24  # stretches of history a prompt is cut into: finer than the profile's levels, few to search


def region_plan(rule: ChunkRule, sizes: Sequence[int], history: int, remaining: int, plan: Plan) -> Plan | None:
    """A plan of a constant chunk of one of ``sizes`` per stretch of the prompt's history (see the module
    docstring), with ``plan``'s target and fixed cost; None when every stretch takes the same size (a
    constant chunk, which the fixed sweep weighs already) or there is no size to choose."""
    if not sizes or remaining <= 0:
        return None
    model, stages = rule.model, rule.num_stages
    chunks = np.asarray(sorted(sizes), dtype=np.float64)[None, :]
    bounds = history + remaining * np.arange(REGIONS + 1) / REGIONS
    starts, ends = bounds[:-1, None], bounds[1:, None]
    middle = np.maximum((starts + ends - chunks) / 2, starts)
    work = (ends - starts) / chunks * model.time_ms_many(chunks, middle)  # [stretch, size]
    first = model.time_ms_many(chunks, starts)
    last = model.time_ms_many(chunks, np.maximum(ends - chunks, starts))
    cost, choices = work[0], []
    for stretch in range(1, REGIONS):
        joined = cost[:, None] + (stages - 1) * np.maximum(0.0, last[stretch - 1][:, None] - first[stretch][None, :])
        choice = np.argmin(joined, axis=0)
        choices.append(choice)
        cost = joined[choice, np.arange(chunks.shape[1])] + work[stretch]
    size = int(np.argmin(cost + (stages - 1) * last[-1]))
    picked = [size]
    for choice in reversed(choices):
        size = int(choice[size])
        picked.append(size)
    picked.reverse()
    if len(set(picked)) == 1:
        return None
    histories, curve = [], []
    for stretch, size in enumerate(picked):  # a step curve: the stretch's size from its start to its end
        histories += [float(bounds[stretch]), float(np.nextafter(bounds[stretch + 1], -np.inf))]
        curve += [float(chunks[0, size])] * 2
    return Plan(plan.target_ms, plan.fixed_ms, EfficientChunks(tuple(histories), tuple(curve)))
