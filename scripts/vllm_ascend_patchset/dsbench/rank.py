"""One TP rank of the dual-stream bench: ``python -m vllm_ascend_patchset.dsbench.rank RANK WORLD PORT PLAN OUT``.

Builds the patch set's ``DualStreamQwen3ForCausalLM`` at TP = WORLD over gloo (vLLM's
real Qwen3 layers; ``PagedSdpaAttention`` for vLLM's attention kernel), one compute
thread, the TP group's all-reduce and the dual-stream backend routed over one
``EmulatedLink``. Then, as PLAN (JSON, written by ``command``) asks:

1. a warm-up forward of every batch both ways, real all-reduces, outputs compared;
2. the reference batch's compute alone (no communication), for each preset's ``beta``
   (``cases.beta_for_share``), and split and merge on their own (``measure_split_merge``);
3. per link preset, the measured gate started as a fresh deployment would start it (its
   probes: the first batches of each size class, timed both ways; what that cost);
4. ``repeats`` rounds, each over every preset (and "compute": no communication at all)
   and every batch, single-stream and each split strategy back to back in a rotating order.

Every timed forward starts on both ranks together (a barrier) and records its wall time,
the time the compute thread was blocked on the link, the emulated wire time and the
messages. Results go to OUT as JSON; ``report`` combines the ranks (the slower one
counts, as in a TP group).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from vllm_ascend_patchset.dsbench import cases as bench_cases  # noqa: E402
from vllm_ascend_patchset.dsbench.link import COMPUTE_ONLY, EmulatedLink, EmulatedLinkBackend, LinkSpec  # noqa: E402

STRATEGIES = ("half_batch", "token_balanced")


class Bench:
    """The model of this rank and the means to time it."""

    def __init__(self, rank: int, world: int, port: int, plan: dict, work: Path):
        import vllm.model_executor.models.qwen3 as vllm_qwen3
        from vllm.config import (
            CompilationConfig,
            CompilationMode,
            DeviceConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.distributed import get_tp_group, init_distributed_environment, initialize_model_parallel
        from vllm_ascend.models.qwen3 import DualStreamQwen3ForCausalLM

        from vllm_ascend_patchset.dsbench.attention import PagedSdpaAttention
        from vllm_ascend_patchset.dsbench.link import install_on_group

        self.rank, self.plan = rank, plan
        self.cases = {c.name: c for c in _plan_cases(plan)}
        model_dir = work / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(bench_cases.MODEL_CONFIG))
        max_len = bench_cases.MODEL_CONFIG["max_position_embeddings"]
        model_config = ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=max_len
        )
        self.vllm_config = VllmConfig(
            model_config=model_config,
            device_config=DeviceConfig(device="cpu"),
            scheduler_config=SchedulerConfig(
                max_model_len=max_len,
                is_encoder_decoder=False,
                max_num_batched_tokens=plan["max_num_batched_tokens"],
            ),
            compilation_config=CompilationConfig(mode=CompilationMode.NONE, custom_ops=["none"]),
        )
        self._set_config = set_current_vllm_config
        with set_current_vllm_config(self.vllm_config):
            init_distributed_environment(
                world_size=world, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=rank,
                backend="gloo",
            )  # fmt: skip
            initialize_model_parallel(tensor_model_parallel_size=world)
            vllm_qwen3.Attention = PagedSdpaAttention
            self.model = DualStreamQwen3ForCausalLM(vllm_config=self.vllm_config).eval()
        _init_weights(self.model)
        self.group = get_tp_group()
        self.link = EmulatedLink()
        install_on_group(self.group, self.link)
        self.model.dual_stream_backend = EmulatedLinkBackend(self.link, self.group.device_group)
        self.attention = [layer.self_attn.attn for layer in self.model.model.layers]
        kv = self.attention[0]
        blocks = 1 + max(_blocks_needed(c.requests) for c in [*self.cases.values(), *_probe_cases(plan)])
        shape = (2, blocks, bench_cases.BLOCK_SIZE, kv.num_kv_heads, kv.head_size)
        for i, attn in enumerate(self.attention):  # arbitrary history: decodes and chunks read it
            attn.kv_cache = torch.randn(shape, generator=torch.Generator().manual_seed(100 + i))
        self.num_blocks = blocks
        self._batches: dict = {}

    def batch(self, case):
        """Metadata, positions and token ids of ``case``, built once."""
        from vllm_ascend_patchset.dsbench.batches import build_batch

        if case.name not in self._batches:
            metadata, positions = build_batch(list(case.requests), bench_cases.BLOCK_SIZE, self.num_blocks, seed=3)
            ids = torch.randint(0, bench_cases.MODEL_CONFIG["vocab_size"], positions.shape,
                                generator=torch.Generator().manual_seed(9))  # fmt: skip
            self._batches[case.name] = (metadata, positions, ids)
        return self._batches[case.name]

    def configure(self, mode: str, **measured) -> None:
        """``single``, ``dual:<strategy>`` (every split the strategy accepts), or ``measured`` (the gate measures)."""
        from vllm_ascend.dual_stream.config import DualStreamConfig

        if mode == "single":
            config = DualStreamConfig()
        elif mode == "measured":
            config = DualStreamConfig(True, "token_balanced", 1.0, None, cache_dir=None, **measured)
        else:
            config = DualStreamConfig(True, mode.split(":")[1], 1.0, 1)
        self.model.dual_stream_config = config
        self.model._dual_stream_on = config.enabled
        self.model.dual_stream_measured = None

    def forward(self, case):
        from vllm.forward_context import set_forward_context

        metadata, positions, ids = self.batch(case)
        names = [a.layer_name for a in self.attention]
        with (
            self._set_config(self.vllm_config),
            set_forward_context(
                {n: metadata for n in names}, self.vllm_config, slot_mapping={n: metadata.slot_mapping for n in names}
            ),
            torch.no_grad(),
        ):
            return self.model(ids, positions)

    def timed(self, case, mode: str) -> dict:
        """One forward of ``case`` in ``mode``, both ranks starting together; its record."""
        self.configure(mode)
        before = self.model.dual_stream_batches
        dist.barrier(group=self.group.cpu_group)
        self.link.reset()
        start = time.perf_counter()
        self.forward(case)
        elapsed = time.perf_counter() - start
        took_dual = self.model.dual_stream_batches > before
        if took_dual != (mode != "single"):
            raise RuntimeError(f"{case.name} {mode}: took dual {took_dual} ({self.model.dual_stream_last_reason})")
        return {"elapsed": elapsed, "blocked": self.link.blocked_s, "blocked_group": self.link.blocked_group_s,
                "wire": self.link.wire_s, "messages": self.link.messages, "bytes": self.link.nbytes}  # fmt: skip

    def agreed_max(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group.cpu_group)
        return float(tensor[0])


def _plan_cases(plan: dict):
    """The batches asked for, and the reference batch (it calibrates the presets) if it is not one of them."""
    names = list(dict.fromkeys([*plan["cases"], plan["reference"]]))
    return [bench_cases.BY_NAME[name] for name in names]


def _reference(plan: dict):
    return bench_cases.BY_NAME[plan["reference"]]


def _probe_cases(plan: dict):
    from vllm_ascend.dual_stream.measured import size_classes

    return [bench_cases.probe_traffic(c) for c in size_classes(plan["max_num_batched_tokens"])]


def _blocks_needed(requests) -> int:
    return sum(-(-(r.history_tokens + r.query_tokens) // bench_cases.BLOCK_SIZE) for r in requests)


def _init_weights(model) -> None:
    for name, param in model.named_parameters():
        generator = torch.Generator().manual_seed(sum(map(ord, name)) * 7919 + param.numel())
        with torch.no_grad():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))


def modes_for(case) -> list[str]:
    """``single`` and one ``dual:<strategy>`` per distinct split point the strategies accept."""
    from vllm_ascend.dual_stream.split import choose_split

    lens = [r.query_tokens for r in case.requests]
    modes, points = ["single"], set()
    for strategy in STRATEGIES:
        point = choose_split(lens, strategy, 1.0, 1)
        if point is not None and point.first_requests not in points:
            points.add(point.first_requests)
            modes.append(f"dual:{strategy}")
    return modes


def measure_split_merge(bench: Bench, case, repeats: int = 20) -> dict:
    """Seconds of the dual-stream forward's own work around the layers, each on its own (median)."""
    from vllm.forward_context import get_forward_context, set_forward_context
    from vllm_ascend.dual_stream.split import choose_split, split_metadata_by_layer, split_tokens
    from vllm_ascend.models.qwen3 import micro_batch_context, split_slot_mapping

    metadata, positions, _ids = bench.batch(case)
    point = choose_split([r.query_tokens for r in case.requests], "token_balanced", 1.0, 1)
    if point is None:
        return {}
    names = [a.layer_name for a in bench.attention]
    hidden = torch.randn(case.tokens, bench_cases.MODEL_CONFIG["hidden_size"])
    times: dict[str, list[float]] = {"split": [], "merge": []}
    with set_forward_context({n: metadata for n in names}, bench.vllm_config,
                             slot_mapping={n: metadata.slot_mapping for n in names}):  # fmt: skip
        ctx = get_forward_context()
        for _ in range(repeats):
            start = time.perf_counter()
            halves = split_metadata_by_layer(ctx.attn_metadata, point)
            slots = split_slot_mapping(ctx.slot_mapping, point)
            split_tokens(positions, point, dim=-1), split_tokens(hidden, point)
            for _layer in names:  # the schedule enters a micro-batch's context once per layer
                for i in range(2):
                    with micro_batch_context(ctx, halves, slots, i):
                        pass
            middle = time.perf_counter()
            parts = [hidden[: point.first_tokens] + 0, hidden[point.first_tokens :] + 0]  # not views, as in a forward
            start_merge = time.perf_counter()
            torch.cat(parts)  # the normalised micro-batches
            end = time.perf_counter()
            times["split"].append(middle - start)
            times["merge"].append(end - start_merge)
    return {k: statistics.median(v) for k, v in times.items()}


