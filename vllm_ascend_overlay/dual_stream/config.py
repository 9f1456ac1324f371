"""``additional_config["dual_stream_config"]``: parsing and start-up validation.

Switch: ``vllm serve ... --additional-config '{"dual_stream_config": {"enabled": true}}'``.
Keys and defaults:

- ``enabled`` (False): the feature is off unless asked for.
- ``split_strategy`` ("token_balanced"): where the batch is cut. ``half_batch`` cuts at
  request ``batch_size // 2`` (the seed's simple method); ``token_balanced`` cuts at the
  request boundary whose cumulative token count is closest to half the tokens, which
  keeps the two micro-batches' compute equal when decodes and long prefills are mixed.
- ``balance_threshold`` (1.0): ``token_balanced`` refuses a split whose halves differ by
  more than this fraction of the shorter one, ``|len1 - len2| / min(len1, len2)``. 1.0
  (the larger half at most twice the smaller) is the value of the Qwen3-dense
  implementation the seed describes (vllm-ascend PR #1699, never merged); a lopsided
  split hides little communication and pays the micro-batching overhead in full.
- ``length_threshold`` (128 tokens): both strategies refuse a split that leaves a
  micro-batch shorter than this. Below ~128 tokens the all-reduce of a micro-batch is
  latency-bound and its matmuls lose efficiency, so splitting costs more than it hides
  (128 is again PR #1699's value; upstream's MoE multistream used 256).

Validation runs once in ``AscendConfig.__init__`` (patch 0301) and raises ``ValueError``
naming the key and the fix. Features that replace the row-parallel all-reduce path
(flashcomm1 / sequence parallelism, matmul-allreduce, flashcomm2, fine-grained MLP or
o_proj TP) take the all-reduce away from the point where dual stream moves it to the
communication stream, so they cannot be combined with it; neither can pipeline
parallelism (the dual-stream forward runs the whole layer stack in one stage), MLP
weight prefetch (it advances a per-layer counter once per layer call, and dual stream
calls each layer once per micro-batch), LoRA (its token-to-adapter mapping covers the
whole batch) nor a KV transfer connector (it loads and saves KV once per attention
call). With TP = 1 there is no all-reduce to hide: one warning, and the feature stays
inert.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from vllm_ascend.dual_stream.split import SPLIT_STRATEGIES

logger = logging.getLogger(__name__)

CONFIG_KEY = "dual_stream_config"
DEFAULT_BALANCE_THRESHOLD = 1.0
DEFAULT_LENGTH_THRESHOLD_TOKENS = 128
_warned_tp1 = False


@dataclass(frozen=True)
class DualStreamConfig:
    enabled: bool = False
    split_strategy: str = "token_balanced"
    balance_threshold: float = DEFAULT_BALANCE_THRESHOLD
    length_threshold: int = DEFAULT_LENGTH_THRESHOLD_TOKENS

    @classmethod
    def from_dict(cls, raw: Any) -> DualStreamConfig:
        """Parse and range-check the user's dict; raise ``ValueError`` naming key and fix."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(
                f"{CONFIG_KEY} must be a JSON object such as "
                f'{{"enabled": true, "split_strategy": "token_balanced"}}, got {type(raw).__name__}.'
            )
        known = {"enabled", "split_strategy", "balance_threshold", "length_threshold"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"{CONFIG_KEY}.{unknown[0]} is not a known key. "
                f"Use only {', '.join(sorted(known))} (check the spelling)."
            )
        enabled = raw.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ValueError(f"{CONFIG_KEY}.enabled must be true or false, got {enabled!r}.")
        strategy = raw.get("split_strategy", cls.split_strategy)
        if strategy not in SPLIT_STRATEGIES:
            raise ValueError(
                f"{CONFIG_KEY}.split_strategy {strategy!r} is not a known strategy. "
                f"Use one of {', '.join(repr(s) for s in SPLIT_STRATEGIES)}."
            )
        balance = raw.get("balance_threshold", DEFAULT_BALANCE_THRESHOLD)
        if (
            isinstance(balance, bool)
            or not isinstance(balance, int | float)
            or not math.isfinite(balance)
            or balance <= 0
        ):
            raise ValueError(
                f"{CONFIG_KEY}.balance_threshold must be a finite number > 0 "
                f"(the allowed |len1 - len2| / min(len1, len2)), got {balance!r}. "
                f"Set it to e.g. {DEFAULT_BALANCE_THRESHOLD} or leave it out."
            )
        length = raw.get("length_threshold", DEFAULT_LENGTH_THRESHOLD_TOKENS)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(
                f"{CONFIG_KEY}.length_threshold must be an integer number of tokens >= 1, got {length!r}. "
                f"Set it to e.g. {DEFAULT_LENGTH_THRESHOLD_TOKENS} or leave it out."
            )
        return cls(enabled, strategy, float(balance), length)


