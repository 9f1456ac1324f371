"""profiling_chunk_config: every bad input is an error naming the key and the fix."""

from __future__ import annotations

import os
import re
import sys
import types
from types import SimpleNamespace

import pytest
from vllm_ascend import config_table
from vllm_ascend.core import cpp_config
from vllm_ascend.core.cpp_config import CppConfigError, parse_cpp_config


def engine(pp: int = 2, chunked: bool = True, scheduler_cls=None, max_batched: int = 8192, block_size: int = 128):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        scheduler_config=SimpleNamespace(
            enable_chunked_prefill=chunked, scheduler_cls=scheduler_cls, max_num_batched_tokens=max_batched
        ),
        cache_config=SimpleNamespace(block_size=block_size),
    )


def load(raw, vllm_config=None, balance=False):
    return cpp_config.load_profiling_chunk_config(
        {"profiling_chunk_config": raw}, vllm_config or engine(), balance_scheduling=balance
    )


def test_defaults_keep_upstream_keys_and_add_ours():
    config = load({"enabled": True})
    assert config.enabled and config.need_timing
    assert (config.smooth_factor, config.min_chunk, config.max_fit_chunk) == (1.0, 64, 30)
    assert (config.profile_points, config.timing_every, config.tail_tolerance) == (24, 16, 0.0)
    assert config.cache_dir == config.cache_path == os.path.expanduser("~/.cache/vllm_ascend/cpp")
    assert parse_cpp_config({}).cache_dir == "~/.cache/vllm_ascend/cpp", "the default, as documented"
    assert not load(None).enabled and not load({}).need_timing


def test_an_upstream_config_still_parses():
    config = load({"enabled": True, "smooth_factor": 0.8, "min_chunk": 1024, "need_timing": False, "max_fit_chunk": 40})
    assert (config.smooth_factor, config.min_chunk, config.need_timing, config.max_fit_chunk) == (0.8, 1024, False, 40)


def test_the_refit_window_has_its_own_key_and_max_fit_chunk_keeps_upstreams():
    assert (load({}).max_fit_chunk, load({}).calibration_window) == (30, 30)
    assert (load({"max_fit_chunk": 12}).max_fit_chunk, load({"max_fit_chunk": 12}).calibration_window) == (12, 30)
    config = load({"calibration_window": 64})
    assert (config.max_fit_chunk, config.calibration_window) == (30, 64)
    with pytest.raises(CppConfigError, match=r"calibration_window=7: must be an integer in \[8, 4096\] \(default 30\)"):
        load({"calibration_window": 7})


@pytest.mark.parametrize(("value", "expected"), [(None, None), (50, 50.0), (0.5, 0.5)])
def test_target_tpot_ms_is_a_positive_number_of_ms_or_null(value, expected):
    assert load({"target_tpot_ms": value}).target_tpot_ms == expected
    assert load({}).target_tpot_ms is None


@pytest.mark.parametrize("value", [0, -5, "50", True, float("inf")])
def test_target_tpot_ms_refuses_what_is_not_a_positive_number(value):
    with pytest.raises(CppConfigError, match=r"target_tpot_ms=.*: must be a number > 0, or null \(default null\)"):
        load({"target_tpot_ms": value})


def test_max_batch_ms_names_the_key_that_replaced_it_and_how_to_convert():
    with pytest.raises(CppConfigError) as raised:
        load({"enabled": True, "max_batch_ms": 20})
    message = str(raised.value)
    assert message.startswith("profiling_chunk_config.max_batch_ms=20: replaced by target_tpot_ms")
    assert "target_tpot_ms=X*P" in message


def test_max_batch_ms_is_reported_with_the_other_bad_keys_so_one_restart_fixes_all():
    with pytest.raises(CppConfigError) as raised:
        load({"max_batch_ms": 20, "smooth_factor": 3})
    message = str(raised.value)
    assert "max_batch_ms=20: replaced by target_tpot_ms" in message and "smooth_factor=3" in message
    with pytest.raises(CppConfigError) as raised:
        load({"max_batch_ms": 20, "smooth_factor": 3, "bogus": 1})
    message = str(raised.value)  # one list of all three, under one header
    assert message.startswith("profiling_chunk_config: 3 problems:") and message.count("problems:") == 1


