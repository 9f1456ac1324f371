"""``additional_config["profiling_chunk_config"]``: parse, validate, select the CPP scheduler.

The key and upstream's five settings are kept, so existing configs keep working;
ours are added. Everything is checked at start-up, and a bad value is an error that
names the key and the fix. An unknown key is an error listing the valid ones.

=====================  =========  =====================================================
key                    default    meaning
=====================  =========  =====================================================
enabled                false      dynamic chunked pipeline parallelism on/off
smooth_factor          1.0        (0, 1]: blend of the predicted chunk towards the base
min_chunk              null       floor of a chunk in tokens (null: base chunk / 4);
                                  clamped to max_num_batched_tokens with a warning
max_fit_chunk          30         steps kept for the online refit window (>= 8)
need_timing            = enabled  time sampled batches to refine the model online
cache_dir              ~/.cache/  where fitted profiles are kept ("" = no cache)
                       vllm_ascend/cpp
profile_points         64         chunk sizes profiled, base chunk down towards 0
profile_repeats        3          runs per size (the median is kept)
profile_history_points 4          extra samples whose sequences carry cached history
timing_every           16         once calibrated, time one step in this many
tail_tolerance         0.15       a merged tail may take the target * (1 + this)
=====================  =========  =====================================================
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any

try:
    from vllm.logger import init_logger

    logger = init_logger(__name__)
except ImportError:  # pragma: no cover - only without vLLM
    logger = logging.getLogger(__name__)

CONFIG_KEY = "profiling_chunk_config"
SCHEDULER_CLS = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
ASYNC_SCHEDULER_CLS = "vllm_ascend.core.scheduler_profiling_chunk.AsyncProfilingChunkScheduler"
DEFAULT_CACHE_DIR = "~/.cache/vllm_ascend/cpp"


class CppConfigError(ValueError):
    """A profiling_chunk_config problem; the message names the key and the fix."""


@dataclass(frozen=True)
class CppConfig:
    enabled: bool = False
    smooth_factor: float = 1.0
    min_chunk: int | None = None
    max_fit_chunk: int = 30
    need_timing: bool = False
    cache_dir: str = DEFAULT_CACHE_DIR
    profile_points: int = 64
    profile_repeats: int = 3
    profile_history_points: int = 4
    timing_every: int = 16
    tail_tolerance: float = 0.0
    calibration_window: int = 30
    max_batch_ms: float | None = None

    @property
    def cache_path(self) -> str | None:
        """The cache folder with ``~`` expanded, or None when caching is off."""
        return os.path.expanduser(self.cache_dir) if self.cache_dir else None


VALID_KEYS = tuple(f.name for f in fields(CppConfig))


def _fail(key: str, value: Any, fix: str) -> None:
    raise CppConfigError(f"{CONFIG_KEY}.{key}={value!r}: {fix}")


def _as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(key, value, "must be true or false")
    return value


def _as_int(key: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            _fail(key, value, "must be an integer")
    if value < low or (high is not None and value > high):
        _fail(key, value, f"must be in [{low}, {high}]" if high is not None else f"must be >= {low}")
    return value


def _as_float(key: str, value: Any, low: float, high: float, *, low_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(key, value, "must be a number")
    number = float(value)
    if not (low < number if low_open else low <= number) or not number <= high:
        _fail(key, value, f"must be in {'(' if low_open else '['}{low:g}, {high:g}]")
    return number


def parse_cpp_config(raw: Any, *, max_num_batched_tokens: int | None = None) -> CppConfig:
    """Values and keys only (no engine checks); see ``check_cpp_setup`` for those."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CppConfigError(f'{CONFIG_KEY} must be a JSON object such as {{"enabled": true}}, got {raw!r}')
    unknown = sorted(set(raw) - set(VALID_KEYS))
    if unknown:
        raise CppConfigError(f"{CONFIG_KEY}: unknown key(s) {unknown}; valid keys are {', '.join(VALID_KEYS)}")
    enabled = _as_bool("enabled", raw.get("enabled", False))
    values: dict[str, Any] = {"enabled": enabled}
    values["smooth_factor"] = _as_float("smooth_factor", raw.get("smooth_factor", 1.0), 0.0, 1.0, low_open=True)
    min_chunk = raw.get("min_chunk")
    if min_chunk is not None:
        min_chunk = _as_int("min_chunk", min_chunk, 1)
        if max_num_batched_tokens is not None and min_chunk > max_num_batched_tokens:
            logger.warning(
                "%s.min_chunk=%d is above max_num_batched_tokens=%d; using %d",
                CONFIG_KEY,
                min_chunk,
                max_num_batched_tokens,
                max_num_batched_tokens,
            )
            min_chunk = max_num_batched_tokens
    values["min_chunk"] = min_chunk
    values["max_fit_chunk"] = _as_int("max_fit_chunk", raw.get("max_fit_chunk", 30), 8, 4096)
    values["need_timing"] = _as_bool("need_timing", raw.get("need_timing", enabled))
    cache_dir = raw.get("cache_dir", DEFAULT_CACHE_DIR)
    if cache_dir is None:
        cache_dir = ""
    if not isinstance(cache_dir, str):
        _fail("cache_dir", cache_dir, 'must be a folder path, or "" to keep no profile cache')
    values["cache_dir"] = cache_dir
    values["profile_points"] = _as_int("profile_points", raw.get("profile_points", 64), 8, 1024)
    values["profile_repeats"] = _as_int("profile_repeats", raw.get("profile_repeats", 3), 1, 16)
    values["profile_history_points"] = _as_int("profile_history_points", raw.get("profile_history_points", 4), 0, 64)
    values["timing_every"] = _as_int("timing_every", raw.get("timing_every", 16), 1, 1_000_000)
    values["tail_tolerance"] = _as_float("tail_tolerance", raw.get("tail_tolerance", 0.0), 0.0, 1.0, low_open=False)
    values["calibration_window"] = _as_int("calibration_window", raw.get("calibration_window", 30), 8, 4096)
    max_batch_ms = raw.get("max_batch_ms")
    if max_batch_ms is not None:
        max_batch_ms = _as_float("max_batch_ms", max_batch_ms, 0.0, 1e9, low_open=True)
    values["max_batch_ms"] = max_batch_ms
    return CppConfig(**values)