_REPLACES_ALL_REDUCE = "it replaces the row-parallel all-reduce that dual stream moves to the communication stream"


def _conflicts(ascend_config: Any) -> list[tuple[str, str, str]]:
    """(setting, why, how to turn it off) for every enabled feature dual stream cannot run with."""
    found = []
    if getattr(ascend_config, "enable_flashcomm1", False):
        found.append(("enable_flashcomm1 (flashcomm1 / sequence parallelism)", _REPLACES_ALL_REDUCE, "set it to false"))
    if getattr(ascend_config, "enable_sp_by_pass", False):
        found.append(("compilation_config.pass_config.enable_sp", _REPLACES_ALL_REDUCE, "turn that pass off"))
    if getattr(ascend_config, "enable_matmul_allreduce", False):
        found.append(("enable_matmul_allreduce", _REPLACES_ALL_REDUCE, "set it to false"))
    if (getattr(ascend_config, "enable_flashcomm2_parallel_size", 0) or 0) > 0:
        found.append(("enable_flashcomm2_parallel_size (flashcomm2)", _REPLACES_ALL_REDUCE, "set it to 0"))
    finegrained = getattr(ascend_config, "finegrained_tp_config", None)
    for key in ("mlp_tensor_parallel_size", "oproj_tensor_parallel_size"):
        if (getattr(finegrained, key, 0) or 0) > 0:
            found.append((f"finegrained_tp_config.{key}", _REPLACES_ALL_REDUCE, "set it to 0"))
    prefetch = getattr(ascend_config, "weight_prefetch_config", None)
    if getattr(prefetch, "enabled", False):
        found.append(
            (
                "weight_prefetch_config.enabled",
                "its MLP prefetch advances a per-layer counter once per layer call, and dual stream calls "
                "each layer once per micro-batch",
                "set it to false",
            )
        )
    return found


def validate_dual_stream_config(ascend_config: Any, vllm_config: Any) -> DualStreamConfig:
    """Parse ``additional_config["dual_stream_config"]`` and check it against the deployment.

    Called at the end of ``AscendConfig.__init__``, when every other feature flag is known.
    """
    additional = getattr(vllm_config, "additional_config", None)
    if not isinstance(additional, dict):  # None, or a stand-in config object in other features' tests
        additional = {}
    config = DualStreamConfig.from_dict(additional.get(CONFIG_KEY))
    if not config.enabled:
        return config
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError(
            f"{CONFIG_KEY}.enabled requires pipeline_parallel_size == 1, got "
            f"{parallel.pipeline_parallel_size}. Set --pipeline-parallel-size 1 or disable {CONFIG_KEY}."
        )
    conflicts = _conflicts(ascend_config)
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        conflicts.append(
            (
                "a KV transfer connector (--kv-transfer-config)",
                "connectors load and save KV once per attention call of a layer, and dual stream calls each "
                "layer's attention once per micro-batch",
                "serve without --kv-transfer-config",
            )
        )
    if getattr(vllm_config, "lora_config", None) is not None:
        conflicts.append(
            (
                "LoRA (--enable-lora)",
                "LoRA layers map tokens to adapters for the whole batch, not per micro-batch",
                "serve without --enable-lora",
            )
        )
    if conflicts:
        setting, why, fix = conflicts[0]
        raise ValueError(
            f"{CONFIG_KEY}.enabled cannot be combined with {setting}: {why}. " f"Either {fix} or disable {CONFIG_KEY}."
        )
    global _warned_tp1
    if parallel.tensor_parallel_size <= 1 and not _warned_tp1:
        _warned_tp1 = True  # AscendConfig is built more than once per process
        logger.warning(
            "%s.enabled is set but tensor_parallel_size is 1: there is no all-reduce to overlap, "
            "dual stream stays inert.",
            CONFIG_KEY,
        )
    return config
