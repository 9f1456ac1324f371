"""A real vLLM 0.23.0 scheduler on the CPU, for CPP and hook tests (and the pipeline twin).

Public entry points:

- ``load_balance_module(tree=None)``: upstream's ``patch_balance_schedule`` module from a
  vllm_ascend tree (default: the assembled one), loaded on its own so the rest of
  ``vllm_ascend.patch.platform`` (NPU-only) is not imported.
- ``make_vllm_config(model_dir, ...)``: a ``VllmConfig`` for a tiny local model.
- ``make_scheduler(scheduler_cls=None, ...)``: a scheduler over a one-group KV cache.
  Both are the pipeline twin's factories (``vllm_ascend_patchset.twin.engine``) with
  these tests' defaults.
- ``profiling_chunk_scheduler_class()``: our CPP scheduler class from the assembled tree.
- ``make_request(...)``, ``model_output(...)``, ``run_to_completion(...)``.

Importing this module imports vLLM (a few seconds), with the NPU stubs set aside.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import npu_stubs
from vllm_ascend_patchset.npu_stubs import import_vllm as import_vllm_setting_aside
from vllm_ascend_patchset.trees import load_module_from_tree
from vllm_ascend_patchset.twin import engine as twin_engine

FULL_TIER = "imports vLLM's config and scheduler when it is imported"  # tiers.py: what it needs
BALANCE_MODULE = "vllm_ascend.patch.platform.patch_balance_schedule"
EOS_TOKEN_ID = twin_engine.EOS_TOKEN_ID
MAX_POSITION_EMBEDDINGS = 32768


def import_vllm() -> None:
    """Import vLLM's config and scheduler with the NPU stubs out of the way (``npu_stubs.import_vllm``)."""
    import_vllm_setting_aside(set_aside=npu_stubs.STUBBED)


def load_balance_module(tree: Path | None = None):
    """``patch_balance_schedule`` from ``tree`` (a folder holding ``vllm_ascend/``)."""
    if BALANCE_MODULE in sys.modules and tree is None:
        return sys.modules[BALANCE_MODULE]
    import_vllm()
    if tree is None:
        import vllm_ascend

        tree = Path(vllm_ascend.__file__).resolve().parents[1]
    return load_module_from_tree(Path(tree), BALANCE_MODULE, reuse=False)


def profiling_chunk_scheduler_class() -> type:
    """Our ProfilingChunkScheduler, importable once upstream's BalanceScheduler module is loaded."""
    load_balance_module()
    from vllm_ascend.core.scheduler_profiling_chunk import ProfilingChunkScheduler

    return ProfilingChunkScheduler


def make_vllm_config(
    model_dir: Path,
    *,
    max_num_batched_tokens: int = 256,
    max_num_seqs: int = 16,
    max_model_len: int = 8192,
    block_size: int = 16,
    pipeline_parallel_size: int = 1,
    **config_kwargs: Any,
):
    """The twin's ``make_vllm_config`` with these tests' defaults (vLLM picks async scheduling)."""
    import_vllm()
    config_kwargs.setdefault("max_position_embeddings", MAX_POSITION_EMBEDDINGS)
    config_kwargs.setdefault("async_scheduling", None)
    return twin_engine.make_vllm_config(
        model_dir=Path(model_dir),
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_stages=pipeline_parallel_size,
        **config_kwargs,
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

    if vllm_config is None:
        vllm_config = make_vllm_config(model_dir, **config_kwargs)
    if scheduler_cls is None:
        scheduler_cls = load_balance_module().BalanceScheduler
    return twin_engine.make_scheduler(scheduler_cls, vllm_config, num_blocks, kv_dtype=torch.float32)


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
