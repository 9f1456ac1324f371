"""One TP rank of the CPU numerical test: ``python -m dual_stream.tp_worker RANK WORLD PORT MODEL_DIR OUT``.

Builds the patch set's ``DualStreamQwen3ForCausalLM`` (vLLM's real Qwen3 layers: norms,
QKV / o_proj / gate_up / down_proj tensor-parallel linears, rotary embedding, MLP) at
TP = WORLD over gloo, with vLLM's attention kernel replaced by ``ReferenceAttention``: a
CPU attention that reads only the metadata contract (cumulative query lengths, sequence
lengths, block tables, slot mapping) to write and read a paged KV cache, and asserts that
the metadata it is given is a self-consistent batch.

Each scenario runs one batch single-stream (the upstream forward) and dual-stream, from
the same KV cache, and reports the largest differences of output and cache. Results go
to OUT as JSON; the pytest side (test_tp_equivalence.py) asserts on them.

Then the measured gate's scenarios (measured_scenarios.py). Last, rank 0 alone faults in
the middle of a dual-stream forward (``one_rank_fault``): the fault must surface on rank
0 and both processes must end. That result goes to
OUT.fault.json, and the process exits without tearing the group down (a peer may be
stuck in a collective, as in a real job).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dual_stream.rank_model import (  # noqa: E402
    BLOCK_SIZE,
    NUM_BLOCKS,
    batch_context,
    build_rank_model,
    init_weights,
)


def scenarios():
    from dual_stream.batches import FakeAttentionState, Request

    mixed = [Request(7, 1), Request(12, 1), Request(16, 9), Request(0, 13), Request(3, 6), Request(20, 11)]
    fresh = [Request(0, 10), Request(0, 3), Request(0, 12), Request(0, 7)]
    decodes = [Request(5, 1), Request(9, 1), Request(2, 1)]
    return {
        "mixed_with_history": (mixed, None),
        "all_fresh_prefill": (fresh, None),
        "decode_only": (decodes, FakeAttentionState.DecodeOnly),
    }


def main(rank: int, world: int, port: int, model_dir: str, out_path: str) -> None:
    torch.set_num_threads(1)
    started = time.monotonic()
    results: dict = {"rank": rank, "runs": [], "errors": []}
    fault_phase = None
    try:
        import vllm.model_executor.models.qwen3 as vllm_qwen3
        from vllm.config import set_current_vllm_config
        from vllm.distributed import get_tp_group
        from vllm_ascend.dual_stream import schedule
        from vllm_ascend.dual_stream.config import DualStreamConfig

        from dual_stream.batches import build_batch
        from dual_stream.cpu_backends import DeferredAllReduceBackend, GlooAsyncBackend, SequentialBackend

        results["setup_s"] = time.monotonic() - started
        model, vllm_config = build_rank_model(rank, world, port, model_dir, tp=world)
        model_config = vllm_config.model_config
        init_weights(model)
        group = get_tp_group()
        attention = [layer.self_attn.attn for layer in model.model.layers]
        kv_shape = (2, NUM_BLOCKS, BLOCK_SIZE, attention[0].num_kv_heads, attention[0].head_size)
        history = [torch.randn(kv_shape, generator=torch.Generator().manual_seed(100 + i)) for i in range(2)]
        vocab = model.config.vocab_size

        def forward(target, requests, state, mutate=""):
            """``target``'s forward of one batch from the shared KV history; output and caches."""
            metadata, positions = build_batch(requests, BLOCK_SIZE, NUM_BLOCKS, seed=3, state=state)
            input_ids = torch.randint(0, vocab, (positions.shape[0],), generator=torch.Generator().manual_seed(9))
            layers = [layer.self_attn.attn for layer in target.model.layers]
            for attn, cache in zip(layers, history, strict=True):
                attn.kv_cache = cache.clone()
            patch = contextlib.nullcontext()
            if mutate:  # the name of the schedule's wait to remove
                patch = _patched(schedule, mutate, lambda *a, **k: None)
            with batch_context(vllm_config, layers, metadata), patch:
                out = target(input_ids, positions)
            return out, [a.kv_cache.clone() for a in layers]

        def run(requests, state, config, backend, mutate="", keep_switch=False):
            model.dual_stream_config = config
            if not keep_switch:  # else the model's own on/off state (after a fall back) decides
                model._dual_stream_on = config.enabled
            model.dual_stream_backend = backend
            before = model.dual_stream_batches
            out, caches = forward(model, requests, state, mutate)
            return out, caches, model.dual_stream_batches > before

        backends = {
            "sequential": lambda: SequentialBackend(group.all_reduce),
            "gloo_async": lambda: GlooAsyncBackend(group.device_group),
            "deferred": lambda: DeferredAllReduceBackend(group.device_group),
        }
        for name, (requests, state) in scenarios().items():
            ref_out, ref_cache, ref_dual = run(requests, state, DualStreamConfig(), None)
            cases = [
                (strategy, backend, "", DualStreamConfig(True, strategy, 1.0, 2))
                for strategy in ("half_batch", "token_balanced")
                for backend in backends
            ]
            cases.append(("token_balanced", "sequential", "", DualStreamConfig(True, "token_balanced", 1.0, 40)))
            for mutation in ("wait_for_previous_layer", "wait_for_attention_reduce"):
                cases.append(("half_batch", "deferred", mutation, DualStreamConfig(True, "half_batch", 1.0, 2)))
            for strategy, backend_name, mutate, config in cases:
                out, cache, took_dual = run(requests, state, config, backends[backend_name](), mutate)
                results["runs"].append(
                    {
                        "scenario": name,
                        "strategy": strategy,
                        "backend": backend_name,
                        "length_threshold": config.length_threshold,
                        "mutated": mutate,
                        "reference_took_dual": ref_dual,
                        "took_dual": took_dual,
                        "reason": model.dual_stream_last_reason,
                        "max_out_diff": float((out - ref_out).abs().max()),
                        "max_cache_diff": _max_diff(cache, ref_cache),
                        "out_scale": float(ref_out.abs().max()),
                        "reduce_results_restored": all(
                            layer.self_attn.o_proj.reduce_results and layer.mlp.down_proj.reduce_results
                            for layer in model.model.layers
                        ),
                    }
                )
        with set_current_vllm_config(vllm_config):
            upstream = vllm_qwen3.Qwen3ForCausalLM(vllm_config=vllm_config).eval()
        init_weights(upstream)
        results["feature_off"] = feature_off_is_vllms_forward(model, upstream, forward, run)
        results["fault"] = decision_fault_falls_back(model, run, scenarios()["mixed_with_history"])
        results["cut_fault"] = decision_fault_falls_back(model, run, scenarios()["mixed_with_history"], "cut")
        from dual_stream import measured_scenarios

        cache_dir = Path(out_path).parent / "dual-stream-cache"
        results["measured"] = measured_scenarios.run_all(model, run, rank, group, cache_dir, _capture_warnings)
        if rank == 0:
            results["registered"] = registered_qwen3()
            results["ascend_config"] = ascend_config_hook_cases(model_config)
        fault_phase = functools.partial(one_rank_fault, model, run, scenarios()["mixed_with_history"], rank, group)
    except Exception:
        results["errors"].append(traceback.format_exc())
    results["total_s"] = time.monotonic() - started
    _write(out_path, results)
    if fault_phase is None:
        if dist.is_initialized():
            dist.destroy_process_group()
        return
    _write(out_path + ".fault.json", fault_phase())


