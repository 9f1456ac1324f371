"""The measured gate's cache: the probes of a deployment, kept across restarts.

Same rules as the CPP profile cache (core/cpp_profile_store.py): the file is keyed by
that module's fingerprint of the deployment (model, dtype, quantisation, TP/PP sizes,
token budget, KV block size, vLLM and patch-set versions, device, CANN), here extended by
what shapes the dual-stream decision (split strategy, balance threshold, size classes,
probes per class); it is written atomically (a temporary file renamed into place); and it
is untrusted input: read only up to ``MAX_BYTES``, it must parse as the expected JSON and
match the fingerprint, every probe must be a known class with times a forward can take
(``MIN_PROBE_SECONDS`` to ``MAX_PROBE_SECONDS``), and the decision is made again from the
probes (``measured.MeasuredGate``), never read from the file. Any problem is a
``MeasuredCacheError`` naming it, quoting at most an excerpt of a bad value (its message
stays a log line however large the file); the caller then measures again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_ascend.config_table import shown
from vllm_ascend.dual_stream.measured import MAX_PROBE_SECONDS, MIN_PROBE_SECONDS, Probe
from vllm_ascend.json_file import read_json, write_json_atomically

SCHEMA_VERSION = 1
MAX_BYTES = 1 << 20
EXCERPT_CHARS = 200  # of a bad value quoted in an error
MAX_MESSAGE_CHARS = 600


class MeasuredCacheError(ValueError):
    """A cached measurement that cannot be used; the message says why, in one bounded line."""

    def __init__(self, reason: str):
        super().__init__(_cut(str(reason), MAX_MESSAGE_CHARS))


def fingerprint(deployment: Mapping, *, split_strategy: str, balance_threshold: float,
                classes: Sequence[int], repeats: int, stage: int | None = None) -> dict:  # fmt: skip
    """``deployment`` (``vllm_ascend.deployment.fingerprint_for``) plus what the dual-stream decision depends on.

    ``stage``: the pipeline stage under PP > 1 (its layers and its share of the time are its
    own, so each stage measures and keeps its probes apart); None without PP.
    """
    rules = {
        "split_strategy": str(split_strategy),
        "balance_threshold": float(balance_threshold),
        "size_classes": [int(c) for c in classes],
        "probes_per_class": int(repeats),
    }
    if stage is not None:
        rules["pipeline_stage"] = int(stage)
    return {**json.loads(json.dumps(dict(deployment), sort_keys=True)), "dual_stream": rules}


def deployment_fingerprint(vllm_config: Any) -> dict:
    """The engine's deployment fingerprint (CPP's profile cache's too), read without touching the device."""
    from vllm_ascend.deployment import fingerprint_for

    return fingerprint_for(vllm_config)


def cache_file(cache_dir: str, key: Mapping) -> Path:
    """The file of a deployment's probes; another schema is another file (as CPP's profile)."""
    key = {"schema_version": SCHEMA_VERSION, "fingerprint": key}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(os.path.expanduser(cache_dir)) / f"dual-stream-probes-{digest}.json"


def save(path: str | os.PathLike, *, key: Mapping, probes: Sequence[Probe]) -> None:
    """Write the probes atomically; OSError if it cannot."""
    path = Path(path)
    data = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": json.loads(json.dumps(dict(key), sort_keys=True)),
        "probes": [[p.size_class, p.single_s, p.dual_s] for p in probes],
    }
    write_json_atomically(path, data)


def load(path: str | os.PathLike, *, key: Mapping, classes: Sequence[int], repeats: int) -> list[Probe] | None:
    """The probes of a matching cache file; None when there is none; ``MeasuredCacheError`` when unusable."""
    data = read_json(path, MAX_BYTES, MeasuredCacheError)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise MeasuredCacheError("not a JSON object")
    if type(data.get("schema_version")) is not int or data.get("schema_version") != SCHEMA_VERSION:
        raise MeasuredCacheError(f"schema_version {_excerpt(data.get('schema_version'))} != {SCHEMA_VERSION}")
    if data.get("fingerprint") != json.loads(json.dumps(dict(key), sort_keys=True)):
        raise MeasuredCacheError("fingerprint differs (other model, parallelism, versions, device or split rules)")
    rows = data.get("probes")
    if not isinstance(rows, list) or len(rows) > len(classes) * repeats:
        raise MeasuredCacheError(f"probes must be a list of at most {len(classes) * repeats} entries")
    probes = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and all(_is_number(v) for v in row)):
            raise MeasuredCacheError(f"a probe must be [size_class, single_s, dual_s] numbers, got {_excerpt(row)}")
        size_class, single_s, dual_s = row
        if size_class not in classes:
            raise MeasuredCacheError(f"size class {_excerpt(size_class)} is not one of {list(classes)}")
        probes.append(Probe(int(size_class), _seconds(single_s), _seconds(dual_s)))
    return probes


def _seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except OverflowError:  # a JSON integer past every float
        seconds = math.inf
    if not (math.isfinite(seconds) and MIN_PROBE_SECONDS <= seconds <= MAX_PROBE_SECONDS):
        raise MeasuredCacheError(
            f"a probe time must be in [{MIN_PROBE_SECONDS:g}, {MAX_PROBE_SECONDS:g}] s (no forward of a probe batch "
            f"takes less or more), got {_excerpt(value)}"
        )
    return seconds


def _excerpt(value: Any) -> str:
    """``value`` as an error quotes it: its repr, at most ``EXCERPT_CHARS`` of it."""
    return _cut(shown(value), EXCERPT_CHARS)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
