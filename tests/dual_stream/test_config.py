"""dual_stream_config validation: one test per bad input, each asserting the message."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from vllm_ascend.dual_stream import config as config_module
from vllm_ascend.dual_stream.config import DualStreamConfig, validate_dual_stream_config


def deployment(raw=None, tp=2, pp=1, max_batched=8192, dbo=False, ubatch_size=0, **ascend):
    vllm_config = SimpleNamespace(
        additional_config={} if raw is None else {"dual_stream_config": raw},
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, pipeline_parallel_size=pp, enable_dbo=dbo, ubatch_size=ubatch_size
        ),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_batched),
        kv_transfer_config=None,
        lora_config=None,
    )
    defaults = dict(
        enable_flashcomm1=False,
        enable_sp_by_pass=False,
        enable_matmul_allreduce=False,
        enable_flashcomm2_parallel_size=0,
        finegrained_tp_config=SimpleNamespace(mlp_tensor_parallel_size=0, oproj_tensor_parallel_size=0),
        weight_prefetch_config=SimpleNamespace(enabled=False),
    )
    defaults.update(ascend)
    return SimpleNamespace(**defaults), vllm_config


def validate(raw=None, **kwargs):
    return validate_dual_stream_config(*deployment(raw, **kwargs))


def test_absent_means_off_with_documented_defaults():
    config = validate()
    assert config == DualStreamConfig(False, "token_balanced", 1.0, None, 3, "~/.cache/vllm_ascend/dual_stream")
    assert config.measured, "without a length_threshold the gate measures"


def test_a_set_length_threshold_is_trusted_and_null_measures():
    assert not validate({"enabled": True, "length_threshold": 256}).measured
    assert validate({"enabled": True, "length_threshold": None}).measured


def test_the_cache_folder_expands_home_and_null_or_empty_keeps_none(monkeypatch):
    monkeypatch.setenv("HOME", "/nonexistent-home")
    assert validate({"enabled": True}).cache_path == "/nonexistent-home/.cache/vllm_ascend/dual_stream"
    assert validate({"enabled": True, "cache_dir": ""}).cache_path is None
    assert validate({"enabled": True, "cache_dir": None}).cache_path is None


@pytest.mark.parametrize("budget", [64, 255])
def test_measuring_needs_a_budget_that_can_reach_the_smallest_size_class(budget):
    with pytest.raises(ValueError) as info:
        validate({"enabled": True}, max_batched=budget)
    message = str(info.value)
    assert message.startswith("dual_stream_config.length_threshold=None: measuring starts at 128 tokens")
    assert f"--max-num-batched-tokens ({budget})" in message and "Set length_threshold" in message
    assert validate({"enabled": True}, max_batched=256).measured
    assert validate({"enabled": True, "length_threshold": 8}, max_batched=budget).length_threshold == 8


def test_a_full_valid_config_is_taken_as_given():
    raw = {"enabled": True, "split_strategy": "half_batch", "balance_threshold": 0.5, "length_threshold": 256}
    assert validate(raw) == DualStreamConfig(True, "half_batch", 0.5, 256)


def test_not_an_object():
    with pytest.raises(ValueError, match=r"dual_stream_config=\[True\]: must be a JSON object"):
        validate([True])


def test_unknown_keys_are_all_reported():
    with pytest.raises(ValueError) as info:
        validate({"enabled": True, "balance_treshold": 0.2, "lenght_threshold": 64})
    message = str(info.value)
    assert "dual_stream_config.balance_treshold=0.2: not a known key" in message
    assert "dual_stream_config.lenght_threshold=64: not a known key" in message
    assert (
        "The keys of dual_stream_config are enabled, split_strategy, balance_threshold, length_threshold, "
        "measure_repeats, cache_dir." in message
    )


def test_enabled_not_a_bool():
    with pytest.raises(ValueError, match=r"dual_stream_config\.enabled='yes': must be true or false"):
        validate({"enabled": "yes"})


def test_unknown_strategy():
    with pytest.raises(ValueError, match=r"split_strategy='balanced': must be one of 'half_batch', 'token_balanced'"):
        validate({"enabled": True, "split_strategy": "balanced"})


@pytest.mark.parametrize("value", [0, -0.5, float("nan"), float("inf"), True, "1.0"])
def test_balance_threshold_out_of_range(value):
    with pytest.raises(
        ValueError, match=r"dual_stream_config\.balance_threshold=.*: must be a number > 0 \(default 1.0\)"
    ):
        validate({"enabled": True, "balance_threshold": value})


@pytest.mark.parametrize("value", [0, -3, 12.5, False, "128"])
def test_length_threshold_out_of_range(value):
    with pytest.raises(
        ValueError,
        match=r"dual_stream_config\.length_threshold=.*: "
        r"must be an integer in \[1, 2147483647\], or null \(default null\)",
    ):
        validate({"enabled": True, "length_threshold": value})


def test_an_integral_float_is_taken_as_an_integer_as_in_the_cpp_config():
    config = validate({"enabled": True, "length_threshold": 128.0})
    assert config.length_threshold == 128 and type(config.length_threshold) is int


@pytest.mark.parametrize("value", [1e6, 4097, 10**9])
def test_a_length_threshold_no_batch_can_meet_is_refused(value):
    """Both halves need length_threshold tokens, a batch holds at most max_num_batched_tokens."""
    with pytest.raises(ValueError) as info:
        validate({"enabled": True, "length_threshold": value}, max_batched=8192)
    message = str(info.value)
    assert message.startswith(f"dual_stream_config.length_threshold={int(value)!r}: must be <= 4096, half of")
    assert "--max-num-batched-tokens (8192)" in message
    assert validate({"enabled": True, "length_threshold": 4096}, max_batched=8192).length_threshold == 4096


def test_pipeline_parallel_is_allowed_alone_and_with_cpp():
    """PP x TP: every stage runs its layers dual-stream; CPP's section beside it changes nothing here."""
    config = validate({"enabled": True}, pp=2)
    assert config.enabled
    _, vllm_config = deployment({"enabled": True}, pp=4)
    vllm_config.additional_config["profiling_chunk_config"] = {"enabled": True}
    ascend, _ = deployment()
    assert validate_dual_stream_config(ascend, vllm_config).enabled


