"""Engine-core start-up hook of dynamic chunked pipeline parallelism (CPP).

Imported by the platform when ``profiling_chunk_config.enabled`` (core/cpp_config.py).
``EngineCore.__init__`` then ends with ``scheduler.run_profiling_chunk_init(executor)``:
the cached profile is adopted or the workers are profiled once
(core/cpp_profiling.py). Timing and calibration need no wrapper here: the scheduler
reads them in its own ``update_from_output``.

The engine core usually runs in a spawned process, where patches made in the parent
are gone; ``EngineCoreProc.run_engine_core`` is wrapped so that unpickling it in the
child imports this module again, which re-applies the hook there.
"""

from vllm.v1.engine.core import EngineCore, EngineCoreProc
from vllm_ascend.core.cpp_profiling import wrap_engine_core_init

wrap_engine_core_init(EngineCore)

_run_engine_core = EngineCoreProc.run_engine_core


def run_engine_core(*args, **kwargs):
    wrap_engine_core_init(EngineCore)
    return _run_engine_core(*args, **kwargs)


if not getattr(_run_engine_core, "_cpp_wrapped", False):
    run_engine_core._cpp_wrapped = True
    EngineCoreProc.run_engine_core = run_engine_core
