"""This rank's model for the gloo tests: vLLM's real Qwen3 layers in the patch set's model class.

``build_rank_model`` sets up vLLM's distributed state at TP x PP over gloo and builds
``DualStreamQwen3ForCausalLM`` with vLLM's attention kernel replaced by
``ReferenceAttention``: a CPU attention that reads only the metadata contract
(cumulative query lengths, sequence lengths, block tables, slot mapping) to write and
read a paged KV cache, and asserts that the metadata it is given is a self-consistent
batch. ``init_weights`` draws the same weights for a parameter name on every run.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

BLOCK_SIZE = 4
NUM_BLOCKS = 96


class ReferenceAttention(nn.Module):
    """Stands in for vLLM's ``Attention``: same constructor and call, a CPU paged-KV kernel."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, cache_config=None, quant_config=None,
                 prefix="", attn_type=None, **_):  # fmt: skip
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.layer_name = prefix
        self.kv_cache: torch.Tensor | None = None  # [2, blocks, block_size, kv_heads, head_size]

    @staticmethod
    def check_contract(m, num_query_tokens: int) -> list[int]:
        cumulative = list(m.actual_seq_lengths_q)
        query_lens = [b - a for a, b in zip([0, *cumulative[:-1]], cumulative, strict=True)]
        n = len(cumulative)
        assert m.num_actual_tokens == cumulative[-1] == num_query_tokens, "token count"
        assert m.query_start_loc.tolist() == [0, *cumulative], "query_start_loc is not [0] + cumulative"
        assert m.seq_lens.tolist() == list(m.seq_lens_list) and len(m.seq_lens_list) == n, "seq_lens"
        assert m.seq_lens_cpu.tolist() == list(m.seq_lens_list), "seq_lens_cpu"
        assert m.block_tables.shape[0] >= n, "block table rows"
        assert m.slot_mapping.shape[0] >= m.num_actual_tokens, "slot mapping length"
        assert m.max_query_len == max(query_lens), "max_query_len"
        assert all(q >= 1 for q in query_lens), "empty request"
        assert m.num_decodes + m.num_prefills == n, "request counts"
        assert all(q == 1 for q in query_lens[: m.num_decodes]), "decodes first"
        assert m.num_decode_tokens == sum(query_lens[: m.num_decodes]), "decode tokens"
        assert all(s >= q for s, q in zip(m.seq_lens_list, query_lens, strict=True)), "sequence shorter than query"
        return query_lens

    def forward(self, query, key, value):
        from vllm.forward_context import get_forward_context

        ctx = get_forward_context()
        m = ctx.attn_metadata[self.layer_name]
        assert torch.equal(ctx.slot_mapping[self.layer_name], m.slot_mapping), "forward-context slot mapping"
        num_tokens = query.shape[0]
        query_lens = self.check_contract(m, num_tokens)
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_size
        q = query.view(num_tokens, heads, dim)
        key_cache = self.kv_cache[0].view(-1, kv_heads, dim)
        value_cache = self.kv_cache[1].view(-1, kv_heads, dim)
        slots = m.slot_mapping[: m.num_actual_tokens].long()
        key_cache[slots] = key.view(num_tokens, kv_heads, dim)
        value_cache[slots] = value.view(num_tokens, kv_heads, dim)
        out = torch.empty_like(q)
        start = 0
        for r, (q_len, seq_len) in enumerate(zip(query_lens, m.seq_lens_list, strict=True)):
            kv_pos = torch.arange(seq_len)
            kv_slots = m.block_tables[r, kv_pos // BLOCK_SIZE].long() * BLOCK_SIZE + kv_pos % BLOCK_SIZE
            k = key_cache[kv_slots].repeat_interleave(heads // kv_heads, dim=1)
            v = value_cache[kv_slots].repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[start : start + q_len], k) * self.scale
            q_pos = seq_len - q_len + torch.arange(q_len)
            scores = scores.masked_fill(kv_pos[None, :] > q_pos[:, None], float("-inf"))
            out[start : start + q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
            start += q_len
        return out.view(num_tokens, heads * dim)


def build_rank_model(rank: int, world: int, port: int, model_dir: str, tp: int, additional_config=None):
    """vLLM's distributed state over gloo at TP = ``tp`` x PP = ``world // tp`` and this rank's
    ``DualStreamQwen3ForCausalLM`` (its stage's layers, ``ReferenceAttention``); returns it and its config."""
    import vllm.model_executor.models.qwen3 as vllm_qwen3
    from vllm.config import (
        CompilationConfig,
        CompilationMode,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm_ascend.models.qwen3 import DualStreamQwen3ForCausalLM

    model_config = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=256
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=world // tp),
        compilation_config=CompilationConfig(mode=CompilationMode.NONE, custom_ops=["none"]),
        additional_config=additional_config or {},
    )
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=world, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=rank,
            backend="gloo",
        )  # fmt: skip
        initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=world // tp)
        vllm_qwen3.Attention = ReferenceAttention
        model = DualStreamQwen3ForCausalLM(vllm_config=vllm_config).eval()
    return model, vllm_config


def init_weights(model: nn.Module) -> None:
    """Deterministic per parameter name, so both runs of a rank use the same weights."""
    for name, param in model.named_parameters():
        gen = torch.Generator().manual_seed(sum(map(ord, name)) * 7919 + param.numel())
        with torch.no_grad():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(0.08 * torch.randn(param.shape, generator=gen))


@contextlib.contextmanager
def batch_context(vllm_config, layers, metadata):
    """What one forward of a batch runs in: ``vllm_config``, a forward context giving every
    attention layer of ``layers`` ``metadata`` and its slot mapping, and no autograd."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    per_layer = {a.layer_name: metadata for a in layers}
    slots = {a.layer_name: metadata.slot_mapping for a in layers}
    with (
        set_current_vllm_config(vllm_config),
        set_forward_context(per_layer, vllm_config, slot_mapping=slots),
        torch.no_grad(),
    ):
        yield