def _write(path: str, results: dict) -> None:
    with open(path, "w") as f:
        json.dump(results, f)


def _capture_warnings(module):
    import logging

    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Capture(level=logging.WARNING)
    module.logger.addHandler(handler)
    return records, lambda: module.logger.removeHandler(handler)


def feature_off_is_vllms_forward(model, upstream, forward, run):
    """Our class with the feature off against vLLM's Qwen3ForCausalLM, same weights, same batches."""
    from vllm_ascend.dual_stream.config import DualStreamConfig

    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in upstream.named_parameters()}
    cases = []
    for name, (requests, state) in scenarios().items():
        expected, expected_cache = forward(upstream, requests, state)
        out, cache, took_dual = run(requests, state, DualStreamConfig(), None)
        cases.append(
            {
                "scenario": name,
                "took_dual": took_dual,
                "equal": bool(torch.equal(out, expected)),
                "caches_equal": all(torch.equal(c, e) for c, e in zip(cache, expected_cache, strict=True)),
            }
        )
    return {"same_parameters": ours == theirs, "num_parameters": len(ours), "cases": cases}


def decision_fault_falls_back(model, run, scenario, where="decision"):
    """A fault in the gate's decision, or in cutting the batch's metadata in two (on every rank, as
    their inputs are the same everywhere): the upstream forward of the same batch, one warning, then
    the feature is off."""
    from vllm_ascend.dual_stream import gate
    from vllm_ascend.dual_stream.config import DualStreamConfig
    from vllm_ascend.models import qwen3 as ours

    from dual_stream.cpu_backends import GlooAsyncBackend

    def broken(*args, **kwargs):
        raise RuntimeError(f"injected fault in the split {where}")

    requests, state = scenario
    reference, ref_cache, _ = run(requests, state, DualStreamConfig(), None)
    config = DualStreamConfig(True, "half_batch", 1.0, 2)
    warnings, detach = _capture_warnings(ours)
    if where == "decision":
        target = _patched(gate, "choose_split", broken)
    else:  # the splitter's cut of the attention metadata (after the decision, before any collective)
        target = _patched(model.dual_stream_splitter, "split", broken)
    try:
        model._dual_stream_on = True
        with target:
            out, cache, took_dual = run(requests, state, config, GlooAsyncBackend(None), keep_switch=True)
        still_on = model._dual_stream_on
        again, _, took_dual_again = run(requests, state, config, GlooAsyncBackend(None), keep_switch=True)
    finally:
        detach()
    return {
        "took_dual": took_dual,
        "took_dual_again": took_dual_again,
        "still_on": still_on,
        "warnings": warnings,
        "max_out_diff": float((out - reference).abs().max()),
        "max_cache_diff": _max_diff(cache, ref_cache),
        "max_out_diff_after": float((again - reference).abs().max()),
    }


