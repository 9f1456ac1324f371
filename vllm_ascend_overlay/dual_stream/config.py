"""``additional_config["dual_stream_config"]``: parsing and start-up validation.

Switch: ``vllm serve ... --additional-config '{"dual_stream_config": {"enabled": true}}'``.
Each key's default, range and meaning is declared once, in ``DualStreamConfig``'s fields
(``config_table.setting``), and the user documentation's table of them is generated from
these declarations.

``length_threshold`` set: the gate trusts it. Unset (the default): the gate measures where
dual stream pays on this deployment (``measured``) and caches what it measured under
``cache_dir``.

Validation runs once, last in ``AscendConfig.__init__``, and raises ``ValueError``
naming the key and the fix. Features that replace the row-parallel all-reduce path
(flashcomm1 / sequence parallelism, matmul-allreduce, flashcomm2, fine-grained MLP or
o_proj TP) take the all-reduce away from the point where dual stream moves it to the
communication stream, so they cannot be combined with it; neither can vLLM's own
micro-batching (dual-batch overlap cuts the batch itself and hands the model a list of
metadata), MLP weight prefetch (it advances a per-layer counter once per layer call, and dual stream
calls each layer once per micro-batch), LoRA (its token-to-adapter mapping covers the
whole batch) nor a KV transfer connector (it loads and saves KV once per attention
call). With TP = 1 there is no all-reduce to hide: one warning, and the feature stays
inert.

Pipeline parallelism is allowed: each stage runs its own layers dual-stream (the first
embeds, a later one cuts the hidden states and residual it receives, the last joins and
normalises) and decides on its own batch, the same on every TP rank of the stage. It
combines with CPP (``profiling_chunk_config``), which sizes the chunks every stage runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from vllm.logger import init_logger
from vllm_ascend.config_table import (
    check_section_name,
    folder_path,
    parse_section,
    problem,
    raise_problems,
    refuse,
    setting,
    unwritable_part,
)
from vllm_ascend.dual_stream.measured import MEASURE_FLOOR
from vllm_ascend.dual_stream.split import SPLIT_STRATEGIES

logger = init_logger(__name__)

CONFIG_KEY = "dual_stream_config"
_warned_tp1 = False
_warned_graph = False
_warned_model = False
DUAL_STREAM_ARCHITECTURE = "Qwen3ForCausalLM"  # the architecture patch 0300 maps to models/qwen3.py


DEFAULT_CACHE_DIR = "~/.cache/vllm_ascend/dual_stream"


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
    length_threshold: int | None = setting(
        None,
        "both strategies refuse a split that leaves a micro-batch shorter than this many tokens; null: measured "
        "on this deployment (the measured gate)",
        kind=int,
        low=1,
        nullable=True,
    )
    measure_repeats: int = setting(
        3,
        "measured gate: probes (one batch timed single- and dual-stream) per size class before it decides",
        low=1,
        high=16,
    )
    cache_dir: str | None = setting(
        DEFAULT_CACHE_DIR,
        "where the measured gate keeps its probes across restarts; `~` is expanded and a relative path is "
        'taken from the working directory at start-up; `""` or null keeps none',
        nullable=True,
        folder=True,
    )

    @classmethod
    def from_dict(cls, raw: Any) -> DualStreamConfig:
        """Parse and range-check the user's dict; raise ``ValueError`` naming key and fix."""
        return parse_section(cls, raw, key=CONFIG_KEY)

    @property
    def measured(self) -> bool:
        """The gate measures where dual stream pays, instead of trusting a set ``length_threshold``."""
        return self.length_threshold is None

    @property
    def cache_path(self) -> str | None:
        """The cache folder with ``~`` expanded, or None when caching is off."""
        return os.path.expanduser(self.cache_dir) if self.cache_dir else None


_REPLACES_ALL_REDUCE = "it replaces the row-parallel all-reduce that dual stream moves to the communication stream"
_PER_LAYER_CALL = "dual stream calls each layer once per micro-batch"

