"""Start-up profile for dynamic chunked pipeline parallelism: cached, or measured once.

``initialise_profile`` gives the scheduler a latency model (core/cpp_latency_model.py):

1. A cached profile whose fingerprint matches (core/cpp_profile_store.py) is adopted
   when its samples pass the same acceptance as a fresh profile: no profiling run.
2. Otherwise the workers run real forward passes: ``WARMUP_RUNS`` runs first (dropped),
   then ``profile_points`` chunk sizes from the base chunk down towards 0 and
   ``profile_history_points`` history values, each with two chunk sizes, whose sequences
   carry H cached tokens, H spread up to what the context and the KV cache allow, so the
   C*H term is measured rather than extrapolated; ``profile_repeats`` passes over all of
   them (the fit keeps each point's median).
   If the fit is refused for scatter (core/cpp_latency_model.py ``NoisyFit``: fit error
   too large, or unstable when a fold of the points is left out), the same runs are
   measured once more and the fit takes the median of both rounds per point: a noisy
   host pays a longer start-up, a quiet one nothing.
3. Each sample is the slowest worker's time. Under pipeline parallelism every stage
   runs its own layers on dummy inputs and times only its own compute; the slowest
   stage sets the pipeline's pace, so that is what a chunk costs the pipeline. Timed
   steps report the same quantity (worker/cpp_timing.py).
4. The accepted fit is saved for the next start.

Any exception (a worker failing, a timeout, a fit that is not accepted) ends in one
warning naming the cause and fixed chunking at the base chunk size for the rest of the
run; serving goes on.

Executor interface (also what the pipeline twin simulator implements):
``model_executor.collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns one latency in ms per worker (a list), or a single number.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from vllm.logger import init_logger
from vllm_ascend.core.cpp_latency_model import FitError, LatencyModel, NoisyFit, accept
from vllm_ascend.core.cpp_profile_store import ProfileCacheError, cache_file, load_profile, save_profile

logger = init_logger(__name__)

PROFILE_RPC = "profile_prefill_latency"
WARMUP_RUNS = 2
PROFILE_RPC_TIMEOUT_S = 300.0
UNSTABLE_RETRIES = 1  # rounds of the same runs added when the fit is too noisy

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

    Sizes go from the base chunk down towards 0 in ``points`` even steps (as upstream
    samples them). History runs take H spread evenly up to ``max_history_tokens``
    (rounded down to ``align``), each with two chunk sizes (a half and an eighth of the
    base chunk): with one size the history's own cost (c2*H) and the chunk's attention
    over it (c4*C*H) could not be told apart. The plan is ``repeats`` passes over all of
    these points, not each point ``repeats`` times in a row: a host whose speed drifts
    (load, clocks) then spreads the drift over every point, where the median and the fit
    absorb it, instead of shifting the few points measured during a slow spell.
    """
    sizes = []
    for index in range(points):
        size = int(base_chunk_size - index * base_chunk_size / points)
        if size >= 1 and size not in sizes:
            sizes.append(size)
    one_pass = [(size, 0) for size in sizes]
    history_chunks = sorted({max(1, base_chunk_size // 2), max(1, base_chunk_size // 8)}, reverse=True)
    if history_points > 0 and max_history_tokens >= align:
        histories = []
        for index in range(1, history_points + 1):
            history = int(max_history_tokens * index / history_points) // align * align
            if history > 0 and history not in histories:
                histories.append(history)
        one_pass += [(chunk, history) for history in histories for chunk in history_chunks]
    return one_pass * repeats


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


def collect_samples(measure: MeasureFn, plan: Sequence[tuple[int, int]], warmup: tuple[int, int] | None) -> list:
    """Warm-up runs (dropped; none if ``warmup`` is None), then every planned run as (chunk, history, ms)."""
    for _ in range(WARMUP_RUNS if warmup is not None else 0):
        measure(*warmup)
    return [(chunk, history, measure(chunk, history)) for chunk, history in plan]


def initialise_profile(
    config: Any,
    *,
    fingerprint: dict,
    base_chunk_tokens: int,
    measure: MeasureFn | None,
    max_history_tokens: int,
    max_chunk_tokens: int,
) -> tuple[LatencyModel | None, list, str | None]:
    """An accepted latency model, its samples and where it came from; (None, [], None) keeps fixed chunking.

    ``config`` is the CppConfig. A cached profile is adopted only if its samples pass
    ``accept`` here and now, over the history range this engine will use.
    """
    path = cache_file(config.cache_path, fingerprint) if config.cache_path else None
    domain = {"max_chunk_tokens": max_chunk_tokens, "max_history_tokens": max_history_tokens}
    if path is not None:
        try:
            cached = load_profile(path, fingerprint=fingerprint, base_chunk_tokens=base_chunk_tokens)
            if cached is not None:
                return accept(cached, **domain), cached, f"cache {path}"
        except (ProfileCacheError, FitError) as error:
            logger.warning("[CPP] ignoring cached profile %s (%s); profiling again", path, error)
    if measure is None:
        logger.warning("[CPP] no model executor to profile with; fixed chunking at %d tokens", base_chunk_tokens)
        return None, [], None
    plan = profile_plan(
        base_chunk_size=base_chunk_tokens,
        points=config.profile_points,
        repeats=config.profile_repeats,
        history_points=config.profile_history_points,
        max_history_tokens=max_history_tokens,
    )
    samples: list = []
    for attempt in range(1 + UNSTABLE_RETRIES):
        try:
            samples += collect_samples(measure, plan, warmup=(base_chunk_tokens, 0) if attempt == 0 else None)
        except Exception as error:  # a worker failed or timed out: degrade, never take the server down
            logger.warning(
                "[CPP] start-up profiling failed (%s: %s); fixed chunking at %d tokens for this run",
                type(error).__name__,
                error,
                base_chunk_tokens,
            )
            return None, [], None
        try:
            model = accept(samples, **domain)
            break
        except FitError as error:
            if isinstance(error, NoisyFit) and attempt < UNSTABLE_RETRIES:
                logger.info(
                    "[CPP] start-up profile too noisy (%s); measuring the same %d runs once more", error, len(plan)
                )
                continue
            logger.warning(
                "[CPP] start-up profile rejected (%s); fixed chunking at %d tokens", error, base_chunk_tokens
            )
            return None, [], None
    source = f"profiled ({len(samples)} runs after {WARMUP_RUNS} warm-up)"
    if path is not None:
        try:
            save_profile(
                path, fingerprint=fingerprint, base_chunk_tokens=base_chunk_tokens, model=model, samples=samples
            )
            source += f", saved to {path}"
        except OSError as error:
            logger.warning("[CPP] could not save the profile to %s: %s", path, error)
    return model, samples, source


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
