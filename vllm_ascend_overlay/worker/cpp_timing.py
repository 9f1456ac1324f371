"""Worker side of dynamic chunked pipeline parallelism: profile runs and sampled step timing.

The logic here is backend-neutral: it reaches the device only through the model
runner's ``_sync_device()`` and the dummy run it is given, so the NPU model runner
(worker/model_runner_v1.py) and a CPU engine (vLLM's ``CPUModelRunner``, driven through a worker
extension) run the same code.

Profile runs (``profile_prefill_latency``): the model runner's dummy run, made to look
like a real prefill chunk of C tokens after H tokens of history (``prepare_profile_batch``):

- token ids are varied (a fixed pseudo-random sequence), not all zeros, so routing in
  MoE layers and data-dependent kernels behave as on real text;
- with H > 0 the dummy request's sequence length is H + C, its positions run from H,
  its block table covers H + C tokens and its computed-token count is H, so attention
  reads H cached tokens (their values are whatever the cache holds; the time is what
  matters). Nothing is written to the KV cache (slot mapping -1, as the dummy run does).

On the NPU the attention state is also set to a prefill (``PrefillNoCache``, or
``ChunkedPrefill`` with history), not ``DecodeOnly`` (``prepare_profile_run``).
Each worker times its own part of the model: under pipeline parallelism a stage's dummy
run uses dummy intermediate tensors and does not wait for other stages. The scheduler
keeps the slowest worker's time (core/cpp_profiling.py).

Step timing: only a step the scheduler marked (``scheduler_output.cpp_time_step``) is
timed, and what it reports is the same quantity the profile holds: the slowest PP
stage's own compute for that step. Every stage starts its clock once its input (the
previous stage's tensors) is there and the device is idle, and stops it when its output
is ready. A stage that is not the last one sends ``max(what it received, its own time)``
on to the next stage with its intermediate tensors (one 1-element CPU tensor under
``SLOWEST_STAGE_KEY``, taken out again before the model sees its input); the last rank
reports ``max(what it received, its own time)`` as ``ModelRunnerOutput.execution_time_ms``.
No stage waits for a later one (no collective, no blocking all-reduce), and unmarked
steps add no device synchronisation and nothing to the tensors sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PROFILE_TOKEN_SEED = 1234
SLOWEST_STAGE_KEY = "cpp_slowest_stage_ms"  # rides with a timed step's intermediate tensors


def start_step_timing(runner: Any, scheduler_output: Any, intermediate_tensors: Any = None) -> None:
    """At the start of execute_model, on every PP rank: start the clock if the scheduler marked this step.

    Waits for this stage's input first (time this stage's compute, not the wait for the
    previous stage) and takes the earlier stages' slowest time out of it.
    """
    runner._cpp_step_start = None
    runner._cpp_earlier_stages_ms = 0.0
    if not getattr(scheduler_output, "cpp_time_step", False):
        return
    if intermediate_tensors is not None:
        wait_for_input = getattr(intermediate_tensors, "wait_for_comm", None)
        if wait_for_input is not None:
            wait_for_input()
        carried = intermediate_tensors.tensors.pop(SLOWEST_STAGE_KEY, None)
        if carried is not None:
            runner._cpp_earlier_stages_ms = float(carried.reshape(-1)[0])
    runner._sync_device()
    runner._cpp_step_start = time.perf_counter()


def stop_step_timing(runner: Any) -> float | None:
    """Stop the clock: max(earlier stages, this stage's own time) in ms, or None if this step is not timed."""
    start = getattr(runner, "_cpp_step_start", None)
    if start is None:
        return None
    runner._sync_device()
    runner._cpp_step_start = None
    own_ms = (time.perf_counter() - start) * 1000.0
    return max(own_ms, float(getattr(runner, "_cpp_earlier_stages_ms", 0.0)))


def finish_stage_timing(runner: Any, intermediate_tensors: Any) -> None:
    """On a PP rank before the last, when its output tensors are ready: carry the slowest time on."""
    slowest_ms = stop_step_timing(runner)
    if slowest_ms is None:
        return
    import torch

    # A CPU tensor goes over the PP group's CPU (gloo) channel: no device traffic.
    intermediate_tensors.tensors[SLOWEST_STAGE_KEY] = torch.tensor([slowest_ms], dtype=torch.float64)


def finish_step_timing(runner: Any, model_runner_output: Any) -> None:
    """On the last rank, when the sampled output is built: the slowest stage's time in ms."""
    slowest_ms = stop_step_timing(runner)
    if slowest_ms is not None:
        model_runner_output.execution_time_ms = slowest_ms


def _profile_token_ids(num_tokens: int, vocab_size: int, device: Any):
    import torch

    generator = torch.Generator().manual_seed(PROFILE_TOKEN_SEED + num_tokens)
    return torch.randint(1, max(2, vocab_size), (num_tokens,), generator=generator, dtype=torch.int32).to(device)


def prepare_profile_run(runner: Any, num_tokens: int) -> int:
    """NPU, inside the dummy run, before its attention metadata is built: returns the sequence length."""
    states = _attention_states()
    history_tokens = int(getattr(runner, "_cpp_profile_history_tokens", 0))
    runner.attn_state = states.ChunkedPrefill if history_tokens else states.PrefillNoCache
    return prepare_profile_batch(runner, num_tokens)


def prepare_profile_batch(runner: Any, num_tokens: int) -> int:
    """Row 0 of the input batch as one prefill chunk of ``num_tokens`` after the profiled history.

    Sets the token ids, positions, computed/prompt token counts and block table rows;
    returns the sequence length (history + chunk) for the attention metadata.
    """
    history_tokens = int(getattr(runner, "_cpp_profile_history_tokens", 0))
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
        num_blocks = -(-seq_len // _row_block_tokens(table))
        table.add_row(list(range(1, num_blocks + 1)), 0)  # block 0 is the null block
    return seq_len


def _row_block_tokens(table: Any) -> int:
    """Tokens per block id that ``add_row`` takes: the NPU table's physical blocks, vLLM's KV-manager blocks."""
    physical = getattr(table, "physical_block_size", None)
    if physical:
        return int(physical)
    return int(table.block_size) * int(getattr(table, "blocks_per_kv_block", 1))


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


def npu_profile_dummy_run(runner: Any, num_tokens: int) -> None:
    """The NPU runner's dummy run as one prefill chunk (it calls ``prepare_profile_run`` itself)."""
    runner._dummy_run(num_tokens=num_tokens, force_attention=True, profile_cpp=True)


def profile_prefill_latency(
    worker: Any,
    num_tokens: int,
    history_tokens: int = 0,
    *,
    dummy_run: Callable[[Any, int], None] = npu_profile_dummy_run,
) -> float:
    """Time one dummy prefill chunk of ``num_tokens`` after ``history_tokens`` on this worker, in ms.

    ``dummy_run(runner, num_tokens)`` runs the model once on the prepared batch; the
    default is the NPU runner's.
    """
    runner = worker.model_runner
    num_tokens = max(1, min(int(num_tokens), worker.scheduler_config.max_num_batched_tokens))
    history_tokens = max(0, min(int(history_tokens), worker.model_config.max_model_len - num_tokens))
    runner._cpp_profile_history_tokens = history_tokens
    try:
        runner._sync_device()
        start = time.perf_counter()
        dummy_run(runner, num_tokens)
        runner._sync_device()
        return (time.perf_counter() - start) * 1000.0
    finally:
        runner._cpp_profile_history_tokens = 0
        finish_profile_run(runner)