# (flag of AscendConfig, its setting as the user knows it, why it conflicts, how to turn it off).
# Each flag must exist in the pinned AscendConfig: a renamed or removed one stops start-up
# (``_read_flag``) instead of passing the check silently.
ASCEND_CONFLICTS = (
    (
        "enable_flashcomm1",
        "enable_flashcomm1 or VLLM_ASCEND_ENABLE_FLASHCOMM1 (flashcomm1 / sequence parallelism)",
        _REPLACES_ALL_REDUCE,
        "set it to false",
    ),
    ("enable_sp_by_pass", "compilation_config.pass_config.enable_sp", _REPLACES_ALL_REDUCE, "turn that pass off"),
    (
        "enable_matmul_allreduce",
        "enable_matmul_allreduce or VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE",
        _REPLACES_ALL_REDUCE,
        "set it to false",
    ),
    (
        "enable_flashcomm2_parallel_size",
        "enable_flashcomm2_parallel_size or VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE (flashcomm2)",
        _REPLACES_ALL_REDUCE,
        "set it to 0",
    ),
    (
        "finegrained_tp_config.mlp_tensor_parallel_size",
        "finegrained_tp_config.mlp_tensor_parallel_size",
        _REPLACES_ALL_REDUCE,
        "set it to 0",
    ),
    (
        "finegrained_tp_config.oproj_tensor_parallel_size",
        "finegrained_tp_config.oproj_tensor_parallel_size",
        _REPLACES_ALL_REDUCE,
        "set it to 0",
    ),
    (
        "weight_prefetch_config.enabled",
        "weight_prefetch_config.enabled",
        f"its MLP prefetch advances a per-layer counter once per layer call, and {_PER_LAYER_CALL}",
        "set it to false",
    ),
)
# The same for VllmConfig: the setting is on when the attribute is not None.
VLLM_CONFLICTS = (
    (
        "kv_transfer_config",
        "a KV transfer connector (--kv-transfer-config)",
        f"connectors load and save KV once per attention call of a layer, and {_PER_LAYER_CALL}",
        "serve without --kv-transfer-config",
    ),
    (
        "lora_config",
        "LoRA (--enable-lora)",
        "LoRA layers map tokens to adapters for the whole batch, not per micro-batch",
        "serve without --enable-lora",
    ),
)
_MISSING = object()


def budget_problems(length_threshold: int | None, budget: int) -> list[str]:
    """Why a batch budget of ``budget`` tokens (--max-num-batched-tokens) would never see a batch split, if it
    would: a sentence each, for ``length_threshold`` given or measured (None). Pure: the serving scripts ask it too."""
    if length_threshold is not None and 2 * length_threshold > budget:
        return [
            f"must be <= {budget // 2}, half of --max-num-batched-tokens ({budget}): both micro-batches need this "
            "many tokens and a batch holds at most --max-num-batched-tokens, so no batch would ever be split. "
            "Lower it or raise --max-num-batched-tokens"
        ]
    if length_threshold is None and budget // 2 < MEASURE_FLOOR:
        return [
            f"measuring starts at {MEASURE_FLOOR} tokens per micro-batch, but --max-num-batched-tokens ({budget}) "
            f"leaves at most {budget // 2}, so no batch would ever be split. Set length_threshold to at most "
            f"{max(1, budget // 2)} or raise --max-num-batched-tokens to at least {2 * MEASURE_FLOOR}"
        ]
    return []


def _read_flag(config: Any, path: str) -> Any:
    """``config.<path>``; an error naming the flag when the pinned release has no such attribute."""
    value = config
    for name in path.split("."):
        value = getattr(value, name, _MISSING)
        if value is _MISSING:
            raise RuntimeError(
                f"{CONFIG_KEY}: {type(config).__name__} has no {path}, a setting dual stream cannot run with; "
                "this vllm-ascend release renamed or removed it. Update the conflict list in "
                "vllm_ascend/dual_stream/config.py for this release, or disable dual_stream_config."
            )
    return value


def _conflicts(ascend_config: Any, vllm_config: Any) -> list[str]:
    """One line per enabled feature dual stream cannot run with."""
    found = [
        (setting, why, fix)
        for path, setting, why, fix in ASCEND_CONFLICTS
        if _read_flag(ascend_config, path)  # a size of 0 is off, like false
    ]
    found += [
        (setting, why, fix) for path, setting, why, fix in VLLM_CONFLICTS if _read_flag(vllm_config, path) is not None
    ]
    return [
        f"{CONFIG_KEY}.enabled cannot be combined with {setting}: {why}. Either {fix} or disable {CONFIG_KEY}."
        for setting, why, fix in found
    ]


