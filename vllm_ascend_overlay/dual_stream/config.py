"""``additional_config["dual_stream_config"]``: parsing and start-up validation.

Switch: ``vllm serve ... --additional-config '{"dual_stream_config": {"enabled": true}}'``.
Each key's default, range and meaning is declared once, in ``DualStreamConfig``'s fields
(``config_table.setting``); docs/dual-stream.md's table is tested against them, and says
why the defaults are what they are.

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
from dataclasses import dataclass
from typing import Any

from vllm_ascend.config_table import parse_section, setting
from vllm_ascend.dual_stream.split import SPLIT_STRATEGIES

logger = logging.getLogger(__name__)

CONFIG_KEY = "dual_stream_config"
_warned_tp1 = False


@dataclass(frozen=True)
class DualStreamConfig:
    enabled: bool = setting(False, "dual stream on or off")
    split_strategy: str = setting(
        "token_balanced",
        "where the batch is cut: `token_balanced`, at the request boundary whose cumulative token count is "
        "closest to half; `half_batch`, at request `batch_size // 2`",
        choices=SPLIT_STRATEGIES,
    )
    balance_threshold: float = setting(
        1.0,
        "`token_balanced` refuses a split with `abs(len1 - len2) / min(len1, len2)` above this",
        low=0,
        low_open=True,
    )
    length_threshold: int = setting(
        128, "both strategies refuse a split that leaves a micro-batch shorter than this many tokens", low=1
    )

    @classmethod
    def from_dict(cls, raw: Any) -> DualStreamConfig:
        """Parse and range-check the user's dict; raise ``ValueError`` naming key and fix."""
        return parse_section(cls, raw, key=CONFIG_KEY)


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
