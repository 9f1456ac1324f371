"""The vLLM side of the twin: a real scheduler on a CPU config, driven through ``pipeline``.

Runs inside a policy's subprocess, after ``policies`` has put the right vllm_ascend tree
first on ``sys.path`` and installed the NPU stubs. Nothing here is imported by the
parent process, so the parent never imports vLLM.

- ``make_vllm_config`` / ``make_scheduler``: a CPU ``VllmConfig`` for a tiny local model
  (no hub access) and a scheduler of the class asked for over one full-attention KV group
  (``kv_blocks_for`` sizes it for a workload). The CPP engine tests build theirs here too
  (tests/cpp_engine/helpers.py), with their own defaults.
- ``SurfaceExecutor``: the model executor as the scheduler sees it at start-up; answers
  ``collective_rpc("profile_prefill_latency", args=(chunk_tokens[, history_tokens]))``
  from the surface: each worker returns its own stage's compute time (one list entry
  per worker; the named rank's alone with ``unique_reply_rank``).
- ``VllmDriver``: the ``pipeline.Driver`` over a scheduler: admits requests at their
  arrival, turns each ``SchedulerOutput`` into chunks, and builds the
  ``ModelRunnerOutput`` when the batch leaves the last stage: one sampled token per
  request whose chunk reached its last known token, and ``execution_time_ms`` as the
  policy's model runner reports it (``timed(output, stage_ms)``: the time, or None for an
  untimed step).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .pipeline import BatchRecord, Chunk, RequestLog
from .surface import StageTimer
from .workloads import Workload, prompt_token_ids

SAMPLED_TOKEN_ID = 7
BLOCK_TOKENS = 128
TINY_MODEL_MAX_POSITIONS = 1 << 21
MAX_NUM_SEQS = 64  # vLLM requires max_num_batched_tokens >= max_num_seqs
MODEL_LEN_SLACK_TOKENS = 256  # max_model_len = the longest request plus this
EOS_TOKEN_ID = 0

TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": TINY_MODEL_MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
    "eos_token_id": EOS_TOKEN_ID,
}


def write_tiny_model(
    model_dir: Path, *, max_position_embeddings: int = TINY_MODEL_MAX_POSITIONS, eos_token_id: int = EOS_TOKEN_ID
) -> Path:
    """``model_dir/config.json`` of ``TINY_MODEL`` (config only: no weights, no hub access)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_MODEL, max_position_embeddings=max_position_embeddings, eos_token_id=eos_token_id)
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


_MODEL_DIRS: dict[tuple[int, int], Path] = {}


def tiny_model_dir(
    *, max_position_embeddings: int = TINY_MODEL_MAX_POSITIONS, eos_token_id: int = EOS_TOKEN_ID
) -> Path:
    """A temporary tiny model, written once per process and shape."""
    key = (max_position_embeddings, eos_token_id)
    if key not in _MODEL_DIRS:
        _MODEL_DIRS[key] = write_tiny_model(
            Path(tempfile.mkdtemp(prefix="cpp-twin-model-")),
            max_position_embeddings=max_position_embeddings,
            eos_token_id=eos_token_id,
        )
    return _MODEL_DIRS[key]


def make_vllm_config(
    *,
    max_num_batched_tokens: int,
    max_model_len: int,
    num_stages: int = 1,
    model_dir: Path | None = None,
    max_position_embeddings: int = TINY_MODEL_MAX_POSITIONS,
    eos_token_id: int = EOS_TOKEN_ID,
    max_num_seqs: int = MAX_NUM_SEQS,
    block_size: int = BLOCK_TOKENS,
    enable_prefix_caching: bool = True,
    long_prefill_token_threshold: int = 0,
    policy: str = "fcfs",
    async_scheduling: bool | None = False,
    additional_config: dict | None = None,
):
    """A CPU ``VllmConfig`` for the tiny model, chunked prefill on, ``num_stages`` PP stages.

    ``model_dir``: where the model's config.json is written (default: a temporary
    directory per process). ``async_scheduling=None`` leaves the choice to vLLM.
    """
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    shape = {"max_position_embeddings": max_position_embeddings, "eos_token_id": eos_token_id}
    model_dir = tiny_model_dir(**shape) if model_dir is None else write_tiny_model(model_dir, **shape)
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
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    return VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        parallel_config=ParallelConfig(pipeline_parallel_size=num_stages),
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional_config or {},
    )


