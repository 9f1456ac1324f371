"""CPP's engine-core side on vLLM's CPU engine, applied in the engine-core process.

vLLM spawns the engine core in a fresh interpreter, so hooks made in the API server are
gone there. ``serve.py`` replaces ``EngineCoreProc.run_engine_core`` (the spawned
process's entry point) by ``run_engine_core`` below; pickling it by reference makes the
child import this module, and the wrapper installs the hooks before the ``EngineCore``
is built. The policy comes from ``$CPP_E2E_POLICY``:

- ``ours``: the NPU-only modules stubbed (``npu_stubs``), upstream's
  ``patch_balance_schedule`` (the loop our scheduler's hooks run in) and the product's
  ``patch/platform/patch_profiling_chunk.py`` loaded from the assembled tree: the latter
  ends ``EngineCore.__init__`` with ``scheduler.run_profiling_chunk_init(executor)``,
  as the NPU platform arranges it.
- ``upstream``: upstream's own engine patch from the pristine tree (profiling at start-up,
  timing fed back in ``update_from_output``), and its "time every step until calibration
  is done" rule turned into the ``cpp_time_step`` flag the CPU worker extension reads.
- anything else: nothing (vLLM's own scheduling).

With ``$CPP_E2E_STEP_LOG`` set (the trace bench sets it for every server), whatever the
policy, every step that carries a prefill is timed and logged as well (``step_log``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from vllm.logger import logger  # the "vllm" logger: vLLM configures it in every process
from vllm.v1.engine.core import EngineCore, EngineCoreProc

from . import step_log

POLICY_ENV = "CPP_E2E_POLICY"
BALANCE_MODULE = "vllm_ascend.patch.platform.patch_balance_schedule"
START_UP_MODULE = "vllm_ascend.patch.platform.patch_profiling_chunk"

_vllm_run_engine_core = EngineCoreProc.run_engine_core
_installed: str | None = None


def install(policy: str) -> None:
    """Install ``policy``'s engine-core hooks in this process (once)."""
    global _installed
    if _installed is not None:
        return
    if policy in ("ours", "upstream"):
        _install_cpp(policy)
    if os.environ.get(step_log.STEP_LOG_ENV):
        # After upstream's marks, so this wrapper is the outer one: it only adds marks.
        _after_init(EngineCore, _log_scheduler_steps)
    _installed = policy


def _install_cpp(policy: str) -> None:
    from ..npu_stubs import install_npu_stubs
    from ..paths import assembled_root
    from ..trees import load_module_from_tree, pristine_root

    install_npu_stubs()
    _configure_ascend_logging()
    if policy == "ours":
        tree = assembled_root()
        load_module_from_tree(tree, BALANCE_MODULE)
        load_module_from_tree(tree, START_UP_MODULE)
    else:
        tree = pristine_root()
        load_module_from_tree(tree, START_UP_MODULE)
        _after_init(EngineCore, _mark_upstream_schedule)
    logger.info("[CPP e2e] engine-core hooks of %s installed from %s", policy, tree)


def _configure_ascend_logging() -> None:
    """vllm_ascend's own log handler, as its NPU platform installs it: the product's INFO lines show."""
    from vllm_ascend.logger import configure_ascend_logging

    configure_ascend_logging()


def _after_init(engine_core_cls: type, then: Callable[[type], None]) -> None:
    """Call ``then(scheduler class)`` at the end of every ``EngineCore.__init__``, once its scheduler is built."""
    original_init = engine_core_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        then(type(self.scheduler))

    engine_core_cls.__init__ = __init__


def _mark_upstream_schedule(scheduler_cls: type) -> None:
    """Upstream's model runner times every step until the scheduler sends ``disable_profiling_timing``."""
    schedule = scheduler_cls.schedule
    if getattr(schedule, "_cpp_e2e_marked", False):
        return

    def marked_schedule(scheduler: Any, *a: Any, **kw: Any):
        output = schedule(scheduler, *a, **kw)
        output.cpp_time_step = not getattr(output, "disable_profiling_timing", False)
        return output

    marked_schedule._cpp_e2e_marked = True  # type: ignore[attr-defined]
    scheduler_cls.schedule = marked_schedule


def _log_scheduler_steps(scheduler_cls: type) -> None:
    """Time and log every prefill step of the scheduler the engine core builds (``step_log``)."""
    if step_log.install(scheduler_cls, logger.info):
        logger.info("[CPP e2e] every prefill step of %s timed and logged", scheduler_cls.__name__)


def run_engine_core(*args: Any, **kwargs: Any):
    """The engine-core process's entry point: hooks first, then vLLM's own."""
    install(os.environ.get(POLICY_ENV, ""))
    return _vllm_run_engine_core(*args, **kwargs)