class FaultOnRankZero:
    """Wraps a backend; on rank 0 the 5th all-reduce raises: layer 0's four have run, on both ranks."""

    FAULT_AT_CALL = 5  # 2 micro-batches x (attention + MLP) = 4 all-reduces per layer

    def __init__(self, inner, rank):
        self.inner, self.rank, self.calls = inner, rank, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def all_reduce(self, partial):
        self.calls += 1
        if self.rank == 0 and self.calls == self.FAULT_AT_CALL:
            raise RuntimeError("injected device fault on rank 0")
        return self.inner.all_reduce(partial)


def one_rank_fault(model, run, scenario, rank, group):
    """Rank 0 faults after collectives were issued; rank 1 runs on. Neither may fall back."""
    from vllm_ascend.dual_stream.config import DualStreamConfig
    from vllm_ascend.models import qwen3 as ours

    from dual_stream.cpu_backends import GlooAsyncBackend

    requests, state = scenario
    backend = FaultOnRankZero(GlooAsyncBackend(group.device_group), rank)
    warnings, detach = _capture_warnings(ours)
    result = {"rank": rank, "raised": None, "returned": False}
    started = time.monotonic()
    try:
        run(requests, state, DualStreamConfig(True, "half_batch", 1.0, 2), backend)
        result["returned"] = True
    except Exception as exc:  # what the engine would see
        result["raised"] = f"{type(exc).__name__}: {exc}"
    finally:
        detach()
    result.update(
        warnings=warnings,
        all_reduce_calls=backend.calls,
        still_on=model._dual_stream_on,
        seconds=time.monotonic() - started,
    )
    return result


def registered_qwen3():
    """vllm-ascend's register_model (patched by 0300): what Qwen3ForCausalLM resolves to."""
    from vllm import ModelRegistry
    from vllm_ascend.models import register_model

    register_model()
    entry = ModelRegistry.models["Qwen3ForCausalLM"]
    cls = ModelRegistry._try_load_model_cls("Qwen3ForCausalLM")
    return {"module": entry.module_name, "class": entry.class_name, "loaded": f"{cls.__module__}.{cls.__name__}"}


def ascend_config_hook_cases(model_config):
    """AscendConfig.__init__ (patched by 0301) runs the dual-stream validation."""
    import importlib.machinery

    import npu_stubs

    npu_stubs.install()
    for name in npu_stubs.STUBBED:  # transformers asks importlib for torch_npu's spec
        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is None:
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    from vllm.config import CompilationConfig, CompilationMode, DeviceConfig, ParallelConfig, VllmConfig
    from vllm_ascend.ascend_config import AscendConfig

    cases = {
        "enabled": {"dual_stream_config": {"enabled": True, "split_strategy": "half_batch"}},
        "bad_strategy": {"dual_stream_config": {"enabled": True, "split_strategy": "random"}},
        "flashcomm1": {"enable_flashcomm1": True, "dual_stream_config": {"enabled": True}},
        "matmul_allreduce": {"enable_matmul_allreduce": True, "dual_stream_config": {"enabled": True}},
        "flashcomm2": {"enable_flashcomm2_parallel_size": 1, "dual_stream_config": {"enabled": True}},
        "weight_prefetch": {"weight_prefetch_config": {"enabled": True}, "dual_stream_config": {"enabled": True}},
        "absent": {},
    }
    outcomes = {}
    for name, additional in cases.items():
        vllm_config = VllmConfig(
            model_config=model_config,
            device_config=DeviceConfig(device="cpu"),
            parallel_config=ParallelConfig(tensor_parallel_size=2),
            compilation_config=CompilationConfig(mode=CompilationMode.NONE, custom_ops=["none"]),
            additional_config={**additional, "refresh": True},
        )
        try:
            config = AscendConfig(vllm_config).dual_stream_config
            outcomes[name] = {"ok": repr(config)}
        except Exception as exc:  # the message is what the test checks
            outcomes[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return outcomes


def _max_diff(caches, references) -> float:
    return max(float((c - r).abs().max()) for c, r in zip(caches, references, strict=True))


@contextlib.contextmanager
def _patched(module, name, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
