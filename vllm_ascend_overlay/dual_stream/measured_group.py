"""The measured gate across the TP group: one cache read, one set of probes, one decision.

Every rank must take the same decision for every batch (a rank that went dual stream
alone would issue collectives of other sizes: a hang). So:

- the cache is read on the group's first rank only, and the probes it holds (numbers it
  has checked) are broadcast over the group's CPU channel as one float tensor, whatever
  the read gave (a missing or refused file broadcasts no probe);
- a probe's two timings are reduced with a max over the group (``agree``) before they are
  kept, so every rank adds the same probe;
- only the first rank writes the cache.

The decisions are then a function of identical values on every rank
(``measured.MeasuredGate``). Collectives go over the group's CPU (gloo) channel: no
device traffic, and the same on the NPU and in the CPU tests.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from vllm.logger import init_logger
from vllm_ascend.dual_stream import measured_store
from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend.dual_stream.measured import MeasuredGate, MeasuredMode, Probe, size_classes

logger = init_logger(__name__)


def start(config: DualStreamConfig, vllm_config: Any, group: Any, stage: int | None = None) -> MeasuredMode:
    """The measured gate of this model, the cached probes adopted on every rank alike.

    ``group`` is the TP group of this rank's pipeline stage; ``stage`` its index under PP > 1
    (each stage measures its own layers and keeps its own cache file), else None.
    """
    classes = size_classes(vllm_config.scheduler_config.max_num_batched_tokens)
    first = group.rank_in_group == 0
    path, key, probes = None, None, []
    if config.cache_path:
        key = measured_store.fingerprint(
            measured_store.deployment_fingerprint(vllm_config),
            split_strategy=config.split_strategy,
            balance_threshold=config.balance_threshold,
            classes=classes,
            repeats=config.measure_repeats,
            stage=stage,
        )
        path = measured_store.cache_file(config.cache_path, key)
        if first:
            probes = _read(path, key, classes, config.measure_repeats)
    probes = _broadcast(probes, len(classes) * config.measure_repeats, group)
    gate = MeasuredGate(classes, config.measure_repeats, probes)
    saver = _Saver(path, key) if first and path is not None else None
    if probes:
        logger.info("[DualStream] measured gate: %d probes from %s; %s", len(probes), path, gate.describe())
    else:
        logger.info(
            "[DualStream] measured gate: timing the first %d batches of each size class %s both ways",
            config.measure_repeats,
            list(classes),
        )
    return MeasuredMode(gate, saver)


def agree(group: Any):
    """``values -> the elementwise max over the group``, on every rank (a CPU collective)."""

    def reduce_max(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group.cpu_group)
        return tensor.tolist()

    return reduce_max


def _read(path, key, classes, repeats) -> list[Probe]:
    """The cached probes, or none with a warning naming what is wrong; never raises."""
    try:
        return measured_store.load(path, key=key, classes=classes, repeats=repeats) or []
    except Exception as error:  # a refused file (MeasuredCacheError) or anything the read met
        logger.warning("[DualStream] ignoring the measured gate's cache %s (%s); measuring again", path, error)
        return []


def _broadcast(probes: list[Probe], capacity: int, group: Any) -> list[Probe]:
    """The first rank's probes on every rank: [count, (class, single_s, dual_s) * capacity] as float64."""
    buffer = torch.zeros(1 + 3 * capacity, dtype=torch.float64)
    if group.rank_in_group == 0:
        kept = probes[:capacity]
        buffer[0] = len(kept)
        for i, probe in enumerate(kept):
            buffer[1 + 3 * i : 4 + 3 * i] = torch.tensor(
                [probe.size_class, probe.single_s, probe.dual_s], dtype=torch.float64
            )
    if group.world_size > 1:
        dist.broadcast(buffer, src=group.ranks[0], group=group.cpu_group)
    rows = buffer[1 : 1 + 3 * int(buffer[0])].view(-1, 3).tolist()
    return [Probe(int(size_class), single_s, dual_s) for size_class, single_s, dual_s in rows]


class _Saver:
    """Writes the probes after each complete class; a failed write warns once and stops saving."""

    def __init__(self, path, key):
        self.path, self.key = path, key

    def __call__(self, probes: list[Probe]) -> None:
        if self.path is None:
            return
        try:
            measured_store.save(self.path, key=self.key, probes=probes)
        except OSError as error:
            logger.warning(
                "[DualStream] could not save the measured gate's probes to %s: %s; the next start measures them "
                'again (set dual_stream_config.cache_dir to a folder the server can write, or "" for none)',
                self.path, error,
            )  # fmt: skip
            self.path = None
