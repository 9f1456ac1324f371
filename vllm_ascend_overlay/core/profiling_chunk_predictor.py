"""Dynamic chunked pipeline parallelism (CPP): the public entry point at upstream's path.

The pieces live in one module per concept; this module re-exports them so that code
importing upstream's ``vllm_ascend.core.profiling_chunk_predictor`` finds CPP here:

- core/cpp_latency_model.py: the latency model t(C, H), its fit and its acceptance;
- core/cpp_chunk_rule.py: the batch-time target and the per-step budget;
- core/cpp_calibration.py: online calibration from timed steps;
- core/cpp_profile_store.py: the fingerprint and the cached profile file.
"""

from vllm_ascend.core.cpp_calibration import CalibrationRow, OnlineCalibration
from vllm_ascend.core.cpp_chunk_rule import DEFAULT_FLOOR_TOKENS, ChunkLimits, ChunkRule, StepBudget
from vllm_ascend.core.cpp_latency_model import FitError, LatencyModel, accept, batch_features
from vllm_ascend.core.cpp_profile_store import (
    PROFILE_SCHEMA_VERSION,
    ProfileCacheError,
    cache_file,
    fingerprint_for,
    load_profile,
    make_fingerprint,
    save_profile,
)

__all__ = [
    "DEFAULT_FLOOR_TOKENS",
    "PROFILE_SCHEMA_VERSION",
    "CalibrationRow",
    "ChunkLimits",
    "ChunkRule",
    "FitError",
    "LatencyModel",
    "OnlineCalibration",
    "ProfileCacheError",
    "StepBudget",
    "accept",
    "batch_features",
    "cache_file",
    "fingerprint_for",
    "load_profile",
    "make_fingerprint",
    "save_profile",
]
