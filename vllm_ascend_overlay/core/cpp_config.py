"""``additional_config["profiling_chunk_config"]``: parse, validate, select the CPP scheduler.

The key and upstream's five settings are kept, so existing configs keep working, except
``min_chunk`` (now the floor a step's first prefill advances by, so its default is smaller),
``max_fit_chunk``'s range, and values of another type that upstream converted (``"0.8"``,
``2048.5``, ``1`` for true): each is now an error naming the key; ours are added. Each key's
default, range and meaning is declared once, in ``CppConfig``'s fields
(``config_table.setting``); the user documentation's table is rendered from them. Everything
is checked at start-up, and a bad value is an error that names the key and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from vllm_ascend.config_table import (
    check_section_name,
    folder_path,
    parse_section,
    problem,
    raise_problems,
    refuse,
    setting,
    unwritable_part,
)
from vllm_ascend.core.cpp_chunk_rule import DEFAULT_FLOOR_TOKENS
from vllm_ascend.log_adapter import get_logger

logger = get_logger(__name__)

CONFIG_KEY = "profiling_chunk_config"
DEFAULT_CACHE_DIR = "~/.cache/vllm_ascend/cpp"
MAX_TOKENS = 10_000_000  # past any model's context: a token count above it is a slip
SCHEDULER_CLS = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
ASYNC_SCHEDULER_CLS = "vllm_ascend.core.scheduler_profiling_chunk.AsyncProfilingChunkScheduler"


class CppConfigError(ValueError):
    """A profiling_chunk_config problem; the message names the key and the fix."""


@dataclass(frozen=True)
class CppConfig:
    enabled: bool = setting(False, "CPP on or off")
    smooth_factor: float = setting(
        1.0,
        "weight of the predicted chunk against the base chunk: base + smooth_factor * (predicted - base)",
        low=0,
        high=1,
        low_open=True,
    )
    min_chunk: int = setting(
        DEFAULT_FLOOR_TOKENS,
        "tokens the step's first prefill always advances by, even when decodes fill the batch (rounded up to a "
        "measured tile); above `max_num_batched_tokens` it is clamped with a warning, as upstream did",
        kind=int,
        low=1,
        high=MAX_TOKENS,
    )
    max_fit_chunk: int = setting(
        30,
        "steps timed back-to-back after start-up (upstream: the timed steps collected for the online fit); "
        "after them one step in `timing_every` is timed",
        low=8,
        high=4096,
    )
    calibration_window: int = setting(30, "most recent timed steps kept for the online refit", low=8, high=4096)
    need_timing: bool = setting(False, "time sampled steps for online calibration", default_from="enabled")
    cache_dir: str = setting(
        DEFAULT_CACHE_DIR,
        "folder the fitted profiles are kept in; `~` is expanded and a relative path is taken from the working "
        'directory at start-up (the log names the absolute path); `""` or null keeps none',
        nullable=True,
        folder=True,
    )
    profile_points: int = setting(
        24,
        "most chunk sizes profiled at each history length: 1, then 32, 64, 96, 128, 192, ... (powers of two and "
        "1.5x them) up to `max_num_batched_tokens`; with fewer allowed, the 1.5x sizes go first",
        low=8,
        high=64,
    )
    profile_repeats: int = setting(2, "passes over every profiled point per round; the median is kept", low=1, high=16)
    profile_history_points: int = setting(
        4,
        "history lengths profiled besides 0, evenly up to the deepest the scheduler will see; every chunk size is "
        "measured at each it fits",
        low=1,
        high=32,
    )
    timing_every: int = setting(
        16, "after the first `max_fit_chunk` timed steps, time one prefill step in this many", low=1, high=1_000_000
    )
    tail_tolerance: float = setting(
        0.0, "a request's last chunk may take the batch-time target times (1 + this) to save a step", low=0, high=1
    )
    target_tpot_ms: float | None = setting(
        None,
        "the pace decodes keep, ms between a request's tokens (TPOT): while requests decode, each step takes at "
        "most target / P, a pipeline round being P steps (target under async scheduling), and prefills get the "
        "least TTFT that allows; null: CPP weighs the decodes' wait itself",
        kind=float,
        low=0,
        low_open=True,
        nullable=True,
    )

    @property
    def cache_path(self) -> str | None:
        """The cache folder with ``~`` expanded, or None when caching is off."""
        return os.path.expanduser(self.cache_dir) if self.cache_dir else None


REPLACED_KEYS = {
    "max_batch_ms": "target_tpot_ms: the time between a decoding request's tokens, which under pipeline parallelism "
    "spans the P steps of a pipeline round and binds only while requests decode (max_batch_ms=X bounded one "
    "stage's batch at every step: target_tpot_ms=X*P keeps the same pace for decodes)",
}


def parse_cpp_config(raw: Any, *, max_num_batched_tokens: int | None = None) -> CppConfig:
    """Values and keys only (no engine checks); see ``check_cpp_setup`` for those."""
    config = parse_section(CppConfig, raw, key=CONFIG_KEY, error=CppConfigError, replaced=REPLACED_KEYS)
    if config.cache_dir is None:
        config = replace(config, cache_dir="")
    if config.enabled and config.cache_dir == DEFAULT_CACHE_DIR:  # a given folder is resolved by parse_section
        folder, fault = folder_path(DEFAULT_CACHE_DIR, writable=False)
        if fault:
            fix = f'(the default) {fault}, or "" to keep no profile'
            raise CppConfigError(problem(CONFIG_KEY, "cache_dir", DEFAULT_CACHE_DIR, fix))
        if unwritable_part(folder):  # (a read-only HOME in a container: CPP runs, every start profiles)
            logger.warning(
                '[CPP] %s.cache_dir: the default %s is not writable here, so no profile is kept and every start '
                'profiles; set cache_dir to a folder the server can write (or "" to say so)', CONFIG_KEY, folder,
            )  # fmt: skip
            folder = ""
        config = replace(config, cache_dir=folder)
    # Clamped only when on, as upstream did: off, min_chunk is not read (nor is the engine's budget).
    if config.enabled and max_num_batched_tokens is not None and config.min_chunk > max_num_batched_tokens:
        if isinstance(raw, dict) and "min_chunk" not in raw:  # the default: nothing the user set to warn of
            return replace(config, min_chunk=max_num_batched_tokens)
        logger.warning(
            "[CPP] %s.min_chunk=%d is above max_num_batched_tokens=%d; using %d",
            CONFIG_KEY,
            config.min_chunk,
            max_num_batched_tokens,
            max_num_batched_tokens,
        )
        config = replace(config, min_chunk=max_num_batched_tokens)
    return config


def check_cpp_setup(config: CppConfig, vllm_config: Any, *, balance_scheduling: bool) -> None:
    """Engine-level requirements of an enabled CPP config; every unmet one is reported."""
    if config.enabled:
        raise_problems(CONFIG_KEY, _setup_problems(vllm_config, balance_scheduling), CppConfigError)


def _setup_problems(vllm_config: Any, balance_scheduling: bool) -> list[str]:
    """What the engine lacks for CPP (pipeline parallelism, chunked prefill, no balance scheduling)."""
    problems = []
    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    if pp_size <= 1:
        problems.append(
            f"{CONFIG_KEY}.enabled=true needs pipeline parallelism, but pipeline_parallel_size={pp_size}: "
            "start with --pipeline-parallel-size 2 (or more), or set enabled to false"
        )
    if not vllm_config.scheduler_config.enable_chunked_prefill:
        problems.append(
            f"{CONFIG_KEY}.enabled=true needs chunked prefill: add --enable-chunked-prefill, or set enabled to false"
        )
    if balance_scheduling:
        problems.append(
            f"{CONFIG_KEY}.enabled=true cannot run with balance scheduling: set enable_balance_scheduling "
            "(or VLLM_ASCEND_BALANCE_SCHEDULING) to false, or set enabled to false"
        )
    return problems


def load_profiling_chunk_config(additional_config: dict, vllm_config: Any, *, balance_scheduling: bool) -> CppConfig:
    """AscendConfig's hook: parse and check ``additional_config["profiling_chunk_config"]``.

    Refused while the engine builds its AscendConfig, CPP is off (the defaults) until the build
    ends and raises its problems with every other section's (``config_table.refuse``).
    """
    try:
        return _checked_config(additional_config, vllm_config, balance_scheduling)
    except CppConfigError as error:
        refuse(error)
        return CppConfig()


def _checked_config(additional_config: dict, vllm_config: Any, balance_scheduling: bool) -> CppConfig:
    check_section_name(additional_config, CONFIG_KEY, CppConfigError)
    raw = (additional_config or {}).get(CONFIG_KEY)
    try:
        config = parse_cpp_config(raw, max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens)
    except CppConfigError as error:
        # Asked for, with bad values: what the engine lacks is said too, so one restart fixes all.
        unmet = _setup_problems(vllm_config, balance_scheduling) if isinstance(raw, dict) and raw.get("enabled") else []
        if not unmet:
            raise
        raise CppConfigError(f"{error}\nWith enabled=true, the engine also lacks:\n  " + "\n  ".join(unmet)) from None
    check_cpp_setup(config, vllm_config, balance_scheduling=balance_scheduling)
    return config


def select_cpp_scheduler(vllm_config: Any) -> None:
    """The platform's hook: install the CPP scheduler (its async form under async scheduling)."""
    current = vllm_config.scheduler_config.scheduler_cls
    if current is not None and current not in (SCHEDULER_CLS, ASYNC_SCHEDULER_CLS):
        # A class by its import path; anything else as it prints (the error must not fail itself).
        qualname = getattr(current, "__qualname__", None)
        if isinstance(current, str):
            name = current
        else:
            name = f"{current.__module__}.{qualname}" if qualname else repr(current)
        raise CppConfigError(
            f"{CONFIG_KEY}.enabled=true replaces the scheduler, but scheduler_cls is already {name} "
            "(from --scheduler-cls, recompute_scheduler_enable or SLO_limits_for_dynamic_batch): "
            "drop that setting, or set enabled to false"
        )
    async_scheduling = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
    vllm_config.scheduler_config.scheduler_cls = ASYNC_SCHEDULER_CLS if async_scheduling else SCHEDULER_CLS
    import vllm_ascend.patch.platform.patch_profiling_chunk  # noqa: F401  (engine-core start-up hook)
