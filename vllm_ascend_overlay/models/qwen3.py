"""Qwen3 dense with dual-stream TP all-reduce overlap for prefill batches.

``DualStreamQwen3ForCausalLM`` is vLLM's ``Qwen3ForCausalLM``: same layers, same weight
loading, same forward for every batch that does not qualify (``dual_stream.gate``) and
for every batch when ``dual_stream_config.enabled`` is false. A qualifying batch is
embedded, cut into two micro-batches, run through the layers eagerly with the
dual-stream schedule (``dual_stream.schedule``), merged and normalised. Under pipeline
parallelism each stage does its part of that: the first embeds and hands hidden states
and residual on, joined; a later stage cuts what it receives; the last normalises. Each
stage decides on its own (its TP ranks alike), its collectives stay inside its TP group.

With ``length_threshold`` unset the gate is measured (``dual_stream.measured``): a batch
of a size class not measured yet is a probe, run both ways and timed, and from then on
the batches of that class go where they measured faster.

Faults: only the decision (``gate.decide``, the measured gate's routing) and the cut of
the attention metadata and slot mapping in two may fall back to the upstream forward,
with one warning, the feature then off for the rest of the process. They run before the
first collective, on host-side values identical on every TP rank, so every rank meets
the same fault and falls back together. So does a fault of the
measured gate's start (its collectives are reached by every rank whatever the cache read
gave) or of a probe's timing (agreed on by every rank before it is used). From the
embedding's all-reduce on, a fault of a forward propagates, as it would from the upstream
forward: a rank that ran single-stream while its peers waited in dual-stream collectives
would hang the job until the communication timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import (
    get_pp_group,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    tensor_model_parallel_all_reduce,
)
from vllm.forward_context import ForwardContext, get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.sequence import IntermediateTensors
from vllm_ascend.dual_stream import measured_group
from vllm_ascend.dual_stream.config import CONFIG_KEY, DualStreamConfig
from vllm_ascend.dual_stream.gate import ASCEND_METADATA, MetadataSplitter, decide
from vllm_ascend.dual_stream.measured import MeasuredMode, ProbeRun
from vllm_ascend.dual_stream.schedule import MicroBatch, run_layers
from vllm_ascend.dual_stream.split import SplitPoint, split_tokens
from vllm_ascend.dual_stream.streams import NpuStreamBackend, StreamBackend

logger = init_logger(__name__)


def load_dual_stream_config(vllm_config: VllmConfig) -> DualStreamConfig:
    """The validated config from AscendConfig; parsed from additional_config when that is absent."""
    try:
        from vllm_ascend.ascend_config import get_ascend_config

        config = getattr(get_ascend_config(), "dual_stream_config", None)
        if isinstance(config, DualStreamConfig):
            return config
    except (ImportError, RuntimeError):
        pass
    return DualStreamConfig.from_dict((vllm_config.additional_config or {}).get(CONFIG_KEY))


class Qwen3LayerOps:
    """The two halves of vLLM's ``Qwen3DecoderLayer``, built from its own submodules."""

    @staticmethod
    def attention_partial(layer, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = layer.input_layernorm(hidden_states)
        else:
            hidden_states, residual = layer.input_layernorm(hidden_states, residual)
        return layer.self_attn(positions=positions, hidden_states=hidden_states), residual

    @staticmethod
    def mlp_partial(layer, hidden_states, residual):
        hidden_states, residual = layer.post_attention_layernorm(hidden_states, residual)
        return layer.mlp(hidden_states), residual


def _row_parallel_layers(layers: list[Any]) -> list[Any]:
    return [m for layer in layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)]


@contextlib.contextmanager
def row_parallel_reduce_deferred(layers: list[Any]) -> Iterator[None]:
    """o_proj / down_proj return partial sums for the call; their all-reduce moves to the schedule."""
    modules = _row_parallel_layers(layers)
    saved = [m.reduce_results for m in modules]
    try:
        for m in modules:
            m.reduce_results = False
        yield
    finally:
        for m, value in zip(modules, saved, strict=True):
            m.reduce_results = value


def split_slot_mapping(slot_mapping: Any, point: SplitPoint) -> tuple[Any, Any]:
    """The forward context's per-layer slot mapping of each micro-batch (views), cut once per forward.

    Anything but a non-empty dict (None, a per-ubatch list) is left to both micro-batches as it is.
    """
    if not isinstance(slot_mapping, dict) or not slot_mapping:
        return slot_mapping, slot_mapping
    halves = {name: split_tokens(t, point) for name, t in slot_mapping.items()}
    return {n: h[0] for n, h in halves.items()}, {n: h[1] for n, h in halves.items()}


