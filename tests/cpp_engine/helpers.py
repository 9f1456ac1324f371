"""A real vLLM 0.23.0 scheduler on the CPU, for CPP and hook tests (and the pipeline twin).

Public entry points:

- ``load_balance_module(tree=None)``: upstream's ``patch_balance_schedule`` module from a
  vllm_ascend tree (default: the assembled one), loaded on its own so the rest of
  ``vllm_ascend.patch.platform`` (NPU-only) is not imported.
- ``make_vllm_config(model_dir, ...)``: a ``VllmConfig`` for a tiny local model.
- ``make_scheduler(scheduler_cls=None, ...)``: a scheduler over a one-group KV cache.
- ``profiling_chunk_scheduler_class()``: our CPP scheduler class from the assembled tree.
- ``make_request(...)``, ``model_output(...)``, ``run_to_completion(...)``.

Importing this module imports vLLM (a few seconds), with the NPU stubs set aside.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import npu_stubs

BALANCE_MODULE = "vllm_ascend.patch.platform.patch_balance_schedule"
EOS_TOKEN_ID = 0


def import_vllm() -> None:
    """Import vLLM's config and scheduler with the NPU stubs out of the way.

    transformers probes ``importlib.util.find_spec("torch_npu")``, which raises on a
    stub module without a spec; vLLM itself needs no NPU module.
    """
    saved = {name: sys.modules.pop(name) for name in npu_stubs.STUBBED if name in sys.modules}
    try:
        import vllm.config  # noqa: F401
        import vllm.v1.core.sched.scheduler  # noqa: F401
        import vllm.v1.core.single_type_kv_cache_manager  # noqa: F401
    finally:
        sys.modules.update(saved)


def load_balance_module(tree: Path | None = None):
    """``patch_balance_schedule`` from ``tree`` (a folder holding ``vllm_ascend/``)."""
    if BALANCE_MODULE in sys.modules and tree is None:
        return sys.modules[BALANCE_MODULE]
    import_vllm()
    if tree is None:
        import vllm_ascend

        tree = Path(vllm_ascend.__file__).resolve().parents[1]
    path = Path(tree) / "vllm_ascend" / "patch" / "platform" / "patch_balance_schedule.py"
    spec = importlib.util.spec_from_file_location(BALANCE_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[BALANCE_MODULE] = module
    spec.loader.exec_module(module)
    return module


def profiling_chunk_scheduler_class() -> type:
    """Our ProfilingChunkScheduler, importable once upstream's BalanceScheduler module is loaded."""
    load_balance_module()
    from vllm_ascend.core.scheduler_profiling_chunk import ProfilingChunkScheduler

    return ProfilingChunkScheduler


TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
    "eos_token_id": EOS_TOKEN_ID,
}


def write_tiny_model(model_dir: Path) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
    return model_dir


def make_vllm_config(
    model_dir: Path,
    *,
    max_num_batched_tokens: int = 256,
    max_num_seqs: int = 16,
    max_model_len: int = 8192,
    block_size: int = 16,
    enable_prefix_caching: bool = True,
    long_prefill_token_threshold: int = 0,
    pipeline_parallel_size: int = 1,
    policy: str = "fcfs",
    additional_config: dict | None = None,
):
    import_vllm()
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    write_tiny_model(Path(model_dir))
    model_config = ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        dtype="float16",
        seed=0,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=long_prefill_token_threshold,
        policy=policy,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=enable_prefix_caching,
    )
    parallel_config = ParallelConfig(pipeline_parallel_size=pipeline_parallel_size)
    return VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        parallel_config=parallel_config,
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional_config or {},
    )


def make_scheduler(
    scheduler_cls: type | None = None,
    *,
    model_dir: Path,
    num_blocks: int = 1024,
    vllm_config: Any = None,
    **config_kwargs: Any,
):
    """A scheduler of ``scheduler_cls`` (default: upstream's BalanceScheduler) on a CPU KV cache.

    ``config_kwargs`` go to ``make_vllm_config`` unless ``vllm_config`` is given.
    """
    import_vllm()
    import torch
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if vllm_config is None:
        vllm_config = make_vllm_config(model_dir, **config_kwargs)
    if scheduler_cls is None:
        scheduler_cls = load_balance_module().BalanceScheduler
    block_size = vllm_config.cache_config.block_size
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    register_all_kvcache_specs(vllm_config)
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=False,
    )


_HASHER: dict[int, Callable] = {}


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    max_tokens: int,
    block_size: int = 16,
    priority: int = 0,
    arrival_time: float = 0.0,
):
    """A request that generates exactly ``max_tokens`` tokens (EOS ignored)."""
    import_vllm()
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    if block_size not in _HASHER:
        init_none_hash(sha256)
        _HASHER[block_size] = get_request_block_hasher(block_size, sha256)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=_HASHER[block_size],
    )


def model_output(scheduler, scheduler_output, *, token_id: int = 7, **extra: Any):
    """The ModelRunnerOutput a model would return: one token per request that finished its prompt."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        num_after = request.num_computed_tokens  # already advanced by _update_after_schedule
        sampled.append([token_id] if num_after >= request.num_tokens else [])
    output = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
    for key, value in extra.items():
        setattr(output, key, value)
    return output


def summarize(scheduler_output) -> dict:
    """A comparable, JSON-able record of one SchedulerOutput."""
    cached = scheduler_output.scheduled_cached_reqs
    return {
        "num_scheduled_tokens": list(scheduler_output.num_scheduled_tokens.items()),
        "total": scheduler_output.total_num_scheduled_tokens,
        "new": [
            [r.req_id, r.num_computed_tokens, [list(b) for b in r.block_ids]]
            for r in scheduler_output.scheduled_new_reqs
        ],
        "cached": [
            list(cached.req_ids),
            list(cached.num_computed_tokens),
            [None if b is None else [list(g) for g in b] for b in cached.new_block_ids],
            sorted(cached.resumed_req_ids),
        ],
        "preempted": sorted(scheduler_output.preempted_req_ids or ()),
        "finished": sorted(scheduler_output.finished_req_ids),
        "common_prefix_blocks": list(scheduler_output.num_common_prefix_blocks),
    }


def run_to_completion(
    scheduler,
    arrivals: Iterable[tuple[int, Any]] = (),
    *,
    max_steps: int = 2000,
    on_step: Callable[[Any, Any], dict] | None = None,
    generated: dict[str, int] | None = None,
) -> list:
    """Drive ``schedule()``/``update_from_output()`` until every request finished.

    ``arrivals`` holds (step, request) pairs; ``on_step(scheduler, scheduler_output)``
    may return extra attributes for the model output (e.g. measured timing);
    ``generated`` (if given) receives each request's number of generated tokens.
    Returns the list of SchedulerOutputs.
    """
    pending = sorted(arrivals, key=lambda item: item[0])
    outputs = []
    step = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            scheduler.add_request(pending.pop(0)[1])
        scheduler_output = scheduler.schedule()
        extra = on_step(scheduler, scheduler_output) if on_step else {}
        engine_outputs = scheduler.update_from_output(
            scheduler_output, model_output(scheduler, scheduler_output, **extra)
        )
        if generated is not None:
            for client_outputs in engine_outputs.values():
                for output in client_outputs.outputs:
                    generated[output.request_id] = generated.get(output.request_id, 0) + len(output.new_token_ids)
        outputs.append(scheduler_output)
        step += 1
        if step > max_steps:
            raise AssertionError(f"requests still unfinished after {max_steps} steps")
    return outputs


import_vllm()