def test_min_chunk_above_the_token_budget_is_clamped_like_upstream(monkeypatch):
    warnings = []
    monkeypatch.setattr(cpp_config.logger, "warning", lambda message, *args: warnings.append(message % args))
    assert load({"enabled": True, "min_chunk": 4096}, engine(max_batched=2048)).min_chunk == 2048
    assert warnings == ["[CPP] profiling_chunk_config.min_chunk=4096 is above max_num_batched_tokens=2048; using 2048"]
    warnings.clear()  # the default min_chunk above a tiny budget: clamped, and no warning of a key nobody set
    assert load({"enabled": True}, engine(max_batched=32)).min_chunk == 32
    assert warnings == []


def test_a_disabled_config_reads_nothing_of_the_engine():
    # Off, the engine's values are not compared (upstream's tests pass mocks for them).
    engine_of_mocks = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=object()))
    config = cpp_config.load_profiling_chunk_config({}, engine_of_mocks, balance_scheduling=True)
    assert not config.enabled and config.min_chunk == cpp_config.CppConfig().min_chunk


def test_empty_cache_dir_turns_the_cache_off():
    assert load({"enabled": True, "cache_dir": ""}).cache_path is None


def test_unknown_key_lists_the_valid_keys():
    with pytest.raises(CppConfigError) as error:
        load({"enabled": True, "smoth_factor": 0.5})
    message = str(error.value)
    assert "profiling_chunk_config.smoth_factor=0.5: not a known key" in message
    for key in ("enabled", "smooth_factor", "min_chunk", "max_fit_chunk", "need_timing", "cache_dir", "timing_every"):
        assert key in message


def test_not_an_object():
    with pytest.raises(CppConfigError, match=r"profiling_chunk_config=True: must be a JSON object"):
        load(True)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"enabled": "yes"}, r"profiling_chunk_config.enabled='yes': must be true or false"),
        ({"smooth_factor": 0}, r"profiling_chunk_config.smooth_factor=0: must be a number in \(0, 1\]"),
        ({"smooth_factor": 1.5}, r"profiling_chunk_config.smooth_factor=1.5: must be a number in \(0, 1\]"),
        ({"smooth_factor": "high"}, r"profiling_chunk_config.smooth_factor='high': must be a number"),
        ({"min_chunk": 0}, r"profiling_chunk_config.min_chunk=0: must be an integer in \[1, 10000000\]"),
        ({"min_chunk": 12.5}, r"profiling_chunk_config.min_chunk=12.5: must be an integer"),
        ({"max_fit_chunk": 5}, r"profiling_chunk_config.max_fit_chunk=5: must be an integer in \[8, 4096\]"),
        ({"need_timing": 1}, r"profiling_chunk_config.need_timing=1: must be true or false"),
        ({"cache_dir": 3}, r"profiling_chunk_config.cache_dir=3: must be a folder path, or null"),
        ({"profile_points": 4}, r"profiling_chunk_config.profile_points=4: must be an integer in \[8, 64\]"),
        ({"profile_repeats": 0}, r"profiling_chunk_config.profile_repeats=0: must be an integer in \[1, 16\]"),
        (
            {"profile_history_points": -1},
            r"profiling_chunk_config.profile_history_points=-1: must be an integer in \[1, 32\]",
        ),
        ({"timing_every": 0}, r"profiling_chunk_config.timing_every=0: must be an integer in \[1, 1000000\]"),
        ({"tail_tolerance": -0.1}, r"profiling_chunk_config.tail_tolerance=-0.1: must be a number in \[0, 1\]"),
        ({"tail_tolerance": True}, r"profiling_chunk_config.tail_tolerance=True: must be a number"),
    ],
)
def test_value_out_of_range_names_key_and_range(raw, message):
    with pytest.raises(CppConfigError, match=message):
        load(raw)


def test_values_are_checked_even_when_disabled():
    with pytest.raises(CppConfigError, match="smooth_factor"):
        parse_cpp_config({"enabled": False, "smooth_factor": 2})


def test_needs_pipeline_parallelism():
    with pytest.raises(CppConfigError, match=r"pipeline_parallel_size=1: start with --pipeline-parallel-size 2"):
        load({"enabled": True}, engine(pp=1))


def test_needs_chunked_prefill():
    with pytest.raises(CppConfigError, match=r"needs chunked prefill: add --enable-chunked-prefill"):
        load({"enabled": True}, engine(chunked=False))