def run(bench: Bench, plan: dict) -> dict:
    out: dict = {"rank": bench.rank, "records": [], "gate": {}, "presets": {}, "split_merge": {}}
    timed_cases = [c for c in bench.cases.values() if c.timed and c.name in plan["cases"]]
    out["modes"] = {case.name: modes_for(case) for case in timed_cases}
    reference = _reference(plan)
    bench.link.spec = LinkSpec()
    out["max_rel_diff"] = 0.0
    for case in timed_cases:  # warm-up (allocator, caches, lazy imports), and the outputs compared
        outputs = {}
        for mode in modes_for(case):
            bench.configure(mode)
            before = bench.model.dual_stream_batches
            outputs[mode] = bench.forward(case)
            if (bench.model.dual_stream_batches > before) != (mode != "single"):
                raise RuntimeError(f"{case.name} {mode}: {bench.model.dual_stream_last_reason}")
        scale = float(outputs["single"].abs().max())
        for output in outputs.values():
            diff = float((output - outputs["single"]).abs().max()) / max(scale, 1e-30)
            out["max_rel_diff"] = max(out["max_rel_diff"], diff)
    bench.link.spec = COMPUTE_ONLY
    calibration = [bench.timed(reference, "single")["elapsed"] for _ in range(plan["repeats"])]
    for case in timed_cases:
        out["split_merge"][case.name] = measure_split_merge(bench, case)
    # The host's speed when nothing else slows it (the fastest run): the presets' shares hold then,
    # and a forward slowed by other jobs only lowers its own share of communication.
    reference_compute = bench.agreed_max(min(calibration))
    layers = bench_cases.MODEL_CONFIG["num_hidden_layers"]
    nbytes = reference.tokens * bench_cases.MODEL_CONFIG["hidden_size"] * 4
    specs = {"compute": COMPUTE_ONLY}
    for name in plan["presets"]:
        specs[name] = bench.link.spec = _spec(plan, name, reference_compute, layers, nbytes)
        out["presets"][name] = {"alpha_s": specs[name].alpha_s, "beta": specs[name].beta, "data": specs[name].data}
        out["gate"][name] = start_measured_gate(bench, plan)
    # Rounds over every preset: a spell of other jobs on the host slows one round of all of them
    # alike, rather than the whole of one preset.
    for rep in range(plan["repeats"]):
        for name, spec in specs.items():
            bench.link.spec = spec
            for case in timed_cases:
                for mode in _rotated(modes_for(case), rep):
                    out["records"].append({"preset": name, "case": case.name, "mode": mode, "rep": rep,
                                           **bench.timed(case, mode)})  # fmt: skip
    return out


