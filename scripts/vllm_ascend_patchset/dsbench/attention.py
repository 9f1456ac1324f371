"""A paged-KV CPU attention in place of vLLM's ``Attention``, reading only the metadata contract.

Same constructor and call as the layer it replaces in vLLM's ``Qwen3Attention``. Per
call it writes the batch's keys and values into this layer's paged cache at
``slot_mapping`` (as ``reshape_and_cache`` does), then attends:

- decodes (the first ``num_decodes`` requests, one query token each) in one batched call
  over their cached sequences, read through the block tables, padded to the longest;
- a prefill without history over its own keys and values, causally;
- a prefill with history (a chunk of a long prompt) over its cached history and, causally,
  its own keys: two fused calls whose results are merged by their log-sum-exp (one call
  with an explicit mask takes torch's unfused path, several times slower, where a
  device's kernel handles a chunk as fast as a prefill).

Attention is torch's fused CPU attention with grouped KV heads. The bench times it as
part of compute, as a device would its attention kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PagedSdpaAttention(nn.Module):
    block_size = 128  # tokens per KV block; the bench's batches use the same

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, cache_config=None, quant_config=None,
                 prefix="", attn_type=None, **_):  # fmt: skip
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.layer_name = prefix
        self.kv_cache: torch.Tensor | None = None  # [2, blocks, block_size, kv_heads, head_size]

    def _gather(self, cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
        """[length, kv_heads, head] of one request's cached sequence."""
        positions = torch.arange(length)
        slots = block_row[positions // self.block_size].long() * self.block_size + positions % self.block_size
        return cache[slots]

    def _sdpa(self, q, k, v, mask=None, causal=False):
        """q [batch, n, heads, d], k/v [batch, s, kv_heads, d]; returns q's shape.

        Four dimensions (batch, heads, tokens, head) take torch's fused CPU kernel; three
        take a path several times slower.
        """
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        ctx = get_forward_context()
        m = ctx.attn_metadata[self.layer_name]
        tokens = query.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_size
        q = query.view(tokens, heads, dim)
        k = key.view(tokens, kv_heads, dim)
        v = value.view(tokens, kv_heads, dim)
        key_cache = self.kv_cache[0].view(-1, kv_heads, dim)
        value_cache = self.kv_cache[1].view(-1, kv_heads, dim)
        slots = ctx.slot_mapping[self.layer_name][:tokens].long()
        key_cache.index_copy_(0, slots, k)
        value_cache.index_copy_(0, slots, v)
        out = torch.empty_like(q)
        cumulative = [0, *m.actual_seq_lengths_q]
        decodes = int(m.num_decodes)
        if decodes:
            out[:decodes] = self._decodes(q[:decodes], key_cache, value_cache, m, decodes)
        for r in range(decodes, len(cumulative) - 1):
            start, end = cumulative[r], cumulative[r + 1]
            seq_len = int(m.seq_lens_list[r])
            if seq_len == end - start:  # no history: its own keys and values
                out[start:end] = self._sdpa(q[None, start:end], k[None, start:end], v[None, start:end], causal=True)[0]
                continue
            history = seq_len - (end - start)
            cached_k = self._gather(key_cache, m.block_tables[r], history)
            cached_v = self._gather(value_cache, m.block_tables[r], history)
            out[start:end] = self._chunk(q[start:end], (cached_k, cached_v), (k[start:end], v[start:end]))
        return out.view(tokens, heads * dim)

    def _chunk(self, q, cached, own):
        """q [n, heads, d] over its history (all of it) and its own keys (causally)."""
        fused = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
        if fused is None:  # a torch without the fused op: one masked call over the whole sequence
            keys, values = (torch.cat([c, o]) for c, o in zip(cached, own, strict=True))
            history = cached[0].shape[0]
            mask = torch.arange(keys.shape[0])[None, :] <= history + torch.arange(q.shape[0])[:, None]
            return self._sdpa(q[None], keys[None], values[None], mask=mask)[0]
        group = self.num_heads // self.num_kv_heads

        def heads_first(t):  # [s, kv_heads, d] -> [1, heads, s, d]
            return t.repeat_interleave(group, dim=1).transpose(0, 1)[None] if group > 1 else t.transpose(0, 1)[None]

        query = q.transpose(0, 1)[None]
        out_h, lse_h = fused(query, heads_first(cached[0]), heads_first(cached[1]), 0.0, False, scale=self.scale)
        out_o, lse_o = fused(query, heads_first(own[0]), heads_first(own[1]), 0.0, True, scale=self.scale)
        lse = torch.logaddexp(lse_h, lse_o)
        merged = out_h * torch.exp(lse_h - lse)[..., None] + out_o * torch.exp(lse_o - lse)[..., None]
        return merged[0].transpose(0, 1)

    def _decodes(self, q, key_cache, value_cache, m, decodes):
        lengths = [int(s) for s in m.seq_lens_list[:decodes]]
        longest = max(lengths)
        ks = torch.stack([self._gather(key_cache, m.block_tables[r], longest) for r in range(decodes)])
        vs = torch.stack([self._gather(value_cache, m.block_tables[r], longest) for r in range(decodes)])
        mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
        return self._sdpa(q[:, None], ks, vs, mask=mask)[:, 0]  # each decode a batch of one query