@pytest.mark.parametrize("change", [dict(dbo=True), dict(ubatch_size=2)])
def test_vllm_micro_batching_is_refused(change):
    with pytest.raises(ValueError) as info:
        validate({"enabled": True}, pp=2, **change)
    message = str(info.value)
    assert "cannot be combined with vLLM's micro-batching (--enable-dbo" in message
    assert "serve without it or disable dual_stream_config" in message


def test_a_micro_batching_flag_missing_from_vllm_stops_start_up():
    ascend, vllm_config = deployment({"enabled": True})
    del vllm_config.parallel_config.enable_dbo
    with pytest.raises(RuntimeError, match=r"has no enable_dbo"):
        validate_dual_stream_config(ascend, vllm_config)


@pytest.mark.parametrize(
    "setting, named, fix",
    [
        (
            {"enable_flashcomm1": True},
            "enable_flashcomm1 or VLLM_ASCEND_ENABLE_FLASHCOMM1 (flashcomm1",
            "set it to false",
        ),
        ({"enable_sp_by_pass": True}, "compilation_config.pass_config.enable_sp", "turn that pass off"),
        ({"enable_matmul_allreduce": True}, "enable_matmul_allreduce", "set it to false"),
        (
            {"enable_flashcomm2_parallel_size": 2},
            "enable_flashcomm2_parallel_size or VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE (flashcomm2)",
            "set it to 0",
        ),
        (
            {"finegrained_tp_config": SimpleNamespace(mlp_tensor_parallel_size=2, oproj_tensor_parallel_size=0)},
            "finegrained_tp_config.mlp_tensor_parallel_size",
            "set it to 0",
        ),
        (
            {"finegrained_tp_config": SimpleNamespace(mlp_tensor_parallel_size=0, oproj_tensor_parallel_size=2)},
            "finegrained_tp_config.oproj_tensor_parallel_size",
            "set it to 0",
        ),
    ],
)
def test_features_that_replace_the_row_parallel_all_reduce(setting, named, fix):
    with pytest.raises(ValueError) as info:
        validate({"enabled": True}, **setting)
    message = str(info.value)
    assert f"dual_stream_config.enabled cannot be combined with {named}" in message
    assert "replaces the row-parallel all-reduce" in message
    assert f"Either {fix} or disable dual_stream_config." in message


