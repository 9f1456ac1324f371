"""The CPP profile cache: a profile's JSON file, reused only on the deployment it was measured on.

A profile is the start-up samples (chunk_tokens, history_tokens, latency_ms) plus the
fingerprint of the deployment they were measured on (``vllm_ascend/deployment.py``:
model, dtype, quantisation, TP/PP sizes, token budget, KV block size, vLLM and patch-set
versions, device and CANN). A
file is untrusted input: it is read only up to ``MAX_PROFILE_BYTES``, must parse as the
expected JSON with exact types (``schema_version`` and ``base_chunk_size`` integers, not
``true`` or ``8192.0``), match the fingerprint and base chunk, and every sample must pass
the one sample check (core/cpp_samples.py ``check_sample``: whole token counts, a
latency a forward pass can take; never a string or a bool). The samples are then judged
by the same rule as a fresh profile (core/cpp_acceptance.py), so a cached profile is
never trusted more than a new one. Any problem is a ``ProfileCacheError`` naming it;
the caller then profiles again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_ascend.core.cpp_samples import SampleError, check_samples
from vllm_ascend.json_file import read_json, write_json_atomically

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "ProfileCacheError",
    "cache_file",
    "load_profile",
    "save_profile",
]

PROFILE_SCHEMA_VERSION = 2  # 2: a grid of chunk sizes by history lengths, no fitted coefficients
MAX_PROFILE_BYTES = 4 << 20  # a profile of a few thousand samples is ~100 kB
MAX_PROFILE_SAMPLES = 20_000


class ProfileCacheError(ValueError):
    """A cached profile that cannot be used; the message says why."""


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def cache_file(cache_dir: str, fingerprint: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"cpp-profile-{digest}.json"


def save_profile(
    path: str | os.PathLike,
    *,
    fingerprint: Mapping,
    base_chunk_tokens: int,
    samples: Sequence[Sequence[float]],
) -> None:
    """Write the profile atomically (a temporary file renamed into place); OSError if it cannot."""
    path = Path(path)
    data = {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "fingerprint": _normal(dict(fingerprint)),
        "base_chunk_size": int(base_chunk_tokens),
        "samples": [[int(c), int(h), float(ms)] for c, h, ms in samples],
    }
    write_json_atomically(path, data)


def load_profile(path: str | os.PathLike, *, fingerprint: Mapping, base_chunk_tokens: int) -> list | None:
    """The samples of a matching cached profile; None if there is no file; ProfileCacheError if unusable."""
    data = read_json(path, MAX_PROFILE_BYTES, ProfileCacheError)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ProfileCacheError("not a JSON object")
    version = data.get("schema_version")
    if type(version) is not int or version != PROFILE_SCHEMA_VERSION:
        raise ProfileCacheError(f"schema_version {version!r:.40} is not {PROFILE_SCHEMA_VERSION}")
    if _normal(data.get("fingerprint")) != _normal(dict(fingerprint)):
        raise ProfileCacheError("fingerprint differs (other model, parallelism, versions or device)")
    base = data.get("base_chunk_size")
    if type(base) is not int or base != base_chunk_tokens:
        raise ProfileCacheError(f"base_chunk_size {base!r:.40} is not {base_chunk_tokens}")
    samples = data.get("samples")
    if not isinstance(samples, list) or not samples or len(samples) > MAX_PROFILE_SAMPLES:
        raise ProfileCacheError(f"samples must be a list of 1 to {MAX_PROFILE_SAMPLES} entries")
    try:
        return check_samples(samples)
    except SampleError as error:
        raise ProfileCacheError(str(error)) from None
