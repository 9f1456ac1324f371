"""Dynamic chunked pipeline parallelism (CPP): the public entry point at upstream's path.

The pieces live in one module per concept; this module re-exports them at upstream's
module path, ``vllm_ascend.core.profiling_chunk_predictor``. Upstream's own classes here
(``ChunkSizePredictor``, ``ProfilingChunkManager``) are gone: the measured latency model
and the planner replace them, and code that imported them must move to these names:

- core/cpp_samples.py: what a profile sample is, and its one check;
- core/cpp_latency_model.py: the measured latency model t(C, H);
- core/cpp_acceptance.py: whether a profile may schedule, and the fallback when not;
- core/cpp_chunk_rule.py: the chunk for a time and the per-step budget;
- core/cpp_planner.py: the batch-time target;
- core/cpp_calibration.py: online calibration from timed steps;
- core/cpp_profile_store.py: the cached profile file (keyed by ``vllm_ascend/deployment.py``'s fingerprint).
"""

from vllm_ascend.core.cpp_acceptance import Verdict, judge
from vllm_ascend.core.cpp_calibration import OnlineCalibration, StepRow
from vllm_ascend.core.cpp_chunk_rule import DEFAULT_FLOOR_TOKENS, ChunkLimits, ChunkRule, Plan
from vllm_ascend.core.cpp_latency_model import LatencyModel, batch_features
from vllm_ascend.core.cpp_planner import plan_target
from vllm_ascend.core.cpp_profile_store import (
    PROFILE_SCHEMA_VERSION,
    ProfileCacheError,
    cache_file,
    load_profile,
    save_profile,
)
from vllm_ascend.core.cpp_samples import FitError, SampleError, check_sample, group_points
from vllm_ascend.core.cpp_step_budget import StepBudget
from vllm_ascend.deployment import fingerprint_for, make_fingerprint

__all__ = [
    "DEFAULT_FLOOR_TOKENS",
    "PROFILE_SCHEMA_VERSION",
    "ChunkLimits",
    "ChunkRule",
    "FitError",
    "LatencyModel",
    "OnlineCalibration",
    "Plan",
    "ProfileCacheError",
    "SampleError",
    "StepBudget",
    "StepRow",
    "Verdict",
    "batch_features",
    "cache_file",
    "check_sample",
    "fingerprint_for",
    "group_points",
    "judge",
    "load_profile",
    "make_fingerprint",
    "plan_target",
    "save_profile",
]