def test_mlp_weight_prefetch():
    with pytest.raises(ValueError) as info:
        validate({"enabled": True}, weight_prefetch_config=SimpleNamespace(enabled=True))
    message = str(info.value)
    assert "cannot be combined with weight_prefetch_config.enabled: its MLP prefetch advances" in message
    assert "Either set it to false or disable dual_stream_config." in message


def test_lora():
    ascend, vllm_config = deployment({"enabled": True})
    vllm_config.lora_config = SimpleNamespace(max_loras=1)
    with pytest.raises(ValueError) as info:
        validate_dual_stream_config(ascend, vllm_config)
    message = str(info.value)
    assert "cannot be combined with LoRA (--enable-lora): LoRA layers map tokens to adapters" in message
    assert "Either serve without --enable-lora or disable dual_stream_config." in message


def test_kv_transfer_connector():
    ascend, vllm_config = deployment({"enabled": True})
    vllm_config.kv_transfer_config = SimpleNamespace(kv_role="kv_producer")
    with pytest.raises(ValueError) as info:
        validate_dual_stream_config(ascend, vllm_config)
    message = str(info.value)
    assert "cannot be combined with a KV transfer connector (--kv-transfer-config): connectors load and save" in message
    assert "Either serve without --kv-transfer-config or disable dual_stream_config." in message


def test_every_problem_of_the_deployment_is_reported():
    with pytest.raises(ValueError) as info:
        validate(
            {"enabled": True, "length_threshold": 5000}, dbo=True, enable_flashcomm1=True, enable_matmul_allreduce=True
        )
    lines = str(info.value).splitlines()
    assert lines[0] == "dual_stream_config: 4 problems:"
    for part in (
        "--enable-dbo",
        "length_threshold=5000",
        "enable_flashcomm1",
        "enable_matmul_allreduce",
    ):
        assert any(part in line for line in lines[1:]), part


@pytest.mark.parametrize("path", [path for path, *_ in config_module.ASCEND_CONFLICTS])
def test_a_conflict_flag_missing_from_ascend_config_stops_start_up(path):
    """A flag that upstream renames or removes must not make the conflict check pass silently."""
    ascend, vllm_config = deployment({"enabled": True})
    owner, _, name = path.rpartition(".")
    holder = getattr(ascend, owner) if owner else ascend
    delattr(holder, name)
    with pytest.raises(RuntimeError) as info:
        validate_dual_stream_config(ascend, vllm_config)
    assert f"has no {path}, a setting dual stream cannot run with" in str(info.value)


@pytest.mark.parametrize("path", [path for path, *_ in config_module.VLLM_CONFLICTS])
def test_a_conflict_setting_missing_from_vllm_config_stops_start_up(path):
    ascend, vllm_config = deployment({"enabled": True})
    delattr(vllm_config, path)
    with pytest.raises(RuntimeError, match=f"has no {path}, a setting dual stream cannot run with"):
        validate_dual_stream_config(ascend, vllm_config)


def test_conflicts_do_not_matter_when_off():
    assert not validate({"enabled": False}, enable_flashcomm1=True, pp=2).enabled


def test_graph_mode_warns_once_and_stays_valid(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "_warned_graph", False)
    ascend, vllm_config = deployment({"enabled": True})
    vllm_config.model_config = SimpleNamespace(enforce_eager=False)
    with caplog.at_level(logging.WARNING, logger="vllm_ascend.dual_stream.config"):
        config = validate_dual_stream_config(ascend, vllm_config)
        validate_dual_stream_config(ascend, vllm_config)  # AscendConfig built again: no second warning
        vllm_config.model_config.enforce_eager = True
        monkeypatch.setattr(config_module, "_warned_graph", False)
        validate_dual_stream_config(ascend, vllm_config)  # eager: nothing to say
    assert config.enabled
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "without --enforce-eager" in warnings[0]


def test_tp1_warns_once_and_stays_valid(caplog, monkeypatch):
    monkeypatch.setattr(config_module, "_warned_tp1", False)
    with caplog.at_level(logging.WARNING, logger="vllm_ascend.dual_stream.config"):
        config = validate({"enabled": True}, tp=1)
        validate({"enabled": True}, tp=1)  # AscendConfig built again: no second warning
    assert config.enabled
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].getMessage().startswith("[DualStream] dual_stream_config.enabled")
    assert "tensor_parallel_size is 1" in warnings[0].getMessage()


