"""One rank of the PP = 2 x TP = 2 test: ``python -m dual_stream.pp_worker RANK 4 PORT MODEL_DIR OUT``.

Ranks 0 and 1 are stage 0's TP group, ranks 2 and 3 stage 1's (vLLM's rank layout). Each
rank builds the patch set's ``DualStreamQwen3ForCausalLM`` with vLLM's real Qwen3 layers
of its stage (``rank_model.ReferenceAttention`` in place of the attention kernel), and for
each batch:

- stage 0 runs its layers single-stream and dual-stream from the same KV cache (the
  first stage embeds), keeps how far the dual-stream hidden states and residual are from
  the single-stream ones, and sends both pairs to its peer of stage 1 (gloo send, rank
  r to r + 2);
- stage 1 runs single-stream on what stage 0's single stream sent and dual-stream on
  what stage 0's dual stream sent (a later stage cuts the intermediate tensors it
  receives; the last joins and normalises), and dual-stream again on the single-stream
  input, so the last stage's own error shows apart from what it inherited.

Every rank records its gate's decision (reason, split point) per batch, so the test can
check that the decision is the same on every TP rank of a stage.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dual_stream.rank_model import (  # noqa: E402
    BLOCK_SIZE,
    NUM_BLOCKS,
    batch_context,
    build_rank_model,
    init_weights,
)
from dual_stream.tp_worker import scenarios  # noqa: E402

TP = 2


def _max_diff(a, b) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def main(rank: int, world: int, port: int, model_dir: str, out_path: str) -> None:
    torch.set_num_threads(1)
    started = time.monotonic()
    results: dict = {"rank": rank, "runs": [], "errors": []}
    try:
        from vllm.distributed import get_pp_group, get_tp_group
        from vllm.sequence import IntermediateTensors
        from vllm_ascend.dual_stream.config import DualStreamConfig

        from dual_stream.batches import build_batch
        from dual_stream.cpu_backends import GlooAsyncBackend

        additional = {"dual_stream_config": {"enabled": True, "length_threshold": 2}}
        model, vllm_config = build_rank_model(rank, world, port, model_dir, tp=TP, additional_config=additional)
        init_weights(model)
        pp, tp = get_pp_group(), get_tp_group()
        results.update(stage=pp.rank_in_group, tp_rank=tp.rank_in_group, layers=[model.model.start_layer,
                       model.model.end_layer], dual_stream_on=model._dual_stream_on)  # fmt: skip
        layers = [model.model.layers[i].self_attn.attn for i in range(model.model.start_layer, model.model.end_layer)]
        kv_shape = (2, NUM_BLOCKS, BLOCK_SIZE, layers[0].num_kv_heads, layers[0].head_size)
        history = [
            torch.randn(kv_shape, generator=torch.Generator().manual_seed(100 + model.model.start_layer + i))
            for i in range(len(layers))
        ]
        vocab = model.config.vocab_size
        hidden = model.config.hidden_size
        off = DualStreamConfig()
        on = model.dual_stream_config  # from additional_config, as a server reads it

        def forward(config, requests, state, intermediate=None):
            model.dual_stream_config, model._dual_stream_on = config, config.enabled
            model.dual_stream_backend = GlooAsyncBackend(tp.device_group)
            metadata, positions = build_batch(requests, BLOCK_SIZE, NUM_BLOCKS, seed=3, state=state)
            input_ids = torch.randint(0, vocab, (positions.shape[0],), generator=torch.Generator().manual_seed(9))
            for attn, cache in zip(layers, history, strict=True):
                attn.kv_cache = cache.clone()
            before = model.dual_stream_batches
            with batch_context(vllm_config, layers, metadata):
                out = model(input_ids if pp.is_first_rank else None, positions, intermediate)
            caches = [a.kv_cache.clone() for a in layers]
            return out, caches, model.dual_stream_batches > before

        def cache_diff(a, b):
            return max(_max_diff(x, y) for x, y in zip(a, b, strict=True))

        for name, (requests, state) in scenarios().items():
            tokens = sum(r.query_tokens for r in requests)
            run = {"scenario": name, "tokens": tokens}
            if pp.is_first_rank:
                ref, ref_cache, ref_dual = forward(off, requests, state)
                out, cache, took_dual = forward(on, requests, state)
                assert isinstance(out, IntermediateTensors) and isinstance(ref, IntermediateTensors)
                run["max_hidden_diff"] = _max_diff(out["hidden_states"], ref["hidden_states"])
                run["max_residual_diff"] = _max_diff(out["residual"], ref["residual"])
                run["scale"] = float(ref["hidden_states"].abs().max())
                for tensors in (ref, out):
                    for key in ("hidden_states", "residual"):
                        dist.send(tensors[key].contiguous(), dst=rank + TP)
            else:
                received = []
                for _ in range(2):
                    pair = {key: torch.empty(tokens, hidden) for key in ("hidden_states", "residual")}
                    for key in ("hidden_states", "residual"):
                        dist.recv(pair[key], src=rank - TP)
                    received.append(IntermediateTensors(pair))
                ref, ref_cache, ref_dual = forward(off, requests, state, received[0])
                out, cache, took_dual = forward(on, requests, state, received[1])
                own, own_cache, _ = forward(on, requests, state, received[0])
                run["max_out_diff"] = _max_diff(out, ref)
                run["max_own_diff"] = _max_diff(own, ref)
                run["max_own_cache_diff"] = cache_diff(own_cache, ref_cache)
                run["scale"] = float(ref.abs().max())
            run.update(
                reference_took_dual=ref_dual,
                took_dual=took_dual,
                reason=model.dual_stream_last_reason,
                point=list(
                    map(int, (model.dual_stream_last_point.first_requests, model.dual_stream_last_point.first_tokens))
                )
                if model.dual_stream_last_point is not None
                else None,
                max_cache_diff=cache_diff(cache, ref_cache),
            )
            results["runs"].append(run)
    except Exception:
        results["errors"].append(traceback.format_exc())
    results["total_s"] = time.monotonic() - started
    with open(out_path, "w") as f:
        json.dump(results, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