def test_not_with_balance_scheduling():
    with pytest.raises(CppConfigError, match=r"cannot run with balance scheduling: set enable_balance_scheduling"):
        load({"enabled": True}, balance=True)


@pytest.mark.parametrize(("block_size", "max_batched"), [(16, 48), (128, 100), (1, 1), (256, 255)])
def test_any_token_budget_is_a_valid_base_chunk_whatever_the_block_size(block_size, max_batched):
    """Chunks are any number of tokens, so no --max-num-batched-tokens is too small for the block size."""
    assert load({"enabled": True}, engine(max_batched=max_batched, block_size=block_size)).enabled


def test_every_unmet_engine_requirement_is_reported():
    with pytest.raises(CppConfigError) as error:
        load({"enabled": True}, engine(pp=1, chunked=False, max_batched=32), balance=True)
    message = str(error.value)
    assert message.startswith("profiling_chunk_config: 3 problems:")
    for part in ("pipeline_parallel_size=1", "needs chunked prefill", "balance scheduling"):
        assert part in message


def test_disabled_config_has_no_engine_requirements():
    assert not load({"enabled": False}, engine(pp=1, chunked=False, max_batched=1), balance=True).enabled


def test_not_with_another_scheduler_override():
    vllm_config = engine(scheduler_cls="vllm_ascend.core.scheduler_dynamic_batch.SchedulerDynamicBatch")
    with pytest.raises(CppConfigError, match=r"scheduler_cls is already vllm_ascend.core.scheduler_dynamic_batch"):
        cpp_config.select_cpp_scheduler(vllm_config)


class _Custom:
    pass


@pytest.mark.parametrize(
    "current, shown", [(_Custom, f"{__name__}._Custom"), (_Custom(), "_Custom object at")], ids=["class", "object"]
)
def test_another_scheduler_override_of_any_kind_is_named(current, shown):
    # An object without a __qualname__ (a mock, an instance) is named as it prints, not an AttributeError.
    with pytest.raises(CppConfigError, match=f"scheduler_cls is already .*{re.escape(shown)}"):
        cpp_config.select_cpp_scheduler(engine(scheduler_cls=current))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_select_installs_our_scheduler_keeping_async_scheduling(monkeypatch, async_scheduling):
    # The engine-core start-up hook module is NPU-side; a stand-in records that it was imported.
    name = "vllm_ascend.patch.platform.patch_profiling_chunk"
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    vllm_config = engine()
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    cpp_config.select_cpp_scheduler(vllm_config)
    expected = cpp_config.ASYNC_SCHEDULER_CLS if async_scheduling else cpp_config.SCHEDULER_CLS
    assert vllm_config.scheduler_config.scheduler_cls == expected
    cpp_config.select_cpp_scheduler(vllm_config)  # selecting again (a second config pass) is fine


def test_ascend_config_runs_the_check(tmp_path):
    """The 0201 patch: AscendConfig refuses a bad profiling_chunk_config at start-up."""
    import helpers  # vLLM's config, with the NPU stubs set aside

    helpers.import_vllm()
    from vllm_ascend.ascend_config import AscendConfig

    vllm_config = helpers.make_vllm_config(tmp_path, additional_config={"profiling_chunk_config": {"enabled": True}})
    with pytest.raises(CppConfigError, match="pipeline_parallel_size=1"):
        AscendConfig(vllm_config)
    vllm_config = helpers.make_vllm_config(tmp_path, additional_config={"profiling_chunk_config": {"enabld": True}})
    with pytest.raises(CppConfigError, match="profiling_chunk_config.enabld=True: not a known key"):
        AscendConfig(vllm_config)
    vllm_config = helpers.make_vllm_config(tmp_path, additional_config={})
    assert not AscendConfig(vllm_config).profiling_chunk_config.enabled


