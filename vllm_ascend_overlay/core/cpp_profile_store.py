"""The CPP profile cache: a profile's JSON file, reused only on the deployment it was measured on.

A profile is the start-up samples (chunk_tokens, history_tokens, latency_ms) plus the
fingerprint of the deployment they were measured on (``vllm_ascend/deployment.py``:
model, dtype, quantisation, TP/PP sizes, token budget, KV block size, vLLM and patch-set
versions, device and CANN). A
file is untrusted input: it is read only up to ``MAX_PROFILE_BYTES``, must parse as the
expected JSON with exact types (``schema_version`` and ``base_chunk_size`` integers, not
``true`` or ``8192.0``), match the fingerprint and base chunk, and every sample must pass
the one sample check (core/cpp_samples.py ``check_sample``: whole token counts, a
latency a forward pass can take; never a string or a bool). Before they are judged, the
samples must span what a fresh profile does (``check_coverage``) and hold no more than it
(``check_size``): ``check_cached``. The samples are then judged
by the same rule as a fresh profile (core/cpp_acceptance.py), so a cached profile is
never trusted more than a new one. Any problem is a ``ProfileCacheError`` naming it;
the caller then profiles again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_ascend.core.cpp_samples import SampleError, check_samples
from vllm_ascend.json_file import read_json, write_json_atomically

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "ProfileCacheError",
    "cache_file",
    "check_cached",
    "check_coverage",
    "check_size",
    "load_profile",
    "save_profile",
]

# 2: a grid of chunk sizes by history lengths, no fitted coefficients; 3: its deepest level half a base chunk
# deeper, without the sizes that do not fit there (core/cpp_profile_plan.py): a build of one reads none of the other
PROFILE_SCHEMA_VERSION = 3
MAX_PROFILE_BYTES = 4 << 20  # a profile of a few thousand samples is ~100 kB
MAX_PROFILE_SAMPLES = 20_000
CACHED_HISTORY_COVERAGE = 0.5  # a cached profile must reach this share of the history in use


class ProfileCacheError(ValueError):
    """A cached profile that cannot be used; the message says why."""


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def cache_file(cache_dir: str, fingerprint: Mapping) -> Path:
    """The file of a deployment's profile; another schema is another file (two builds sharing a folder
    would otherwise each refuse the other's profile and write over it, profiling at every start)."""
    key = {"schema_version": PROFILE_SCHEMA_VERSION, "fingerprint": fingerprint}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
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


def check_coverage(samples: list, base_chunk_tokens: int, max_history_tokens: int) -> None:
    """ProfileCacheError unless a cached profile spans what the decisions read, as a fresh one
    does: chunks from one token to the base chunk, histories from none to at least
    ``CACHED_HISTORY_COVERAGE`` of the deepest this engine uses."""
    smallest, largest = min(chunk for chunk, _, _ in samples), max(chunk for chunk, _, _ in samples)
    shallowest, deepest = min(h for _, h, _ in samples), max(h for _, h, _ in samples)
    if smallest > 1 or largest < base_chunk_tokens:
        raise ProfileCacheError(f"chunks {smallest}..{largest} measured, not 1..{base_chunk_tokens}")
    if shallowest > 0:
        raise ProfileCacheError(f"no chunk measured without history (the shallowest is {shallowest} tokens)")
    if deepest < CACHED_HISTORY_COVERAGE * max_history_tokens:
        raise ProfileCacheError(f"measured to {deepest} tokens of history, this engine uses {max_history_tokens}")


def check_size(samples: list, most_samples: int, most_of_one_point: int) -> None:
    """ProfileCacheError unless a cached profile holds no more samples, and no more runs of any one point,
    than a fresh one of these settings makes (core/cpp_profiling.py ``fresh_profile_size``): reading it
    then costs what reading a fresh one does."""
    if len(samples) > most_samples:
        raise ProfileCacheError(
            f"{len(samples)} samples, more than the {most_samples} a fresh profile of these settings makes"
        )
    runs = Counter((chunk, history) for chunk, history, _ in samples)
    (chunk, history), repeats = max(runs.items(), key=lambda item: item[1])
    if repeats > most_of_one_point:
        raise ProfileCacheError(
            f"{repeats} runs of {chunk} tokens after {history} of history, more than the {most_of_one_point} "
            "a fresh profile of these settings makes of one point"
        )


def check_cached(
    samples: list, base_chunk_tokens: int, max_history_tokens: int, most_samples: int, most_of_one_point: int
) -> None:
    """ProfileCacheError unless a cached profile holds no more than a fresh one and spans what it does."""
    check_size(samples, most_samples, most_of_one_point)
    check_coverage(samples, base_chunk_tokens, max_history_tokens)
