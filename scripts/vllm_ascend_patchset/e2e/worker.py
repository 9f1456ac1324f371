"""The CPP worker side on vLLM's CPU engine: ``--worker-extension-cls vllm_ascend_patchset.e2e.worker.CppCpuWorker``.

It runs the product's worker logic, ``vllm_ascend/worker/cpp_timing.py`` from the
assembled tree, with the CPU model runner in place of the NPU one:

- ``profile_prefill_latency(chunk_tokens, history_tokens)`` answers the start-up
  profiling RPC: ``cpp_timing.profile_prefill_latency`` around vLLM's own dummy run made
  to be one prefill chunk (one request of C tokens whose sequence holds H + C tokens);
- step timing: importing this module (vLLM does, in every worker, to resolve the
  extension) hooks ``CPUModelRunner.execute_model`` and ``sample_tokens`` at the points
  where patch 0202 hooks the NPU model runner: ``start_step_timing`` when a step starts,
  ``finish_stage_timing`` when a stage before the last returns its intermediate tensors,
  ``finish_step_timing`` when the last rank's sampled output is built. The CPU runner
  synchronises nothing (``_sync_device`` is a no-op: CPU compute is synchronous).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.logger import logger  # the "vllm" logger: vLLM configures it in every process
from vllm.sequence import IntermediateTensors
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from ..paths import assembled_root
from ..trees import load_module_from_tree

TIMING_MODULE = "vllm_ascend.worker.cpp_timing"
# The product's module, from the assembled tree whichever vllm_ascend is first on the path
# (upstream's CPP runs with the pristine tree, which has no cpp_timing).
cpp_timing = load_module_from_tree(assembled_root(), TIMING_MODULE)


def cpu_profile_dummy_run(runner: Any, num_tokens: int) -> None:
    """vLLM's dummy run as one prefill chunk: the batch prepared as the NPU path does, one request.

    vLLM's dummy run spreads its tokens over ``max_num_seqs`` requests; with the limit at
    1 for this call it is one request of ``num_tokens``, whose sequence length (history +
    chunk) goes to the attention metadata as ``profile_seq_lens``.
    """
    seq_len = cpp_timing.prepare_profile_batch(runner, num_tokens)
    scheduler_config = runner.scheduler_config
    max_num_seqs = scheduler_config.max_num_seqs
    scheduler_config.max_num_seqs = 1
    try:
        runner._dummy_run(num_tokens, force_attention=True, profile_seq_lens=seq_len)
    finally:
        scheduler_config.max_num_seqs = max_num_seqs


class CppCpuWorker:
    """Worker extension: the start-up profiling RPC of CPP on the CPU worker."""

    def profile_prefill_latency(self, num_tokens: int, history_tokens: int = 0) -> float:
        """Milliseconds of one prefill chunk of num_tokens after history_tokens on this worker's stage."""
        import torch

        with torch.inference_mode():
            latency_ms = cpp_timing.profile_prefill_latency(
                self, num_tokens, history_tokens, dummy_run=cpu_profile_dummy_run
            )
        logger.info(
            "[CPP e2e] start-up profiling run: %d tokens after %d, %.1f ms (rank %d)",
            num_tokens,
            history_tokens,
            latency_ms,
            self.rank,
        )
        return latency_ms


def _hook_execute_model(execute_model):
    @functools.wraps(execute_model)
    def wrapper(self, scheduler_output, intermediate_tensors=None):
        cpp_timing.start_step_timing(self, scheduler_output, intermediate_tensors)
        output = execute_model(self, scheduler_output, intermediate_tensors)
        if isinstance(output, IntermediateTensors):
            cpp_timing.finish_stage_timing(self, output)
        return output

    wrapper._cpp_hooked = True
    return wrapper


def _hook_sample_tokens(sample_tokens):
    @functools.wraps(sample_tokens)
    def wrapper(self, *args, **kwargs):
        output = sample_tokens(self, *args, **kwargs)
        if isinstance(output, AsyncModelRunnerOutput):  # asynchronous scheduling: the output is built later
            slowest_ms = cpp_timing.stop_step_timing(self)
            if slowest_ms is not None:
                get_output = output.get_output

                def timed_get_output():
                    result = get_output()
                    result.execution_time_ms = slowest_ms
                    return result

                output.get_output = timed_get_output
        elif output is not None:
            cpp_timing.finish_step_timing(self, output)
        return output

    wrapper._cpp_hooked = True
    return wrapper


def install_step_timing(runner_cls: type = CPUModelRunner) -> bool:
    """Hook ``runner_cls``'s step methods once; False if they already are."""
    if getattr(runner_cls.execute_model, "_cpp_hooked", False):
        return False
    runner_cls.execute_model = _hook_execute_model(runner_cls.execute_model)
    runner_cls.sample_tokens = _hook_sample_tokens(runner_cls.sample_tokens)
    return True


install_step_timing()