def test_a_cache_dir_that_is_a_file_is_refused_naming_the_key_and_a_relative_one_is_made_absolute(
    tmp_path, monkeypatch
):
    a_file = tmp_path / "probes.json"
    a_file.write_text("{}")
    with pytest.raises(ValueError) as info:
        validate({"enabled": True, "cache_dir": str(a_file)})
    assert "cache_dir" in str(info.value)
    monkeypatch.chdir(tmp_path)
    assert validate({"enabled": True, "cache_dir": "ds-cache"}).cache_path == str(tmp_path / "ds-cache")


@pytest.mark.parametrize(
    "name",
    [
        "dual_stream",
        "dual_stream_cofig",
        "Dual-Stream-Config",
        "dualstream_config",
        "DualStream",
        "dualstream",
        "dual_streams",
    ],
)
def test_a_slip_in_the_section_name_is_refused_not_left_off_without_a_word(name):
    ascend, vllm_config = deployment()
    vllm_config.additional_config = {name: {"enabled": True}, "enable_cpu_binding": True}
    with pytest.raises(
        ValueError, match=f"additional_config key '{name}' is not read: did you mean 'dual_stream_config'"
    ):
        validate_dual_stream_config(ascend, vllm_config)


def test_other_features_keys_are_not_taken_for_slips():
    ascend, vllm_config = deployment({"enabled": False})
    vllm_config.additional_config.update(dump_config={}, enable_shared_expert_dp=True, weight_prefetch_config={})
    assert not validate_dual_stream_config(ascend, vllm_config).enabled


def test_a_default_cache_folder_that_cannot_be_made_is_refused_when_on(tmp_path, monkeypatch):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))  # ~/.cache/... lies under a file
    with pytest.raises(
        ValueError, match=r"dual_stream_config.cache_dir='~/.cache/vllm_ascend/dual_stream': \(the default\)"
    ):
        validate({"enabled": True})
    assert validate({"enabled": True, "cache_dir": ""}).cache_path is None  # the way out it names
    assert not validate({"enabled": False}).enabled  # off: nothing is kept, nothing to check
    assert validate({"enabled": True, "length_threshold": 256}).enabled  # a set threshold reads and writes nothing


def test_another_model_than_qwen3_dense_warns_once_that_dual_stream_stays_inert(caplog, monkeypatch):
    """Only Qwen3ForCausalLM is mapped to the dual-stream model; on another it was silently inert."""
    monkeypatch.setattr(config_module, "_warned_model", False)
    ascend, vllm_config = deployment({"enabled": True})
    vllm_config.model_config = SimpleNamespace(enforce_eager=True, architectures=["LlamaForCausalLM"])
    with caplog.at_level(logging.WARNING, logger="vllm_ascend.dual_stream.config"):
        assert validate_dual_stream_config(ascend, vllm_config).enabled
        validate_dual_stream_config(ascend, vllm_config)  # AscendConfig built again: no second warning
        vllm_config.model_config.architectures = ["Qwen3ForCausalLM"]
        monkeypatch.setattr(config_module, "_warned_model", False)
        validate_dual_stream_config(ascend, vllm_config)  # Qwen3 dense: nothing to say
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the model is LlamaForCausalLM" in warnings[0] and "stays inert" in warnings[0]


@pytest.mark.parametrize(
    ("flag", "value", "variable"),
    [
        ("enable_flashcomm1", True, "VLLM_ASCEND_ENABLE_FLASHCOMM1"),
        ("enable_matmul_allreduce", True, "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE"),
        ("enable_flashcomm2_parallel_size", 2, "VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE"),
    ],
)
def test_a_conflict_an_environment_variable_may_have_set_names_the_variable(flag, value, variable):
    with pytest.raises(ValueError, match=variable):
        validate({"enabled": True}, **{flag: value})


def test_a_default_cache_folder_the_server_cannot_write_keeps_no_probes_with_a_warning(tmp_path, monkeypatch, caplog):
    import os

    from vllm_ascend import config_table

    monkeypatch.setenv("HOME", str(tmp_path))
    real_access = os.access
    monkeypatch.setattr(config_table.os, "access", lambda path, mode: path != str(tmp_path) and real_access(path, mode))
    with caplog.at_level(logging.WARNING, logger="vllm_ascend.dual_stream.config"):
        config = validate({"enabled": True})
    assert config.enabled and config.cache_path is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("is not writable here, so no probe is kept" in w for w in warnings), warnings