@contextlib.contextmanager
def micro_batch_context(
    ctx: ForwardContext, metadata: tuple[dict[str, Any], dict[str, Any]], slots: tuple[Any, Any], index: int
) -> Iterator[None]:
    """Install micro-batch ``index``'s attention metadata and slot mapping in the forward context.

    Entered once per layer and micro-batch, so it only swaps references: the halves are cut
    once per forward (``split_metadata_by_layer``, ``split_slot_mapping``).
    """
    saved_metadata, saved_slots = ctx.attn_metadata, ctx.slot_mapping
    ctx.attn_metadata, ctx.slot_mapping = metadata[index], slots[index]
    try:
        yield
    finally:
        ctx.attn_metadata, ctx.slot_mapping = saved_metadata, saved_slots


class DualStreamQwen3ForCausalLM(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.dual_stream_config = load_dual_stream_config(vllm_config)
        # Built on first use (NPU streams need the device); CPU tests assign their own.
        self.dual_stream_backend: StreamBackend | None = None
        # How the attention metadata is read and cut: vllm-ascend's; the CPU engine's tests assign theirs.
        self.dual_stream_splitter: MetadataSplitter = ASCEND_METADATA
        self.dual_stream_batches = 0  # forwards that took the dual-stream path (probes included)
        self.dual_stream_last_reason = ""  # the gate's reason for the last batch ("split" when it split)
        self.dual_stream_last_point: SplitPoint | None = None  # and its split point
        self.dual_stream_measured: MeasuredMode | None = None  # the measured gate, from the first split batch
        speculative = getattr(vllm_config, "speculative_config", None)  # a decode verifies its draft tokens
        self.dual_stream_decode_tokens = 1 + int(getattr(speculative, "num_speculative_tokens", None) or 0)
        self._dual_stream_on = self.dual_stream_config.enabled and self._supports_dual_stream()

    @property
    def dual_stream_active(self) -> bool:
        """Dual stream is on for this model: enabled, supported here, and not turned off by a fault."""
        return self._dual_stream_on

    def _supports_dual_stream(self) -> bool:
        if self.vllm_config.lora_config is not None:
            logger.warning("[DualStream] LoRA is on; %s stays off.", CONFIG_KEY)
            return False
        for module in _row_parallel_layers(self._local_layers()):
            if getattr(module, "custom_op", None) is not None or not hasattr(module, "reduce_results"):
                logger.warning(
                    "[DualStream] %s replaces the row-parallel all-reduce (%s); %s stays off.",
                    type(module).__name__,
                    type(getattr(module, "custom_op", None)).__name__,
                    CONFIG_KEY,
                )
                return False
        return True

    def _local_layers(self) -> list[Any]:
        return list(islice(self.model.layers, self.model.start_layer, self.model.end_layer))

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        point, route = None, "single"
        if self._dual_stream_on and not self.model.aux_hidden_state_layers:
            try:
                point = self._split_point(positions)
                route = "dual" if point is not None else "single"
            except Exception:
                self._fall_back("deciding the split failed")
            if point is not None and self.dual_stream_config.measured:
                route = self._measured_route(point)
        if route == "single":
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        try:  # still before any collective, on the same host-side values on every rank (module docstring)
            ctx = get_forward_context()
            halves = (
                self.dual_stream_splitter.split(ctx.attn_metadata, point),
                split_slot_mapping(ctx.slot_mapping, point),
            )
        except Exception:
            self._fall_back("cutting the batch in two failed")
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        # From here on a fault of a forward propagates (module docstring): collectives are about to be issued.
        if route == "probe":
            return self._probe(point, halves, input_ids, positions, intermediate_tensors, inputs_embeds)
        return self._forward_dual_stream(point, halves, input_ids, positions, intermediate_tensors, inputs_embeds)

    def _measured_route(self, point: SplitPoint) -> str:
        """The measured gate's call for a split batch; starts the gate (collectives) on first use."""
        if self.dual_stream_measured is None:
            try:
                pp_group = get_pp_group()
                self.dual_stream_measured = measured_group.start(
                    self.dual_stream_config,
                    self.vllm_config,
                    get_tp_group(),
                    stage=pp_group.rank_in_group if pp_group.world_size > 1 else None,
                )
            except Exception:
                self._fall_back("starting the measured gate failed")
                return "single"
        try:
            route = self.dual_stream_measured.gate.route(min(point.first_tokens, point.second_tokens))
        except Exception:
            self._fall_back("deciding the split failed")
            return "single"
        if route == "single":
            self.dual_stream_last_reason = f"measured gate: {self.dual_stream_measured.gate.describe()}"
        elif route == "probe":
            self.dual_stream_last_reason = "measured gate: probe"
        return route

    def _probe(self, point, halves, input_ids, positions, intermediate_tensors, inputs_embeds):
        """One batch single- and dual-stream, timed; the measured gate keeps the agreed timings."""
        mode = self.dual_stream_measured
        run = ProbeRun(
            run_single=lambda: Qwen3ForCausalLM.forward(
                self, input_ids, positions, intermediate_tensors, inputs_embeds
            ),
            run_dual=lambda: self._forward_dual_stream(
                point, halves, input_ids, positions, intermediate_tensors, inputs_embeds
            ),
            synchronize=self._backend().synchronize,
            agree=measured_group.agree(get_tp_group()),
        )
        output = mode.probe(min(point.first_tokens, point.second_tokens), run)
        if mode.fault is not None:  # agreed on by every rank: all fall back together
            self._fall_back(f"measuring dual stream failed: {mode.fault}", exc_info=False)
        elif mode.gate.finished and not mode.decided_logged:
            mode.decided_logged = True
            logger.info("[DualStream] measured gate decided: %s", mode.gate.describe())
        return output

    def _split_point(self, positions: torch.Tensor) -> SplitPoint | None:
        """The gate's decision for this batch; issues no collective and no device work."""
        self.dual_stream_last_point = None
        try:
            ctx = get_forward_context()
        except AssertionError:
            return None
        capturing = getattr(ctx, "capturing", False) or (getattr(ctx, "additional_kwargs", None) or {}).get(
            "capturing", False
        )  # vllm-ascend's model runner v1 / v2
        eager = ctx.cudagraph_runtime_mode == CUDAGraphMode.NONE and not capturing and not torch.compiler.is_compiling()
        decision = decide(
            self.dual_stream_config,
            ctx.attn_metadata,
            int(positions.shape[-1]),
            get_tensor_model_parallel_world_size(),
            eager,
            self.dual_stream_splitter,
            self.dual_stream_decode_tokens,
        )
        self.dual_stream_last_reason, self.dual_stream_last_point = decision.reason, decision.point
        return decision.point

    def _backend(self) -> StreamBackend:
        if self.dual_stream_backend is None:
            self.dual_stream_backend = NpuStreamBackend(tensor_model_parallel_all_reduce)
        return self.dual_stream_backend

    def _fall_back(self, what: str, exc_info: bool = True) -> None:
        logger.warning("[DualStream] %s; this batch and all later ones run single-stream.", what, exc_info=exc_info)
        self._dual_stream_on = False

    def _forward_dual_stream(
        self,
        point: SplitPoint,
        halves: tuple[tuple[dict[str, Any], dict[str, Any]], tuple[Any, Any]],
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor | IntermediateTensors:
        """This stage's layers over two micro-batches: what ``Qwen2Model.forward`` does, per stage.

        The first stage embeds; a later one cuts the hidden states and residual it received.
        A stage before the last hands both on, joined; the last normalises and joins.
        """
        ctx = get_forward_context()
        metadata, slots = halves  # (the attention metadata and slot mapping of each micro-batch)
        pp_group = get_pp_group()
        if pp_group.is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.model.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        position_halves = split_tokens(positions, point, dim=-1)
        hidden_halves = split_tokens(hidden_states, point)
        residual_halves = split_tokens(residual, point)
        micro_batches = [MicroBatch(position_halves[i], hidden_halves[i], residual_halves[i]) for i in range(2)]
        layers = self._local_layers()
        with row_parallel_reduce_deferred(layers):
            run_layers(
                layers,
                micro_batches,
                Qwen3LayerOps,
                self._backend(),
                lambda i: micro_batch_context(ctx, metadata, slots, i),
            )
        self.dual_stream_batches += 1
        if not pp_group.is_last_rank:
            return IntermediateTensors(
                {
                    "hidden_states": torch.cat([mb.hidden_states for mb in micro_batches]),
                    "residual": torch.cat([mb.residual for mb in micro_batches]),
                }
            )
        # The final norm works row by row: normalise each micro-batch, then one concatenation
        # (instead of concatenating hidden states and residual first, twice the copying).
        return torch.cat([self.model.norm(mb.hidden_states, mb.residual)[0] for mb in micro_batches])