def check_cpp_setup(config: CppConfig, vllm_config: Any, *, balance_scheduling: bool) -> None:
    """Engine-level requirements of an enabled CPP config."""
    if not config.enabled:
        return
    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    if pp_size <= 1:
        raise CppConfigError(
            f"{CONFIG_KEY}.enabled=true needs pipeline parallelism, but pipeline_parallel_size={pp_size}: "
            "start with --pipeline-parallel-size 2 (or more), or set enabled to false"
        )
    if not vllm_config.scheduler_config.enable_chunked_prefill:
        raise CppConfigError(
            f"{CONFIG_KEY}.enabled=true needs chunked prefill: add --enable-chunked-prefill, or set enabled to false"
        )
    if balance_scheduling:
        raise CppConfigError(
            f"{CONFIG_KEY}.enabled=true cannot run with balance scheduling: set enable_balance_scheduling "
            "(or VLLM_ASCEND_BALANCE_SCHEDULING) to false, or set enabled to false"
        )


def load_profiling_chunk_config(additional_config: dict, vllm_config: Any, *, balance_scheduling: bool) -> CppConfig:
    """AscendConfig's hook: parse and check ``additional_config["profiling_chunk_config"]``."""
    config = parse_cpp_config(
        (additional_config or {}).get(CONFIG_KEY),
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
    )
    check_cpp_setup(config, vllm_config, balance_scheduling=balance_scheduling)
    return config


def select_cpp_scheduler(vllm_config: Any) -> None:
    """The platform's hook: install the CPP scheduler (its async form under async scheduling)."""
    current = vllm_config.scheduler_config.scheduler_cls
    if current is not None and current not in (SCHEDULER_CLS, ASYNC_SCHEDULER_CLS):
        name = current if isinstance(current, str) else f"{current.__module__}.{current.__qualname__}"
        raise CppConfigError(
            f"{CONFIG_KEY}.enabled=true replaces the scheduler, but scheduler_cls is already {name} "
            "(from --scheduler-cls, recompute_scheduler_enable or SLO_limits_for_dynamic_batch): "
            "drop that setting, or set enabled to false"
        )
    async_scheduling = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
    vllm_config.scheduler_config.scheduler_cls = ASYNC_SCHEDULER_CLS if async_scheduling else SCHEDULER_CLS
    import vllm_ascend.patch.platform.patch_profiling_chunk  # noqa: F401  (engine-core start-up hook)
