"""The gate: which batches go dual-stream, from host-side metadata every TP rank holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend.dual_stream.gate import decide
from vllm_ascend.dual_stream.split import split_metadata_by_layer

from dual_stream.batches import FakeAscendMetadata, FakeAttentionState, Request, build_batch

ON = DualStreamConfig(True, "token_balanced", 1.0, 8)
MIXED = [Request(7, 1), Request(12, 1), Request(16, 20), Request(0, 13), Request(3, 9)]


def _batch(requests=MIXED, num_blocks=64, **kwargs):
    metadata, positions = build_batch(requests, block_size=4, num_blocks=num_blocks, **kwargs)
    return metadata, positions.shape[0]


def test_a_mixed_prefill_batch_is_split():
    metadata, tokens = _batch()
    by_layer = {"l0": metadata, "l1": metadata}
    decision = decide(ON, by_layer, tokens, tp_world_size=2, eager=True)
    assert decision.reason == "split" and decision.point.first_tokens == 22
    first, second = split_metadata_by_layer(by_layer, decision.point)
    assert first["l0"] is first["l1"]


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(config=DualStreamConfig()), "disabled"),
        (dict(tp_world_size=1), "tensor parallel size is 1"),
        (dict(eager=False), "graph mode"),
        (dict(attn_metadata=None), "no per-layer attention metadata"),
        (dict(attn_metadata=[{}]), "no per-layer attention metadata"),
        (dict(config=DualStreamConfig(True, "token_balanced", 1.0, 100)), "split refused by strategy"),
        (dict(num_input_tokens=48), "padded batch"),
    ],
)
def test_batches_that_stay_single_stream(change, reason):
    metadata, tokens = _batch()
    call = dict(config=ON, attn_metadata={"l0": metadata}, num_input_tokens=tokens, tp_world_size=2, eager=True)
    call.update(change)
    decision = decide(**call)
    assert decision.point is None and decision.reason.startswith(reason)


@pytest.mark.parametrize("state", [FakeAttentionState.DecodeOnly, FakeAttentionState.SpecDecoding])
def test_decode_and_speculative_batches_stay_single_stream(state):
    metadata, tokens = _batch([Request(5, 1)] * 4 if state is FakeAttentionState.DecodeOnly else MIXED, state=state)
    decision = decide(DualStreamConfig(True, "half_batch", 1.0, 1), {"l0": metadata}, tokens, 2, True)
    assert decision.point is None and decision.reason == f"{state.name} batch"


def test_a_batch_of_speculative_verifications_alone_stays_single_stream_whatever_its_label():
    """vllm-ascend labels a verification batch ChunkedPrefill for every method but MTP: 128 decodes of
    1 + 3 draft tokens are 512 tokens, enough to split, yet no request in it is a prefill."""
    metadata, tokens = _batch([Request(40, 4)] * 128, num_blocks=2048, state=FakeAttentionState.ChunkedPrefill)
    config = DualStreamConfig(True, "token_balanced", 1.0, 1)
    assert decide(config, {"l0": metadata}, tokens, 2, True).reason == "split"  # (as a batch of prompts would)
    decision = decide(config, {"l0": metadata}, tokens, 2, True, decode_tokens=4)
    assert decision.point is None and decision.reason == "decodes only (speculative verification)"
    with_prompt, tokens = _batch(
        [Request(0, 200)] + [Request(40, 4)] * 8 + [Request(0, 200)],
        num_blocks=2048,
        state=FakeAttentionState.ChunkedPrefill,
    )
    assert decide(config, {"l0": with_prompt}, tokens, 2, True, decode_tokens=4).reason == "split"


def test_a_padding_request_keeps_the_batch_single_stream():
    """The builder's FIA padding: one more request in query_start_loc, seq_lens and block_tables."""
    metadata, tokens = _batch()
    pad_row = metadata.block_tables.new_zeros(1, metadata.block_tables.shape[1])
    padded = dataclasses.replace(
        metadata,
        actual_seq_lengths_q=[*metadata.actual_seq_lengths_q, tokens + 2],
        seq_lens_list=[*metadata.seq_lens_list, 1],
        block_tables=torch.cat([metadata.block_tables, pad_row]),
    )
    assert decide(ON, {"l0": padded}, tokens + 2, 2, True).reason == "padded batch"


@pytest.mark.parametrize("field, value", [("prefill", object()), ("kvcomp_metadata", object()),
                                          ("num_actual_tokens_pcp_padded", 64)])  # fmt: skip
def test_metadata_of_features_the_splitter_does_not_cut_keeps_single_stream(field, value):
    metadata, tokens = _batch()
    decision = decide(ON, {"l0": dataclasses.replace(metadata, **{field: value})}, tokens, 2, True)
    assert decision.reason == f"metadata field {field} in use"


def test_metadata_with_fields_the_splitter_does_not_know_keeps_single_stream():
    @dataclasses.dataclass
    class ContextParallelMetadata(FakeAscendMetadata):
        pcp_allgather_restore_idx: list | None = None

    metadata, tokens = _batch()
    extended = ContextParallelMetadata(**{f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)})
    decision = decide(ON, {"l0": extended}, tokens, 2, True)
    assert decision.reason == "ContextParallelMetadata has fields the splitter does not know"


def test_attention_groups_that_disagree_keep_single_stream():
    metadata, tokens = _batch()
    other = dataclasses.replace(metadata, actual_seq_lengths_q=[1, 2, 21, 35, 44])
    assert metadata.actual_seq_lengths_q == [1, 2, 22, 35, 44]
    assert decide(ON, {"l0": metadata, "l1": other}, tokens, 2, True).reason == "attention groups disagree on the batch"


class TensorOps(TorchDispatchMode):
    """Records every tensor operation dispatched while active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("requests", [MIXED, [Request(5, 1)] * 4, MIXED[:1]])
def test_the_decision_runs_no_tensor_operation(requests):
    """The decision reads host-side lists, counts and shapes only, which every TP rank holds
    identically: so its outcome, and a fault in it, is the same on every rank (the model may
    fall back on such a fault without the ranks' collectives diverging), and it never
    synchronises or allocates on the device."""
    metadata, tokens = _batch(requests)
    with TensorOps() as recorded:
        decide(ON, {"l0": metadata, "l1": metadata}, tokens, 2, True)
    assert recorded.ops == []


def test_the_tensor_operation_recorder_sees_the_metadata_split():
    """Cutting the metadata (after the decision, where faults propagate) does run tensor ops."""
    metadata, tokens = _batch()
    point = decide(ON, {"l0": metadata}, tokens, 2, True).point
    with TensorOps() as recorded:
        split_metadata_by_layer({"l0": metadata}, point)
    assert recorded.ops