def test_ascend_config_refuses_both_sections_in_one_error_so_one_restart_fixes_them(tmp_path):
    """The 0102 patch: CPP is checked mid-way, dual stream at the end; both wrong, one error names both."""
    import helpers

    helpers.import_vllm()
    from vllm_ascend.ascend_config import init_ascend_config

    both = {"profiling_chunk_config": {"enabled": True}, "dual_stream_config": {"enabled": True, "splt": 1}}
    with pytest.raises(CppConfigError) as error:
        init_ascend_config(helpers.make_vllm_config(tmp_path, additional_config=both))
    assert "pipeline_parallel_size=1" in str(error.value)
    assert "dual_stream_config.splt=1: not a known key" in str(error.value)
    only_dual = {"dual_stream_config": {"enabled": True, "splt": 1}}
    with pytest.raises(ValueError, match="dual_stream_config.splt=1") as error:
        init_ascend_config(helpers.make_vllm_config(tmp_path, additional_config=only_dual))
    assert "profiling_chunk_config" not in str(error.value)
    # The gathering ends with the build: a section checked on its own afterwards raises at once.
    with pytest.raises(CppConfigError, match="pipeline_parallel_size=1"):
        load({"enabled": True}, engine(pp=1))


def _no_such_user() -> str:
    import pwd

    for n in range(100):
        name = f"nosuchuser{n}"
        try:
            pwd.getpwnam(name)
        except KeyError:
            return name
    pytest.skip("every candidate user name exists on this host")


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("/srv/cpp\0cache", "must not contain a NUL byte"),
        ("   ", "is only white space"),
        ("\t", "is only white space"),
        (" ~/.cache/cpp", "must not start or end with white space"),
        ("/srv/cpp-cache\n", "must not start or end with white space"),
    ],
)
def test_a_cache_dir_that_cannot_name_a_folder_is_refused_at_parse_time_naming_the_key(value, fix):
    """Refused before any profiling runs: a NUL byte used to fail only when the fitted profile was saved."""
    with pytest.raises(CppConfigError) as error:
        parse_cpp_config({"enabled": False, "cache_dir": value})
    message = str(error.value)
    assert message.startswith(f"profiling_chunk_config.cache_dir={value!r}: {fix}"), message
    assert "(default " in message


def test_a_cache_dir_under_a_user_that_does_not_exist_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user = _no_such_user()
    with pytest.raises(CppConfigError) as error:
        parse_cpp_config({"cache_dir": f"~{user}/cpp"})
    message = str(error.value)
    assert message.startswith(f"profiling_chunk_config.cache_dir='~{user}/cpp': ~{user} names no user on this host")
    assert "write the folder as an absolute path" in message
    assert list(tmp_path.iterdir()) == [], "nothing is created in the working directory"


def test_tilde_without_a_home_is_refused_given_or_by_default_when_enabled(tmp_path, monkeypatch):
    import pwd

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CppConfigError, match=r"cache_dir='~/cpp': ~ cannot be expanded: HOME is not set"):
        parse_cpp_config({"cache_dir": "~/cpp"})
    with pytest.raises(CppConfigError) as error:
        load({"enabled": True})
    message = str(error.value)
    assert message.startswith("profiling_chunk_config.cache_dir='~/.cache/vllm_ascend/cpp': (the default) ~ cannot")
    assert message.endswith('; set HOME, or give an absolute path, or "" to keep no profile')
    assert not load({"enabled": False}).enabled, "a disabled CPP never uses the folder"
    assert load({"enabled": True, "cache_dir": "/srv/cpp"}).cache_path == "/srv/cpp"
    assert list(tmp_path.iterdir()) == []