def kv_blocks_for(workload: Workload) -> int:
    """Blocks for every request of the workload at once, plus slack: no preemption by size."""
    return sum(-(-(r.prompt_tokens + r.max_output_tokens) // BLOCK_TOKENS) + 1 for r in workload.requests) + 64


def make_scheduler(scheduler_cls: type, vllm_config: Any, num_blocks: int, *, kv_dtype: Any = None):
    """A ``scheduler_cls`` over ``num_blocks`` blocks of one full-attention KV group.

    The block size is the config's; ``kv_dtype`` (default float16) is the KV spec's dtype.
    """
    import torch
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = vllm_config.cache_config.block_size
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16 if kv_dtype is None else kv_dtype
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    register_all_kvcache_specs(vllm_config)
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=False,
    )


class SurfaceExecutor:
    """The executor's RPC surface as the scheduler uses it at start-up (multiproc signature)."""

    def __init__(self, vllm_config: Any, timer: StageTimer) -> None:
        self.vllm_config = vllm_config
        self.timer = timer
        self.profile_calls: list[tuple[int, int, float]] = []

    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        kv_output_aggregator: Any = None,
    ) -> Any:
        if method != "profile_prefill_latency":
            raise NotImplementedError(f"the twin's executor answers profile_prefill_latency only, not {method!r}")
        kwargs = kwargs or {}
        chunk_tokens = int(args[0] if args else kwargs.get("num_tokens", kwargs.get("chunk_tokens")))
        history_tokens = int(args[1] if len(args) > 1 else kwargs.get("history_tokens", 0) or 0)
        stage_ms = self.timer.profile_stage_ms(chunk_tokens, history_tokens, len(self.profile_calls))
        self.profile_calls.append((chunk_tokens, history_tokens, stage_ms[-1]))
        parallel = self.vllm_config.parallel_config
        per_worker = [stage_ms[rank // parallel.tensor_parallel_size] for rank in range(parallel.world_size)]
        if unique_reply_rank is not None:
            return per_worker[unique_reply_rank]
        return per_worker


class VllmDriver:
    """``pipeline.Driver`` over a real scheduler object."""

    def __init__(
        self,
        scheduler: Any,
        workload: Workload,
        timed: Callable[[Any, tuple[float, ...]], float | None] | None = None,
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        self.scheduler = scheduler
        self.timed = timed
        hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(BLOCK_TOKENS, hash_fn)
        self._pending: list[tuple[float, Any]] = []
        self.logs: dict[str, RequestLog] = {}
        self.requests: dict[str, Any] = {}
        for spec in sorted(workload.requests, key=lambda r: (r.arrival_ms, r.req_id)):
            params = SamplingParams(max_tokens=spec.max_output_tokens, ignore_eos=True)
            request = Request(
                request_id=spec.req_id,
                prompt_token_ids=prompt_token_ids(spec, workload.seed),
                sampling_params=params,
                pooling_params=None,
                arrival_time=spec.arrival_ms / 1000.0,
                block_hasher=hasher,
            )
            self._pending.append((spec.arrival_ms, request))
            self.requests[spec.req_id] = request
            self.logs[spec.req_id] = RequestLog(
                spec.req_id, spec.arrival_ms, spec.prompt_tokens, spec.max_output_tokens
            )
        self._pending.reverse()  # pop() from the end = earliest arrival
        self._first_scheduled: set[str] = set()
        self.now_ms = 0.0
        if hasattr(scheduler, "cpp_clock"):  # ours: how long a request has waited, on the simulated clock
            scheduler.cpp_clock = lambda: self.now_ms / 1000.0

    # -- pipeline.Driver
    def admit(self, now_ms: float) -> None:
        self.now_ms = now_ms
        while self._pending and self._pending[-1][0] <= now_ms:
            self.scheduler.add_request(self._pending.pop()[1])

    def next_arrival_ms(self) -> float | None:
        return self._pending[-1][0] if self._pending else None

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def schedule(self) -> tuple[tuple[Chunk, ...], Any]:
        output = self.scheduler.schedule()
        history = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        history.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
        chunks = []
        for req_id, chunk_tokens in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            history_tokens = history[req_id]
            log = self.logs[req_id]
            if req_id not in self._first_scheduled:
                self._first_scheduled.add(req_id)
                log.cached_tokens = history_tokens
            log.scheduled_tokens += chunk_tokens
            chunks.append(
                Chunk(
                    req_id,
                    chunk_tokens,
                    history_tokens,
                    is_prefill=history_tokens < request.num_prompt_tokens,
                    samples=history_tokens + chunk_tokens >= request.num_tokens,
                )
            )
        return tuple(chunks), output

    def apply(self, handle: Any, record: BatchRecord) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids = [c.req_id for c in record.chunks]
        output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[SAMPLED_TOKEN_ID] if c.samples else [] for c in record.chunks],
        )
        measured_ms = self.timed(handle, record.stage_ms) if self.timed is not None and record.stage_end_ms else None
        if measured_ms is not None:
            output.execution_time_ms = measured_ms
        self.scheduler.update_from_output(handle, output)
        for chunk in record.chunks:
            # Count the tokens the scheduler kept (a token sampled after the request
            # finished, possible under asynchronous scheduling, is dropped by vLLM).
            log, request = self.logs[chunk.req_id], self.requests[chunk.req_id]
            kept = len(request.output_token_ids) - len(log.token_ms)
            log.token_ms.extend([record.applied_ms] * max(kept, 0))
            if request.is_finished() and log.finish_ms is None:
                log.finish_ms = record.applied_ms