def validate_dual_stream_config(ascend_config: Any, vllm_config: Any) -> DualStreamConfig:
    """Parse ``additional_config["dual_stream_config"]`` and check it against the deployment.

    Called at the end of ``AscendConfig.__init__``, when every other feature flag is known.
    Every problem is reported at once; refused while the engine builds its AscendConfig, dual
    stream is off (the defaults) until the build ends and raises its problems with every other
    section's (``config_table.refuse``).
    """
    try:
        return _validated(ascend_config, vllm_config)
    except ValueError as error:
        refuse(error)
        return DualStreamConfig()


def _validated(ascend_config: Any, vllm_config: Any) -> DualStreamConfig:
    additional = getattr(vllm_config, "additional_config", None)
    if not isinstance(additional, dict):  # None, or a stand-in config object in other features' tests
        additional = {}
    check_section_name(additional, CONFIG_KEY)
    config = DualStreamConfig.from_dict(additional.get(CONFIG_KEY))
    if not config.enabled:
        return config
    problems = []
    if config.measured and config.cache_dir == DEFAULT_CACHE_DIR:  # a given folder is resolved when parsed
        folder, fault = folder_path(DEFAULT_CACHE_DIR, writable=False)
        if fault:
            problems.append(
                problem(CONFIG_KEY, "cache_dir", DEFAULT_CACHE_DIR, f'(the default) {fault}, or "" for none')
            )
        elif unwritable_part(folder):  # (a read-only HOME in a container: measured again at every start)
            logger.warning(
                '[DualStream] %s.cache_dir: the default %s is not writable here, so no probe is kept and every '
                'start measures again; set cache_dir to a folder the server can write (or "" to say so)',
                CONFIG_KEY, folder,
            )  # fmt: skip
            config = replace(config, cache_dir="")
    parallel = vllm_config.parallel_config
    if _read_flag(parallel, "enable_dbo") or _read_flag(parallel, "ubatch_size") > 1:
        problems.append(
            f"{CONFIG_KEY}.enabled cannot be combined with vLLM's micro-batching (--enable-dbo or "
            "parallel_config.ubatch_size > 1): it cuts every batch into micro-batches of its own, and the "
            f"model then receives one metadata per micro-batch. Either serve without it or disable {CONFIG_KEY}."
        )
    budget = vllm_config.scheduler_config.max_num_batched_tokens
    problems += [problem(CONFIG_KEY, "length_threshold", config.length_threshold, why)
                 for why in budget_problems(config.length_threshold, budget)]  # fmt: skip
    problems += _conflicts(ascend_config, vllm_config)
    raise_problems(CONFIG_KEY, problems)
    global _warned_tp1
    if parallel.tensor_parallel_size <= 1 and not _warned_tp1:
        _warned_tp1 = True  # AscendConfig is built more than once per process
        logger.warning(
            "[DualStream] %s.enabled is set but tensor_parallel_size is 1: there is no all-reduce to overlap, "
            "dual stream stays inert.",
            CONFIG_KEY,
        )
    global _warned_graph, _warned_model
    model_config = getattr(vllm_config, "model_config", None)
    architectures = list(getattr(model_config, "architectures", None) or [])  # (as vLLM resolved them)
    if architectures and DUAL_STREAM_ARCHITECTURE not in architectures and not _warned_model:
        _warned_model = True
        logger.warning(
            "[DualStream] %s.enabled is set but the model is %s: dual stream runs %s (Qwen3 dense) only, "
            "so it stays inert.",
            CONFIG_KEY, ", ".join(map(str, architectures)), DUAL_STREAM_ARCHITECTURE,
        )  # fmt: skip
    if getattr(model_config, "enforce_eager", None) is False and not _warned_graph:
        _warned_graph = True
        logger.warning(
            "[DualStream] %s.enabled is set without --enforce-eager: the model then runs as a compiled or "
            "captured graph, where batches are not split, so every batch runs on one stream. Serve with "
            "--enforce-eager to overlap the all-reduces.",
            CONFIG_KEY,
        )
    return config
