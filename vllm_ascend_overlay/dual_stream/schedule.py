"""The dual-stream layer schedule: two micro-batches, four events per layer and micro-batch.

Each decoder layer is two halves that end in a tensor-parallel all-reduce: attention
(norm, QKV, attention, o_proj) and MLP (norm, gate_up, act, down_proj). With the
all-reduce taken out of o_proj and down_proj, a layer runs, for micro-batches 0 and 1:

    attention(i)  waits FFN_AR_FINISH[layer-1][i]   then records ATTN_COM_FINISH[layer][i]
    comm stream:  waits ATTN_COM_FINISH[layer][i], all-reduce, records ATTN_AR_FINISH[layer][i]
    mlp(i)        waits ATTN_AR_FINISH[layer][i]    then records FFN_COM_FINISH[layer][i]
    comm stream:  waits FFN_COM_FINISH[layer][i],  all-reduce, records FFN_AR_FINISH[layer][i]

so the all-reduce of micro-batch 0 runs while micro-batch 1 computes, and the reverse.
Nothing else orders the two streams: every wait above is load-bearing (the ordering
tests remove one and watch the result change).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from vllm_ascend.dual_stream.streams import EventKind, StreamBackend


@dataclass
class MicroBatch:
    """One micro-batch's running state between layers (mutated by the schedule)."""

    positions: torch.Tensor
    hidden_states: torch.Tensor
    residual: torch.Tensor | None  # None before the first layer


class DecoderLayerOps(Protocol):
    """The two halves of a decoder layer, each returning its output *before* the all-reduce."""

    def attention_partial(
        self, layer: Any, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def mlp_partial(
        self, layer: Any, hidden_states: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def wait_for_previous_layer(backend: StreamBackend, layer_index: int, micro_batch: int) -> None:
    """Attention of a layer reads the previous layer's reduced MLP output."""
    if layer_index > 0:
        backend.wait((EventKind.FFN_AR_FINISH, layer_index - 1, micro_batch))


def wait_for_attention_reduce(backend: StreamBackend, layer_index: int, micro_batch: int) -> None:
    """The MLP of a layer reads the layer's reduced attention output."""
    backend.wait((EventKind.ATTN_AR_FINISH, layer_index, micro_batch))


def _reduce_on_comm_stream(
    backend: StreamBackend,
    partial: torch.Tensor,
    computed: EventKind,
    reduced: EventKind,
    layer_index: int,
    micro_batch: int,
) -> torch.Tensor:
    backend.record((computed, layer_index, micro_batch))
    with backend.comm_stream():
        backend.wait((computed, layer_index, micro_batch))
        result = backend.all_reduce(partial)
        backend.record((reduced, layer_index, micro_batch))
    return result


def run_layers(
    layers: Sequence[Any],
    micro_batches: list[MicroBatch],
    ops: DecoderLayerOps,
    backend: StreamBackend,
    attention_scope: Callable[[int], contextlib.AbstractContextManager] | None = None,
) -> list[MicroBatch]:
    """Run ``layers`` over ``micro_batches`` with the schedule above; returns them reduced.

    ``attention_scope(i)`` is entered around micro-batch i's attention (it installs that
    micro-batch's attention metadata in the forward context).
    """
    backend.begin()
    scope = attention_scope or (lambda _i: contextlib.nullcontext())
    last_layer = -1
    for layer_index, layer in enumerate(layers):
        for i, mb in enumerate(micro_batches):
            wait_for_previous_layer(backend, layer_index, i)
            with scope(i):
                partial, mb.residual = ops.attention_partial(layer, mb.positions, mb.hidden_states, mb.residual)
            mb.hidden_states = _reduce_on_comm_stream(
                backend, partial, EventKind.ATTN_COM_FINISH, EventKind.ATTN_AR_FINISH, layer_index, i
            )
        for i, mb in enumerate(micro_batches):
            wait_for_attention_reduce(backend, layer_index, i)
            partial, mb.residual = ops.mlp_partial(layer, mb.hidden_states, mb.residual)
            mb.hidden_states = _reduce_on_comm_stream(
                backend, partial, EventKind.FFN_COM_FINISH, EventKind.FFN_AR_FINISH, layer_index, i
            )
        last_layer = layer_index
    if last_layer >= 0:
        for i in range(len(micro_batches)):
            backend.wait((EventKind.FFN_AR_FINISH, last_layer, i))
    return micro_batches
