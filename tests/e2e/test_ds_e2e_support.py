"""Dual stream's e2e support code without the engine: the CPU attention splitter, the smoke's
commands and its checks of the workers' reports. The engine runs in ``make e2e`` (docs/e2e.md)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from cpp_engine import helpers  # noqa: F401  (imports vLLM with the NPU stubs set aside)
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend.dual_stream.gate import decide
from vllm_ascend_patchset.e2e import ds_metadata, ds_smoke


class RecordingBuilder:
    """Stands in for CPUAttentionMetadataBuilder: 'builds' by keeping the common metadata it got."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        return SimpleNamespace(common=common_attn_metadata)


def _common(query_lens, history):
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([q + h for q, h in zip(query_lens, history, strict=True)], dtype=torch.int32)
    tokens = int(starts[-1])
    return CommonAttentionMetadata(
        query_start_loc=starts.clone(), query_start_loc_cpu=starts, seq_lens=seq_lens, num_reqs=len(query_lens),
        num_actual_tokens=tokens, max_query_len=max(query_lens), max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.arange(len(query_lens) * 4, dtype=torch.int32).view(len(query_lens), 4),
        slot_mapping=torch.arange(tokens), seq_lens_cpu_upper_bound=seq_lens, _seq_lens_cpu=seq_lens,
    )  # fmt: skip


def _built(query_lens, history):
    ds_metadata.install_builder_hook(RecordingBuilder)
    metadata = RecordingBuilder().build(0, _common(query_lens, history))
    return {"model.layers.0.self_attn.attn": metadata, "model.layers.1.self_attn.attn": metadata}


ON = DualStreamConfig(True, "token_balanced", 1.0, 8)
SPLITTER = ds_metadata.CpuAttentionSplitter()


def test_the_gate_splits_a_cpu_batch_at_a_request_boundary_and_each_half_is_built_anew():
    by_layer = _built([1, 1, 30, 20, 12], [9, 4, 0, 5, 0])
    decision = decide(ON, by_layer, 64, tp_world_size=2, eager=True, splitter=SPLITTER)
    assert decision.reason == "split" and (decision.point.first_requests, decision.point.first_tokens) == (3, 32)
    first, second = SPLITTER.split(by_layer, decision.point)
    assert first["model.layers.0.self_attn.attn"] is first["model.layers.1.self_attn.attn"]
    a, b = first["model.layers.0.self_attn.attn"].common, second["model.layers.0.self_attn.attn"].common
    assert a.query_start_loc_cpu.tolist() == [0, 1, 2, 32] and b.query_start_loc_cpu.tolist() == [0, 20, 32]
    assert a.seq_lens.tolist() == [10, 5, 30] and b.seq_lens.tolist() == [25, 12]
    assert b.slot_mapping.tolist() == list(range(32, 64)) and b.block_table_tensor[0, 0] == 12
    assert (a.num_actual_tokens, b.num_actual_tokens) == (32, 32)


@pytest.mark.parametrize(
    "query_lens, tokens, reason",
    [
        ([1, 1, 1, 1], 4, "DecodeOnly batch"),
        ([40], 40, "fewer than two requests"),
        ([20, 20], 48, "padded batch"),
    ],
)
def test_cpu_batches_the_splitter_refuses(query_lens, tokens, reason):
    decision = decide(ON, _built(query_lens, [0] * len(query_lens)), tokens, 2, True, splitter=SPLITTER)
    assert decision.point is None and decision.reason == reason


def test_metadata_the_builder_hook_did_not_see_is_refused():
    foreign = {"l0": SimpleNamespace(query_start_loc=torch.tensor([0, 20, 40]))}
    assert SPLITTER.query_lens(foreign, 40) == "SimpleNamespace was not built by the CPU attention builder"


def test_the_builder_hook_is_installed_once():
    class Builder:
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            return SimpleNamespace()

    assert ds_metadata.install_builder_hook(Builder) and not ds_metadata.install_builder_hook(Builder)


def _flag(command, name):
    return command[command.index(name) + 1]


def test_smoke_servers_bind_loopback_and_carry_both_features_only_when_asked(tmp_path):
    ds_only = ds_smoke.serve_command(tmp_path, 1234, 2, 1, True, None, tmp_path / "c")
    both = ds_smoke.serve_command(tmp_path, 1235, 2, 2, True, ds_smoke.CPP_SMOKE, tmp_path / "c")
    off = ds_smoke.serve_command(tmp_path, 1236, 2, 2, False, None, tmp_path / "c")
    for command in (ds_only, both, off):
        assert _flag(command, "--host") == "127.0.0.1" and _flag(command, "--tensor-parallel-size") == "2"
    assert _flag(ds_only, "--cpp") == "none" and "--scheduler-cls" not in ds_only
    assert _flag(ds_only, "--worker-extension-cls") == ds_smoke.DS_WORKER
    assert _flag(both, "--cpp") == "ours" and _flag(both, "--worker-extension-cls") == ds_smoke.DS_CPP_WORKER
    config = json.loads(_flag(both, "--additional-config"))
    assert config["dual_stream_config"]["enabled"] and config["profiling_chunk_config"]["enabled"]
    ds_config = json.loads(_flag(ds_only, "--additional-config"))["dual_stream_config"]
    assert ds_config["length_threshold"] == ds_smoke.LENGTH_THRESHOLD and "split_strategy" not in ds_config
    # With CPP the batches follow a profile of the host: any batch of two or more requests splits.
    assert config["dual_stream_config"]["split_strategy"] == "half_batch"
    assert config["dual_stream_config"]["length_threshold"] == 1
    assert not json.loads(_flag(off, "--additional-config"))["dual_stream_config"]["enabled"]
    assert "profiling_chunk_config" not in json.loads(_flag(off, "--additional-config"))
    assert ds_smoke.server_env(4, tmp_path)["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|0|1"


def _report(rank, stage, tp_rank, batches, decisions=None):
    decisions = decisions if decisions is not None else [[512, "split", [2, 181]], [6, "DecodeOnly batch", None]]
    return {"rank": rank, "stage": stage, "tp_rank": tp_rank, "model_class": ds_smoke.MODEL_CLASS,
            "dual_stream_batches": batches, "decisions": decisions}  # fmt: skip


def test_report_checks_pass_a_good_run_and_name_each_problem():
    good = [_report(0, 0, 0, 1), _report(1, 0, 1, 1), _report(2, 1, 0, 1), _report(3, 1, 1, 1)]
    assert ds_smoke.check_reports(good, 4, dual_stream=True) == []
    assert ds_smoke.check_reports(good[:3], 4, True) == ["3 of 4 ranks wrote a report"]
    idle = [*good[:3], _report(3, 1, 1, 0)]
    assert ds_smoke.check_reports(idle, 4, True) == [
        "rank 3 (stage 1, TP rank 1): no dual-stream batch; reasons ['DecodeOnly batch', 'split']"
    ]
    differ = [*good[:3], _report(3, 1, 1, 1, [[512, "split", [3, 300]]])]
    assert ds_smoke.check_reports(differ, 4, True) == ["stage 1: the TP ranks' gate decisions differ"]
    assert ds_smoke.check_reports(good, 4, dual_stream=False)[0].endswith("1 dual-stream batches with dual stream off")
    upstream = [{**good[0], "model_class": "Qwen3ForCausalLM"}, *good[1:]]
    assert "model class Qwen3ForCausalLM" in ds_smoke.check_reports(upstream, 4, True)[0]