def _spec(plan: dict, name: str, compute_s: float, layers: int, nbytes: int) -> LinkSpec:
    data = plan["link_data"]
    if name == "custom":
        beta = plan["beta_gbps"] * 1e9 if plan["beta_gbps"] else None
        return LinkSpec(plan["alpha_us"] * 1e-6, beta, data)
    preset = bench_cases.PRESETS[name]
    if preset.share is None:
        return LinkSpec()  # the machine as it is: gloo moves the payload, nothing is emulated
    alpha = plan["alpha_us"] * 1e-6
    messages = bench_cases.messages_per_forward(layers)
    return LinkSpec(alpha, bench_cases.beta_for_share(preset.share, compute_s, messages, nbytes, alpha), data)


def start_measured_gate(bench: Bench, plan: dict) -> dict:
    """The measured gate as a fresh deployment starts it: probe traffic of every size class, in rounds."""
    bench.configure("measured", measure_repeats=plan["gate_repeats"])
    probes = _probe_cases(plan)
    dist.barrier(group=bench.group.cpu_group)
    bench.link.reset()
    start = time.perf_counter()
    for _round in range(plan["gate_repeats"]):
        for case in probes:
            bench.forward(case)
    elapsed = time.perf_counter() - start
    mode = bench.model.dual_stream_measured
    if mode is None or mode.fault:
        return {"error": f"the measured gate did not run: {bench.model.dual_stream_last_reason}"}
    gate = mode.gate
    decisions = {}
    for name in plan["cases"]:
        for strategy in STRATEGIES:
            decisions[f"{name}|{strategy}"] = gate_decision(bench, bench.cases[name], strategy, gate)
    return {
        "crossover": gate.crossover(),
        "finished": gate.finished,
        "describe": gate.describe(),
        "ratios": {c: gate.ratio(c) for c in gate.classes},
        "probes": len(gate.probes),
        "probe_wall_s": elapsed,
        "probe_extra_s": mode.probe_seconds,
        "decisions": decisions,
    }


