"""Dual stream's worker side on vLLM's CPU engine.

``--worker-extension-cls vllm_ascend_patchset.e2e.ds_worker.DsCpuWorker``.

vLLM imports this module in every worker to resolve the extension, before the model is
loaded. Importing it:

- stubs the NPU-only modules and runs vllm_ascend's ``register_model()`` from the
  assembled tree, the registration vLLM's plugin loader runs on an NPU host: with patch
  0300, ``Qwen3ForCausalLM`` resolves to ``DualStreamQwen3ForCausalLM``;
- hooks ``CPUModelRunner.load_model``: before the load, vllm_ascend's ``AscendConfig`` is
  built from the engine's config (``init_ascend_config``, as the NPU platform does), so
  patch 0301 validates ``dual_stream_config`` and the model reads it from there; after
  the load, the model gets what a CPU needs in place of the NPU's: the CPU attention
  splitter (``ds_metadata``) and a stream backend whose all-reduces are gloo's
  asynchronous ones over the stage's TP group (``dsbench.link``: delivered at once, or
  through an emulated link given by ``$DS_E2E_LINK`` = ``ALPHA_US:BETA_GBPS``);
- hooks ``CPUAttentionMetadataBuilder.build`` (``ds_metadata.install_builder_hook``).

With ``$DS_E2E_REPORT_DIR`` set, every worker writes ``rank<N>.json`` there after each
forward: its stage and TP rank, the model class, the count of dual-stream batches and
every gate decision (tokens, reason, split point), for the smoke to compare across ranks.
Test and bench code: the wheel carries none of it.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from vllm.logger import logger  # the "vllm" logger: vLLM configures it in every process
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from ..dsbench.link import EmulatedLink, EmulatedLinkBackend, LinkSpec, install_on_group
from ..npu_stubs import install_npu_stubs
from .ds_env import LINK_ENV, REPORT_DIR_ENV
from .ds_metadata import CpuAttentionSplitter, install_builder_hook


def register_dual_stream_model() -> None:
    """vllm_ascend's model registration (patch 0300), as its plugin entry point runs it."""
    install_npu_stubs()
    from vllm_ascend.models import register_model

    register_model()


def link_from_env(value: str | None) -> LinkSpec | None:
    """``ALPHA_US:BETA_GBPS`` -> an emulated link (payload left to the emulation); empty: none."""
    if not value:
        return None
    try:
        alpha_us, beta_gbps = (float(x) for x in value.split(":"))
    except ValueError:
        raise ValueError(f"{LINK_ENV}={value!r}: expected ALPHA_US:BETA_GBPS, e.g. 20:0.5") from None
    return LinkSpec(alpha_s=alpha_us * 1e-6, beta=beta_gbps * 1e9, data="token")


class DecisionLog:
    """The gate's decisions of one worker, written to ``rank<N>.json`` after every forward."""

    def __init__(self, model: Any, report_dir: str | None) -> None:
        import torch.distributed as dist
        from vllm.distributed import get_pp_group, get_tp_group

        self.model = model
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.path = Path(report_dir) / f"rank{self.rank}.json" if report_dir else None
        self.record = {
            "rank": self.rank,
            "stage": get_pp_group().rank_in_group,
            "tp_rank": get_tp_group().rank_in_group,
            "model_class": type(model).__name__,
            "dual_stream_on": bool(getattr(model, "dual_stream_active", False)),
            "config": repr(getattr(model, "dual_stream_config", None)),
            "decisions": [],
            "dual_stream_batches": 0,
        }

    def after_forward(self, num_tokens: int) -> None:
        point = self.model.dual_stream_last_point
        self.record["decisions"].append(
            [
                num_tokens,
                self.model.dual_stream_last_reason,
                [point.first_requests, point.first_tokens] if point else None,
            ]
        )
        self.record["dual_stream_batches"] = self.model.dual_stream_batches
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.record))
            tmp.replace(self.path)


def equip(model: Any) -> None:
    """The CPU's splitter and stream backend on our model class; a decision log around its forward."""
    from vllm.distributed import get_tp_group

    if not hasattr(model, "dual_stream_splitter"):
        logger.warning("[DualStream e2e] %s is not the patch set's model class", type(model).__name__)
        return
    group = get_tp_group()
    spec = link_from_env(os.environ.get(LINK_ENV))
    link = EmulatedLink(spec) if spec is not None else EmulatedLink()
    if spec is not None:
        install_on_group(group, link)  # the single-stream all-reduces cross the same emulated link
    model.dual_stream_splitter = CpuAttentionSplitter()
    model.dual_stream_backend = EmulatedLinkBackend(link, group=group.device_group)
    log = DecisionLog(model, os.environ.get(REPORT_DIR_ENV))
    forward = model.forward

    @functools.wraps(forward)
    def logged_forward(input_ids, positions, *args, **kwargs):
        output = forward(input_ids, positions, *args, **kwargs)
        log.after_forward(int(positions.shape[-1]))
        return output

    model.forward = logged_forward
    logger.info(
        "[DualStream e2e] rank %d (stage %d, TP rank %d): %s, dual stream %s, link %s",
        log.rank,
        log.record["stage"],
        log.record["tp_rank"],
        log.record["model_class"],
        "on" if log.record["dual_stream_on"] else "off",
        spec or "gloo as it is",
    )


def _hook_load_model(load_model):
    @functools.wraps(load_model)
    def wrapper(self, *args, **kwargs):
        from vllm_ascend.ascend_config import init_ascend_config

        init_ascend_config(self.vllm_config)  # patch 0301 validates dual_stream_config here
        result = load_model(self, *args, **kwargs)
        equip(self.get_model())
        return result

    wrapper._ds_hooked = True
    return wrapper


def install(runner_cls: type = CPUModelRunner) -> bool:
    """Registration and hooks, once per process; False if already installed."""
    if getattr(runner_cls.load_model, "_ds_hooked", False):
        return False
    register_dual_stream_model()
    install_builder_hook()
    runner_cls.load_model = _hook_load_model(runner_cls.load_model)
    return True


class DsCpuWorker:
    """Worker extension: nothing to call; importing the module installs the worker side."""


install()
