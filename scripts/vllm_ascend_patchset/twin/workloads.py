"""Workloads for the twin: one long prompt, mixed traffic with a seed, or a trace (``traces``).

A workload is a list of ``RequestSpec`` (plain data, JSON-able, so a policy subprocess
gets exactly the same requests). Prompt token ids are generated in the subprocess from
``(seed, req_id)``: the first ``group_tokens`` come from the stream of its
``prefix_group``, the rest from its own stream. A request that opens a group takes its
whole prompt from the group stream; a later request of the group shares a prefix of it
and so hits the prefix cache. A trace request instead names its prompt's blocks
(``block_ids``, ``TRACE_BLOCK_TOKENS`` tokens each): each block's tokens are a function
of its id alone, so equal leading ids give equal leading tokens, and the last block
may be cut short by ``prompt_tokens``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .surface import Surface

VOCAB_TOKENS = 1000  # token ids stay in [1, VOCAB_TOKENS) (the tiny model's vocabulary)
TRACE_BLOCK_TOKENS = 512  # tokens per block id of a trace prompt (Mooncake's hash_ids)
_BLOCK_STREAM = 3  # random stream of trace blocks (1: a request's own, 2: a prefix group's)


@dataclass(frozen=True)
class RequestSpec:
    req_id: str
    arrival_ms: float
    prompt_tokens: int
    max_output_tokens: int
    prefix_group: int  # requests of one group share a prefix
    group_tokens: int = 0  # leading tokens taken from the group's stream
    block_ids: tuple[int, ...] = ()  # trace prompts: one id per TRACE_BLOCK_TOKENS tokens (overrides the above)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RequestSpec:
        return cls(**{**data, "block_ids": tuple(data.get("block_ids", ()))})


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    requests: tuple[RequestSpec, ...]
    notes: tuple[str, ...] = field(default=(), compare=False)  # how it was built, printed under its table

    def to_json(self) -> dict:
        return {"name": self.name, "seed": self.seed, "requests": [r.to_json() for r in self.requests]}

    @classmethod
    def from_json(cls, data: dict) -> Workload:
        return cls(data["name"], data["seed"], tuple(RequestSpec.from_json(r) for r in data["requests"]))

    @property
    def max_request_tokens(self) -> int:
        return max(r.prompt_tokens + r.max_output_tokens for r in self.requests)

    @property
    def total_tokens(self) -> int:
        return sum(r.prompt_tokens + r.max_output_tokens for r in self.requests)


def prompt_token_ids(spec: RequestSpec, seed: int) -> list[int]:
    """Deterministic prompt ids: a trace request's blocks; else the group's shared prefix, then its own tokens."""
    if spec.block_ids:
        needed = -(-spec.prompt_tokens // TRACE_BLOCK_TOKENS)
        if len(spec.block_ids) < needed:
            raise ValueError(f"{spec.req_id}: {len(spec.block_ids)} block ids for {spec.prompt_tokens} prompt tokens")
        ids = np.concatenate([_block_tokens(b) for b in spec.block_ids[:needed]])
        return ids[: spec.prompt_tokens].tolist()
    own = np.random.default_rng([seed, 1, _stable_id(spec.req_id)]).integers(1, VOCAB_TOKENS, spec.prompt_tokens)
    if spec.group_tokens:
        group = np.random.default_rng([seed, 2, spec.prefix_group]).integers(1, VOCAB_TOKENS, spec.group_tokens)
        own[: spec.group_tokens] = group
    return own.tolist()


@functools.lru_cache(maxsize=8192)
def _block_tokens(block_id: int) -> np.ndarray:
    """The tokens of one trace block: a function of its id alone, not of the workload seed or the request."""
    return np.random.default_rng([_BLOCK_STREAM, block_id]).integers(1, VOCAB_TOKENS, TRACE_BLOCK_TOKENS)


def _stable_id(req_id: str) -> int:
    return int.from_bytes(hashlib.sha256(req_id.encode()).digest()[:8], "big")


def long_prompt(prompt_tokens: int, output_tokens: int = 1) -> Workload:
    """One prompt of ``prompt_tokens`` arriving at time 0 (TTFT is the whole story)."""
    if prompt_tokens <= 0:
        raise ValueError(f"prompt length must be > 0, got {prompt_tokens}")
    spec = RequestSpec("long-0", 0.0, prompt_tokens, output_tokens, prefix_group=0, group_tokens=prompt_tokens)
    return Workload(f"long-{_k(prompt_tokens)}", 0, (spec,))


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def prefill_tokens_per_s(surface: Surface, num_stages: int, chunk_tokens: int, history_tokens: int) -> float:
    """Pipeline throughput of back-to-back chunks of this size at this history."""
    return chunk_tokens / (surface.time_ms(chunk_tokens, history_tokens) / num_stages) * 1000.0


def mixed(
    surface: Surface,
    num_stages: int,
    seed: int = 0,
    num_requests: int = 24,
    load: float = 0.6,
    min_prompt_tokens: int = 4096,
    max_prompt_tokens: int = 65536,
    prefix_hit_share: float = 0.25,
    min_output_tokens: int = 16,
    max_output_tokens: int = 128,
    reference_chunk_tokens: int = 8192,
) -> Workload:
    """Poisson arrivals of prompts log-uniform in [min, max] tokens, decodes alongside.

    ``load`` is the offered prefill work over the pipeline's prefill capacity (at
    ``reference_chunk_tokens`` chunks and half the mean prompt as history), so the same
    load means the same queueing on any surface. A ``prefix_hit_share`` of requests
    reuse 50-90% of an earlier request's prompt from the prefix cache.
    """
    if not 0 < load:
        raise ValueError(f"--load must be > 0, got {load}")
    if not 0 <= prefix_hit_share <= 1:
        raise ValueError(f"--prefix-hit-share must be in [0, 1], got {prefix_hit_share}")
    if not 0 < min_prompt_tokens <= max_prompt_tokens:
        raise ValueError(f"prompt range must satisfy 0 < min <= max, got {min_prompt_tokens}..{max_prompt_tokens}")
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(math.log(min_prompt_tokens), math.log(max_prompt_tokens), num_requests))
    lengths = np.maximum(lengths.astype(np.int64), 1)
    mean_prompt = float(lengths.mean())
    capacity = prefill_tokens_per_s(surface, num_stages, reference_chunk_tokens, int(mean_prompt / 2))
    rate_per_s = load * capacity / mean_prompt
    gaps_ms = rng.exponential(1000.0 / rate_per_s, num_requests)
    gaps_ms[0] = 0.0
    arrivals = np.cumsum(gaps_ms)
    outputs = rng.integers(min_output_tokens, max_output_tokens + 1, num_requests)
    specs: list[RequestSpec] = []
    for i in range(num_requests):
        group, shared = i, int(lengths[i])
        if i > 0 and rng.random() < prefix_hit_share:
            donor = specs[int(rng.integers(0, i))]
            group = donor.prefix_group
            shared = int(min(donor.group_tokens, lengths[i]) * rng.uniform(0.5, 0.9))
        specs.append(
            RequestSpec(
                f"mix-{i:03d}",
                round(float(arrivals[i]), 3),
                int(lengths[i]),
                int(outputs[i]),
                prefix_group=group,
                group_tokens=shared,
            )
        )
    return Workload(f"mixed-s{seed}", seed, tuple(specs))
