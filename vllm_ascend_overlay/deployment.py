"""The identity of a deployment: what a measurement made on it must match to be reused.

Start-up measurements (CPP's latency profile, dual stream's probes) are cached across
restarts and keyed by the engine they were measured on: model (its path and a digest of its
architecture: another model put at the same path is another deployment), dtype, quantisation,
TP/PP sizes, token budget, KV block size, vLLM and vllm-ascend versions, device and CANN, and
what else changes a forward pass's time: the KV cache dtype, context-parallel sizes, eager or
graph execution, and vllm-ascend's other settings: its ``additional_config`` (a digest; CPP's own
section left out, also where a section nests it, dual stream's on or off) and the
``VLLM_ASCEND_*`` environment variables that stand in for its keys (a digest of those set).
``fingerprint_for`` reads them from a ``VllmConfig`` without touching the device (the
engine-core process has none); ``make_fingerprint`` builds one from values (JSON-safe).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from typing import Any

__all__ = ["fingerprint_for", "make_fingerprint"]

CPP_SECTION = "profiling_chunk_config"


def make_fingerprint(
    *,
    model: str,
    dtype: str,
    quantization: str | None,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    max_num_batched_tokens: int,
    block_size: int,
    vllm_version: str,
    vllm_ascend_version: str,
    device_name: str,
    cann_version: str | None = None,
    architecture: str | None = None,
    execution: dict | None = None,
) -> dict:
    """What a cached profile must match to be reused (JSON-safe values)."""
    return {
        "execution": json.loads(json.dumps(execution or {}, sort_keys=True, default=str)),
        "model": str(model),
        "dtype": str(dtype),
        "quantization": None if quantization is None else str(quantization),
        "tensor_parallel_size": int(tensor_parallel_size),
        "pipeline_parallel_size": int(pipeline_parallel_size),
        "max_num_batched_tokens": int(max_num_batched_tokens),
        "block_size": int(block_size),
        "vllm_version": str(vllm_version),
        "vllm_ascend_version": str(vllm_ascend_version),
        "device_name": str(device_name),
        "cann_version": None if cann_version is None else str(cann_version),
        "architecture": None if architecture is None else str(architecture),
    }


def _ascend_version() -> str:
    """This build's vllm-ascend version: the patch set's, where it is one, else the installed package's."""
    try:
        from vllm_ascend import patchset

        return patchset.PATCHSET_VERSION
    except ImportError:
        pass
    try:
        return importlib.metadata.version("vllm_ascend")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def fingerprint_for(vllm_config: Any) -> dict:
    """The fingerprint of an engine's configuration, read without touching the device."""
    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:  # pragma: no cover - vLLM is always there in the engine
        vllm_version = "unknown"
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
        vllm_ascend_version=_ascend_version(),
        device_name=device_name,
        cann_version=cann_version,
        architecture=_architecture_digest(model_config),
        execution=_execution(vllm_config),
    )


def _execution(vllm_config: Any) -> dict:
    """What changes a forward pass's time besides the fingerprint's other fields (see the module doc)."""
    parallel, cache = vllm_config.parallel_config, vllm_config.cache_config
    additional = getattr(vllm_config, "additional_config", None)
    additional = dict(additional) if isinstance(additional, dict) else {}
    # CPP's settings change no forward pass, at the top or in a section (upstream main's scheduler_config);
    # an empty section is no section: every setting of it at its default (CPP's alone in it, or `{}` given)
    sections = {}
    for key, value in additional.items():
        if isinstance(value, dict):
            value = {name: setting for name, setting in value.items() if name != CPP_SECTION}
            if not value:
                continue
        if key != CPP_SECTION:
            sections[key] = value
    additional = sections
    dual_stream = additional.pop("dual_stream_config", None)
    try:
        settings = json.dumps(additional, sort_keys=True, default=lambda value: type(value).__name__).encode()
    except (TypeError, ValueError):  # (keys of mixed types, a cycle: still one digest per configuration)
        settings = repr(sorted(repr(item) for item in additional.items())).encode()
    variables = json.dumps(sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_ASCEND_"))).encode()
    return {
        "kv_cache_dtype": str(getattr(cache, "cache_dtype", "auto")),
        "prefill_context_parallel_size": int(getattr(parallel, "prefill_context_parallel_size", 1) or 1),
        "decode_context_parallel_size": int(getattr(parallel, "decode_context_parallel_size", 1) or 1),
        "enforce_eager": bool(getattr(vllm_config.model_config, "enforce_eager", False)),
        "dual_stream": bool(isinstance(dual_stream, dict) and dual_stream.get("enabled")),
        "additional_config": hashlib.sha256(settings).hexdigest()[:16],
        "ascend_environment": hashlib.sha256(variables).hexdigest()[:16],
    }


def _architecture_digest(model_config: Any) -> str | None:
    """A digest of the model's configuration (layers, widths, heads, ...): what its step time depends on,
    which its path alone does not pin (a new download, a symlink moved to another model). Bookkeeping
    fields (names, the transformers version) are left out."""
    try:
        config = model_config.hf_config.to_dict()
    except Exception:
        return None
    kept = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("transformers_version",)}
    text = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _device_identity() -> tuple[str, str | None]:
    """Device kind and CANN install, read without touching the NPU from the engine-core process.

    The SoC comes from the wheel's build info; the CANN version from the real path of the
    toolkit folder (``.../ascend-toolkit/8.x.y`` behind a ``latest`` link).
    """
    device_name = "unknown"
    try:
        import vllm_ascend._build_info as build_info  # written when the wheel is built
        from vllm_ascend.utils import get_ascend_device_type

        soc = getattr(build_info, "__soc_version__", None)
        device_name = f"{get_ascend_device_type().name}/{soc}" if soc else get_ascend_device_type().name
    except Exception:
        pass
    toolkit = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    return device_name, os.path.realpath(toolkit) if toolkit else None
