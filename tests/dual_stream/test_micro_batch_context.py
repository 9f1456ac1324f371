"""A micro-batch's forward context: cut once per forward, entered once per layer and micro-batch for free."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm_ascend.dual_stream.split import SplitPoint
from vllm_ascend.models.qwen3 import micro_batch_context, split_slot_mapping

from dual_stream.test_gate import TensorOps

POINT = SplitPoint(first_requests=2, first_tokens=4, num_requests=3, num_tokens=10)


def test_the_slot_mapping_halves_are_views_of_each_layers_mapping():
    slots = {"l0": torch.arange(10), "l1": torch.arange(100, 110)}
    first, second = split_slot_mapping(slots, POINT)
    assert first["l1"].tolist() == [100, 101, 102, 103] and second["l0"].tolist() == list(range(4, 10))
    assert second["l1"].data_ptr() == slots["l1"][4:].data_ptr(), "a view, not a copy"


def test_anything_but_a_per_layer_dict_is_left_to_both_micro_batches():
    for slots in (None, {}, [{"l0": torch.arange(10)}]):
        first, second = split_slot_mapping(slots, POINT)
        assert first is slots and second is slots


def test_entering_a_micro_batch_only_swaps_references_and_restores_them():
    full_slots = {"l0": torch.arange(10)}
    ctx = SimpleNamespace(attn_metadata={"l0": "whole batch"}, slot_mapping=full_slots)
    halves = ({"l0": "first half"}, {"l0": "second half"})
    slots = split_slot_mapping(full_slots, POINT)
    seen = []
    with TensorOps() as recorded:
        for index in (0, 1):
            with micro_batch_context(ctx, halves, slots, index):
                seen.append((ctx.attn_metadata, ctx.slot_mapping))
    assert recorded.ops == [], "no tensor is cut while entering: that happened once, before the layers"
    assert seen == [(halves[0], slots[0]), (halves[1], slots[1])]
    assert ctx.attn_metadata == {"l0": "whole batch"} and ctx.slot_mapping is full_slots
