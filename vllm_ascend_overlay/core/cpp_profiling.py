"""Start-up profile for dynamic chunked pipeline parallelism: cached, or measured once.

At engine start the scheduler needs a latency model (core/profiling_chunk_predictor.py).
``initialise_profile`` gets one:

1. A cached profile whose fingerprint (model, dtype, quantisation, TP/PP, token budget,
   block size, versions, device) matches is adopted as is: no profiling pass at all.
2. Otherwise the workers run real forward passes: ``warmup_runs`` runs first (dropped),
   then ``profile_points`` chunk sizes from the base chunk down towards 0, each
   ``profile_repeats`` times (the fit keeps the median), then ``profile_history_points``
   chunks whose sequences carry H cached tokens, H spread up to what the context and
   the KV cache allow, so the C*H term is measured rather than extrapolated.
3. Each sample is the slowest worker's time. Under pipeline parallelism every stage
   runs its own part of the model on dummy inputs and times only its own compute;
   the slowest stage sets the pipeline's pace, so that is the time a chunk costs the
   pipeline. (The seed design used PP rank 0 and upstream the last rank; either one
   under-estimates when the layers are not split evenly or the last stage also runs
   the LM head.)
4. The fit is saved to the cache for the next start.

Any exception (a worker failing, a timeout, a fit the model rejects) ends in one
warning naming the cause and fixed chunking at the base chunk size for the rest of the
run; serving goes on.

Executor interface (also what the pipeline twin simulator implements):
``model_executor.collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns one latency in ms per worker (a list), or a single number.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from vllm.logger import init_logger

    logger = init_logger(__name__)
except ImportError:  # pragma: no cover - only without vLLM
    logger = logging.getLogger(__name__)

PROFILE_RPC = "profile_prefill_latency"
WARMUP_RUNS = 2
PROFILE_RPC_TIMEOUT_S = 300.0

MeasureFn = Callable[[int, int], float]


def profile_plan(
    *,
    base_chunk_size: int,
    points: int,
    repeats: int,
    history_points: int,
    max_history_tokens: int,
    align: int = 1,
) -> list[tuple[int, int]]:
    """(chunk_tokens, history_tokens) runs after the warm-up, in measurement order.

    Sizes go from the base chunk down towards 0 in ``points`` even steps (the seed's
    sampling); each is run ``repeats`` times in a row. History runs take H spread evenly
    up to ``max_history_tokens`` (rounded down to ``align``), each with two chunk sizes
    (a half and an eighth of the base chunk): with one size the history's own cost (c2*H)
    and the chunk's attention over it (c4*C*H) could not be told apart.
    """
    sizes = []
    for index in range(points):
        size = int(base_chunk_size - index * base_chunk_size / points)
        if size >= 1 and size not in sizes:
            sizes.append(size)
    plan = [(size, 0) for size in sizes for _ in range(repeats)]
    history_chunks = sorted({max(1, base_chunk_size // 2), max(1, base_chunk_size // 8)}, reverse=True)
    if history_points > 0 and max_history_tokens >= align:
        histories = []
        for index in range(1, history_points + 1):
            history = int(max_history_tokens * index / history_points) // align * align
            if history > 0 and history not in histories:
                histories.append(history)
        plan += [(chunk, history) for history in histories for chunk in history_chunks for _ in range(repeats)]
    return plan


def measure_with_executor(model_executor: Any, timeout_s: float = PROFILE_RPC_TIMEOUT_S) -> MeasureFn:
    """A ``measure(chunk_tokens, history_tokens) -> ms`` that asks every worker and keeps the slowest."""
    kwargs: dict = {}
    try:
        if "timeout" in inspect.signature(model_executor.collective_rpc).parameters:
            kwargs["timeout"] = timeout_s
    except (TypeError, ValueError):
        pass

    def measure(chunk_tokens: int, history_tokens: int) -> float:
        result = model_executor.collective_rpc(PROFILE_RPC, args=(int(chunk_tokens), int(history_tokens)), **kwargs)
        values = result if isinstance(result, list | tuple) else [result]
        latencies = [float(v) for v in values if v is not None]
        if not latencies:
            raise RuntimeError(f"{PROFILE_RPC} returned no latency ({result!r})")
        return max(latencies)

    return measure


def fingerprint_for(vllm_config: Any) -> dict:
    """What a cached profile must match: model, precision, parallelism, budget, versions, device."""
    from vllm_ascend.core.profiling_chunk_predictor import make_fingerprint

    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:  # pragma: no cover - vLLM is always there in the engine
        vllm_version = "unknown"
    try:
        from vllm_ascend import patchset

        ascend_version = patchset.PATCHSET_VERSION
    except Exception:
        ascend_version = "unknown"
    device_name, cann_version = _device_identity()
    return make_fingerprint(
        model=str(model_config.model),
        dtype=str(model_config.dtype),
        quantization=getattr(model_config, "quantization", None),
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        block_size=vllm_config.cache_config.block_size,
        vllm_version=vllm_version,
        vllm_ascend_version=ascend_version,
        device_name=device_name,
        cann_version=cann_version,
    )


def _device_identity() -> tuple[str, str | None]:
    """Device kind and CANN install, read without touching the NPU from the engine-core process.

    The SoC comes from the wheel's build info; the CANN version from the real path of the
    toolkit folder (``.../ascend-toolkit/8.x.y`` behind a ``latest`` link).
    """
    device_name = "unknown"
    try:
        from vllm_ascend import _build_info  # type: ignore[attr-defined]
        from vllm_ascend.utils import get_ascend_device_type

        soc = getattr(_build_info, "__soc_version__", None)
        device_name = f"{get_ascend_device_type().name}/{soc}" if soc else get_ascend_device_type().name
    except Exception:
        pass
    toolkit = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    return device_name, os.path.realpath(toolkit) if toolkit else None


def cache_file(cache_dir: str, fingerprint: dict) -> Path:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"cpp-profile-{digest}.json"


def collect_samples(measure: MeasureFn, plan: Sequence[tuple[int, int]], warmup: tuple[int, int]) -> list:
    """Warm-up runs (dropped), then every planned run as (chunk_tokens, history_tokens, latency_ms)."""
    for _ in range(WARMUP_RUNS):
        measure(*warmup)
    return [(chunk, history, measure(chunk, history)) for chunk, history in plan]


def initialise_profile(
    manager: Any,
    config: Any,
    *,
    measure: MeasureFn | None,
    max_history_tokens: int,
    align: int,
) -> str | None:
    """Give ``manager`` an accepted latency model; returns where it came from, or None (fixed chunking).

    ``config`` is the CppConfig; ``manager`` a ProfilingChunkManager constructed with
    ``warmup_samples=0`` (the warm-up runs are dropped here).
    """
    path = cache_file(config.cache_path, manager.fingerprint) if config.cache_path else None
    if path is not None and manager.load_cached(path):
        return f"cache {path}"
    if measure is None:
        logger.warning("[CPP] no model executor to profile with; fixed chunking at %d tokens", manager.base_chunk_size)
        return None
    plan = profile_plan(
        base_chunk_size=manager.base_chunk_size,
        points=config.profile_points,
        repeats=config.profile_repeats,
        history_points=config.profile_history_points,
        max_history_tokens=max_history_tokens,
        align=align,
    )
    try:
        samples = collect_samples(measure, plan, warmup=(manager.base_chunk_size, 0))
    except Exception as error:  # a worker failed or timed out: degrade, never take the server down
        logger.warning(
            "[CPP] start-up profiling failed (%s: %s); fixed chunking at %d tokens for this run",
            type(error).__name__,
            error,
            manager.base_chunk_size,
        )
        return None
    if not manager.fit_profile(samples):
        return None  # fit_profile warned once, naming the rule that rejected the fit
    source = f"profiled ({len(plan)} runs after {WARMUP_RUNS} warm-up)"
    if path is not None:
        try:
            manager.save(path)
            source += f", saved to {path}"
        except OSError as error:
            logger.warning("[CPP] could not save the profile to %s: %s", path, error)
    return source


def wrap_engine_core_init(engine_core_cls: type) -> bool:
    """Make ``engine_core_cls.__init__`` start CPP once the workers are up; False if already done.

    After the original ``__init__`` the model executor is ready; a scheduler that has
    ``run_profiling_chunk_init`` (ProfilingChunkScheduler) then gets its profile.
    """
    original_init = engine_core_cls.__init__
    if getattr(original_init, "_cpp_wrapped", False):
        return False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        start = getattr(self.scheduler, "run_profiling_chunk_init", None)
        if start is not None:
            start(self.model_executor)

    __init__._cpp_wrapped = True  # type: ignore[attr-defined]
    engine_core_cls.__init__ = __init__
    return True