def test_a_relative_cache_dir_is_taken_from_the_working_directory_at_start_up(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load({"enabled": True, "cache_dir": "profiles/../cpp-profiles"})
    assert config.cache_dir == config.cache_path == str(tmp_path / "cpp-profiles")
    monkeypatch.chdir("/")
    assert config.cache_path == str(tmp_path / "cpp-profiles"), "fixed at start-up, not at each use"
    meaning = config_table.settings(cpp_config.CppConfig)["cache_dir"][1].meaning
    assert "relative path is taken from the working directory" in meaning  # and so in docs/cpp.md's table


def test_the_default_cache_dir_is_made_absolute_when_enabled(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load({"enabled": True}).cache_dir == str(tmp_path / ".cache/vllm_ascend/cpp")


def test_a_cache_dir_that_is_or_lies_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "profile.json"
    blocker.write_text("{}")
    for value in (str(blocker), str(blocker / "cpp")):
        with pytest.raises(CppConfigError, match=rf"cache_dir='.*': {re.escape(str(blocker))} is not a folder"):
            parse_cpp_config({"cache_dir": value})
    assert blocker.read_text() == "{}"


def test_a_refit_window_past_thousands_of_steps_is_refused_at_start_up_naming_the_key():
    """Such a window used to pass validation and overflow deque(maxlen=...) after the whole start-up profile."""
    for value in (1e19, 10**19, 4097):
        with pytest.raises(CppConfigError, match=r"calibration_window=.*: must be an integer in \[8, 4096\]"):
            load({"enabled": True, "calibration_window": value})
    assert load({"calibration_window": 4096.0}).calibration_window == 4096


def test_a_min_chunk_of_thousands_of_digits_is_refused_naming_the_key_without_a_logging_error(capsys):
    """It used to reach the clamp warning, whose %d could not format it (a logging-error traceback)."""
    with pytest.raises(CppConfigError) as error:
        parse_cpp_config({"min_chunk": 10**5000}, max_num_batched_tokens=2048)
    message = str(error.value)
    assert message.startswith("profiling_chunk_config.min_chunk=<an integer of about 5000 digits>: must be an integer")
    assert len(message) < 200
    assert "Logging error" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["profiling_chunk_cofig", "profiling_chunk", "Profiling-Chunk-Config", "profilingchunk", "ProfilingChunk"]
)
def test_a_slip_in_the_section_name_is_refused_naming_the_right_one(name):
    with pytest.raises(CppConfigError, match=f"key '{name}' is not read: did you mean 'profiling_chunk_config'"):
        cpp_config.load_profiling_chunk_config({name: {"enabled": True}}, engine(), balance_scheduling=False)
    # upstream's own keys are no slip of ours
    config = cpp_config.load_profiling_chunk_config(
        {"dump_config": {}, "eplb_config": {}, "recompute_scheduler_enable": False}, engine(), balance_scheduling=False
    )
    assert not config.enabled


def test_bad_values_and_an_engine_that_lacks_what_cpp_needs_are_reported_together():
    with pytest.raises(CppConfigError) as info:
        load({"enabled": True, "min_chunk": 0}, engine(pp=1, chunked=False), balance=True)
    message = str(info.value)
    assert "min_chunk=0" in message  # the value
    for unmet in ("--pipeline-parallel-size 2", "--enable-chunked-prefill", "balance scheduling"):
        assert unmet in message, unmet  # and, in the same error, the engine
    # off: only the values are judged, the engine is none of its business
    with pytest.raises(CppConfigError) as info:
        load({"enabled": False, "min_chunk": 0}, engine(pp=1, chunked=False))
    assert "pipeline" not in str(info.value)


def test_a_cache_dir_the_server_cannot_write_is_refused_at_parse_time_naming_the_key(tmp_path, monkeypatch):
    """A read-only file system (or a folder of another user) passed before: the profile then ran at every
    start and was never saved, one warning each time naming neither the key nor the fix."""
    import os

    from vllm_ascend import config_table

    locked = tmp_path / "read-only"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(config_table.os, "access", lambda path, mode: path != str(locked) and real_access(path, mode))
    for value in (str(locked), str(locked / "cpp")):
        with pytest.raises(CppConfigError, match=rf"cache_dir='.*': {re.escape(str(locked))} is not writable here"):
            parse_cpp_config({"enabled": True, "cache_dir": value})
    assert parse_cpp_config({"enabled": True, "cache_dir": str(tmp_path / "cpp")}).cache_dir == str(tmp_path / "cpp")


def test_a_default_cache_folder_the_server_cannot_write_keeps_no_profile_with_a_warning(tmp_path, monkeypatch, caplog):
    """A read-only HOME (a container): CPP on with the defaults serves, profiling at every start, and says so
    once; a cache_dir the user gave there is refused (above)."""
    import logging
    import os

    from vllm_ascend import config_table

    monkeypatch.setenv("HOME", str(tmp_path))
    real_access = os.access
    monkeypatch.setattr(config_table.os, "access", lambda path, mode: path != str(tmp_path) and real_access(path, mode))
    with caplog.at_level(logging.WARNING):
        config = load({"enabled": True})
    assert config.enabled and config.cache_dir == "" and config.cache_path is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "the default" in warning and "is not writable here, so no profile is kept" in warning
    with pytest.raises(CppConfigError, match="is not writable here"):
        load({"enabled": True, "cache_dir": str(tmp_path / "cpp")})