def gate_decision(bench: Bench, case, strategy: str, gate) -> str:
    """What the deployment's gate does with ``case``: ``dual`` or why single stream (no forward run)."""
    from vllm_ascend.dual_stream.config import DualStreamConfig
    from vllm_ascend.dual_stream.gate import decide

    metadata, _positions, _ids = bench.batch(case)
    config = DualStreamConfig(True, strategy, 1.0, None)
    decision = decide(config, {"l": metadata}, case.tokens, 2, True)
    if decision.point is None:
        return decision.reason
    route = gate.route(min(decision.point.first_tokens, decision.point.second_tokens))
    return "dual" if route == "dual" else "below the measured crossover"


def _rotated(items: list, by: int) -> list:
    by %= len(items)
    return items[by:] + items[:by]


def main(rank: int, world: int, port: int, plan_path: str, out_path: str) -> None:
    torch.set_num_threads(1)
    plan = json.loads(Path(plan_path).read_text())
    result: dict = {"rank": rank, "errors": []}
    try:
        # in the command's folder (OUT's), which the command removes even when this rank is killed
        with tempfile.TemporaryDirectory(prefix=f"rank{rank}-", dir=Path(out_path).parent) as work:
            bench = Bench(rank, world, port, plan, Path(work))
            result.update(run(bench, plan))
    except bench_cases.LinkSettingError as error:  # names the flag: no traceback needed
        result["errors"].append(str(error))
    except Exception:
        result["errors"].append(traceback.format_exc())
    Path(out_path).write_text(json.dumps(result))
    if dist.is_initialized() and not result["errors"]:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
