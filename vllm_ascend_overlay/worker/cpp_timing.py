"""Worker side of dynamic chunked pipeline parallelism: profile runs and sampled step timing.

Profile runs (``profile_prefill_latency``): the model runner's dummy run, made to look
like a real prefill chunk of C tokens after H tokens of history:

- the attention state is a prefill (``PrefillNoCache``, or ``ChunkedPrefill`` with
  history), not ``DecodeOnly``;
- token ids are varied (a fixed pseudo-random sequence), not all zeros, so routing in
  MoE layers and data-dependent kernels behave as on real text;
- with H > 0 the dummy request's sequence length is H + C, its positions run from H,
  its block table covers H + C tokens and its computed-token count is H, so attention
  reads H cached tokens (their values are whatever the cache holds; the time is what
  matters). Nothing is written to the KV cache (slot mapping -1, as upstream's dummy
  run does).

Each worker times its own part of the model: under pipeline parallelism a stage's dummy
run uses dummy intermediate tensors and does not wait for other stages. The scheduler
keeps the slowest worker's time (core/cpp_profiling.py).

Step timing: only a step the scheduler marked (``scheduler_output.cpp_time_step``) is
timed. Then the runner waits for this stage's input (the previous stage's tensors),
synchronises the device, and measures until the sampled output is ready; the time goes
back as ``ModelRunnerOutput.execution_time_ms``. Unmarked steps add no device
synchronisation.
"""

from __future__ import annotations

import time
from typing import Any

PROFILE_TOKEN_SEED = 1234


def start_step_timing(runner: Any, scheduler_output: Any, intermediate_tensors: Any = None) -> None:
    """At the start of execute_model: start the clock if the scheduler marked this step."""
    runner._cpp_step_start = None
    if not getattr(scheduler_output, "cpp_time_step", False):
        return
    wait_for_input = getattr(intermediate_tensors, "wait_for_comm", None)
    if wait_for_input is not None:
        wait_for_input()  # time this stage's compute, not the wait for the previous stage
    runner._sync_device()
    runner._cpp_step_start = time.perf_counter()


def finish_step_timing(runner: Any, model_runner_output: Any) -> None:
    """When the sampled output is built: stop the clock and attach the step's time in ms."""
    start = getattr(runner, "_cpp_step_start", None)
    if start is None:
        return
    runner._sync_device()
    model_runner_output.execution_time_ms = (time.perf_counter() - start) * 1000.0
    runner._cpp_step_start = None


def _profile_token_ids(num_tokens: int, vocab_size: int, device: Any):
    import torch

    generator = torch.Generator().manual_seed(PROFILE_TOKEN_SEED + num_tokens)
    return torch.randint(1, max(2, vocab_size), (num_tokens,), generator=generator, dtype=torch.int32).to(device)


def prepare_profile_run(runner: Any, num_tokens: int) -> int:
    """Inside the dummy run, before its attention metadata is built: returns the sequence length."""
    states = _attention_states()
    history_tokens = int(getattr(runner, "_cpp_profile_history_tokens", 0))
    runner.attn_state = states.ChunkedPrefill if history_tokens else states.PrefillNoCache
    seq_len = history_tokens + num_tokens
    runner.input_ids.gpu[:num_tokens].copy_(
        _profile_token_ids(num_tokens, runner.model_config.get_vocab_size(), runner.input_ids.gpu.device)
    )
    positions = runner.positions.gpu if hasattr(runner.positions, "gpu") else runner.positions
    positions[:num_tokens].copy_(
        _arange(history_tokens, seq_len, positions.dtype, positions.device),
    )
    batch = runner.input_batch
    batch.num_computed_tokens_cpu[0] = history_tokens
    batch.num_prompt_tokens[0] = seq_len
    for group_id in range(len(runner.kv_cache_config.kv_cache_groups)):
        table = batch.block_table[group_id]
        num_blocks = -(-seq_len // table.physical_block_size)  # add_row takes physical block ids
        table.add_row(list(range(1, num_blocks + 1)), 0)  # block 0 is the null block
    return seq_len


def _attention_states() -> Any:
    from vllm_ascend.attention.attention_v1 import AscendAttentionState  # NPU-only import

    return AscendAttentionState


def finish_profile_run(runner: Any) -> None:
    """After the dummy run: leave row 0 of the input batch as a fresh start would."""
    batch = runner.input_batch
    batch.num_computed_tokens_cpu[0] = 0
    batch.num_prompt_tokens[0] = 0
    for group_id in range(len(runner.kv_cache_config.kv_cache_groups)):
        batch.block_table[group_id].clear_row(0)


def _arange(start: int, stop: int, dtype: Any, device: Any):
    import torch

    return torch.arange(start, stop, dtype=dtype).to(device)


def profile_prefill_latency(worker: Any, num_tokens: int, history_tokens: int = 0) -> float:
    """Time one dummy prefill chunk of ``num_tokens`` after ``history_tokens`` on this worker, in ms."""
    import torch

    runner = worker.model_runner
    num_tokens = max(1, min(int(num_tokens), worker.scheduler_config.max_num_batched_tokens))
    history_tokens = max(0, min(int(history_tokens), worker.model_config.max_model_len - num_tokens))
    runner._cpp_profile_history_tokens = history_tokens
    try:
        torch.npu.synchronize()
        start = time.perf_counter()
        runner._dummy_run(num_tokens=num_tokens, force_attention=True, profile_cpp=True)
        torch.npu.synchronize()
        return (time.perf_counter() - start) * 1000.0
    finally:
        runner._cpp_profile_history_tokens = 0
        finish_profile_run(runner)
