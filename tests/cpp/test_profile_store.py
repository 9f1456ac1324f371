"""The cached CPP profile: untrusted input, adopted only as a fresh profile would be, and written atomically.

``initialise_profile`` is run against a fake device that times the real start-up plan
on a known model; every bad cache ends in one warning and a new profile, never a crash
and never a model the acceptance rule would refuse.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cpp_samples import TRUE, start_up_samples
from vllm_ascend.core import cpp_profiling
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_latency_model import NoisyFit, accept
from vllm_ascend.core.cpp_profile_store import (
    MAX_PROFILE_BYTES,
    MAX_PROFILE_SAMPLES,
    PROFILE_SCHEMA_VERSION,
    ProfileCacheError,
    cache_file,
    load_profile,
    make_fingerprint,
    save_profile,
)

BASE_CHUNK_TOKENS = 8192
DOMAIN = {"max_chunk_tokens": 8192, "max_history_tokens": 65_536}
# A small valid profile (16 sizes, 2 histories: 20 runs) keeps these tests fast; the fit tests use the default.
PROFILE_SETTINGS = {"profile_points": 16, "profile_repeats": 1, "profile_history_points": 2}


def fingerprint(**overrides):
    values = dict(
        model="Qwen/Qwen3-8B",
        dtype="bfloat16",
        quantization=None,
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        max_num_batched_tokens=8192,
        block_size=128,
        vllm_version="0.23.0",
        vllm_ascend_version="0.23.0+cpp",
        device_name="Ascend910B3",
        cann_version="8.3.RC1",
    )
    values.update(overrides)
    return make_fingerprint(**values)


class Device:
    """Times each profiling run on TRUE (1% noise) and counts the runs."""

    def __init__(self):
        self.runs = 0

    def __call__(self, chunk_tokens, history_tokens):
        self.runs += 1
        return TRUE.time_ms(chunk_tokens, history_tokens) * (1.0 + 0.01 * ((self.runs * 7919) % 13 - 6) / 6)


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged():
    """Warnings of cpp_profiling's logger (vLLM's loggers do not propagate to the root)."""
    handler = Warnings()
    cpp_profiling.logger.addHandler(handler)
    yield handler.messages
    cpp_profiling.logger.removeHandler(handler)


def start(cache_dir, device, **overrides):
    """What the scheduler does at start-up: the model, its samples and where they came from."""
    kwargs = dict(fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS, measure=device, **DOMAIN)
    kwargs.update(overrides)
    config = CppConfig(cache_dir=str(cache_dir), **PROFILE_SETTINGS)
    return cpp_profiling.initialise_profile(config, **kwargs)


def profile_file(cache_dir) -> Path:
    return cache_file(str(cache_dir), fingerprint())


@pytest.fixture
def cached(tmp_path):
    """A cache folder holding the profile of a first start (one profiling run)."""
    device = Device()
    model, samples, source = start(tmp_path, device)
    assert model is not None and device.runs == len(samples) + cpp_profiling.WARMUP_RUNS
    assert "saved to" in source and profile_file(tmp_path).is_file()
    return tmp_path


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


class BusyHost(Device):
    """A host whose load moves each run by up to ``noise``; unless ``same_every_round``, round 2 mirrors round 1."""

    def __init__(self, noise, *, same_every_round):
        super().__init__()
        self.noise, self.same_every_round, self.plan_runs = noise, same_every_round, None

    def __call__(self, chunk_tokens, history_tokens):
        self.runs += 1
        index = self.runs - cpp_profiling.WARMUP_RUNS
        round_index, position = divmod(max(index - 1, 0), self.plan_runs)
        sign = 1.0 if self.same_every_round or round_index == 0 else -1.0
        wobble = ((position * 7919) % 13 - 6) / 6  # in [-1, 1]
        return TRUE.time_ms(chunk_tokens, history_tokens) * (1.0 + sign * self.noise * wobble)


def start_up_plan():
    return cpp_profiling.profile_plan(
        base_chunk_size=BASE_CHUNK_TOKENS,
        points=PROFILE_SETTINGS["profile_points"],
        repeats=PROFILE_SETTINGS["profile_repeats"],
        history_points=PROFILE_SETTINGS["profile_history_points"],
        max_history_tokens=DOMAIN["max_history_tokens"],
    )


def busy_host(*, same_every_round):
    device = BusyHost(0.4, same_every_round=same_every_round)
    device.plan_runs = len(start_up_plan())
    return device


def test_a_noisy_profile_is_measured_once_more_and_accepted_on_both_rounds(tmp_path, warnings_logged):
    one_round = cpp_profiling.collect_samples(
        busy_host(same_every_round=False), start_up_plan(), (BASE_CHUNK_TOKENS, 0)
    )
    with pytest.raises(NoisyFit):
        accept(one_round, **DOMAIN)
    device = busy_host(same_every_round=False)
    runs = device.plan_runs
    model, samples, source = start(tmp_path, device)
    assert model is not None and not warnings_logged
    assert len(samples) == 2 * runs and device.runs == 2 * runs + cpp_profiling.WARMUP_RUNS
    assert source.startswith(f"profiled ({2 * runs} runs")
    assert model.time_ms(4096, 32_768) == pytest.approx(TRUE.time_ms(4096, 32_768), rel=0.02)


def test_a_profile_still_noisy_after_the_second_round_keeps_fixed_chunks_with_one_warning(tmp_path, warnings_logged):
    device = busy_host(same_every_round=True)
    assert start(tmp_path, device) == (None, [], None)
    assert device.runs == 2 * device.plan_runs + cpp_profiling.WARMUP_RUNS  # one more round, not more
    assert len(warnings_logged) == 1 and "rejected" in warnings_logged[0]
    assert not profile_file(tmp_path).exists()


def test_a_profile_refused_for_its_shape_is_not_measured_again(tmp_path, warnings_logged):
    device = Device()
    flat = start(tmp_path, lambda c, h: device(c, h) * 0 + 5.0 + 0.001 * c)  # linear: no quadratic term
    assert flat == (None, [], None)
    assert device.runs == len(start_up_plan()) + cpp_profiling.WARMUP_RUNS
    assert len(warnings_logged) == 1 and "quadratic" in warnings_logged[0]


# ---------------------------------------------------------------- reuse
def test_a_second_start_reuses_the_profile_without_profiling(cached, warnings_logged):
    device = Device()
    first = load_profile(profile_file(cached), fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS)
    model, samples, source = start(cached, device)
    assert device.runs == 0 and not warnings_logged
    assert source.startswith("cache") and samples == first
    assert model == accept(first, **DOMAIN)


def test_save_then_load_gives_back_the_samples(tmp_path):
    samples = start_up_samples()
    path = tmp_path / "profile.json"
    save_profile(path, fingerprint=fingerprint(), base_chunk_tokens=4096, model=TRUE, samples=samples)
    loaded = load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=4096)
    assert loaded == [(int(c), int(h), float(ms)) for c, h, ms in samples]
    assert json.loads(path.read_text())["schema_version"] == PROFILE_SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left


def test_a_missing_file_is_quietly_absent(tmp_path, warnings_logged):
    assert load_profile(tmp_path / "none.json", fingerprint=fingerprint(), base_chunk_tokens=8192) is None
    device = Device()
    model, _, _ = start(tmp_path, device)
    assert model is not None and device.runs > 0 and not warnings_logged


def test_another_setup_does_not_reuse_the_profile(cached, warnings_logged):
    other = fingerprint(tensor_parallel_size=8)
    assert cache_file(str(cached), other) != profile_file(cached)
    device = Device()
    start(cached, device, fingerprint=other)
    assert device.runs > 0 and not warnings_logged  # another file: nothing to ignore
    with pytest.raises(ProfileCacheError, match="fingerprint"):
        load_profile(profile_file(cached), fingerprint=other, base_chunk_tokens=BASE_CHUNK_TOKENS)


def test_another_base_chunk_does_not_reuse_the_profile(cached, warnings_logged):
    device = Device()
    model, _, source = start(cached, device, base_chunk_tokens=4096)
    assert device.runs > 0 and model is not None and "saved to" in source
    assert len(warnings_logged) == 1 and "base_chunk_size" in warnings_logged[0]


# ---------------------------------------------------------------- the file's coefficients are never trusted
@pytest.mark.parametrize(
    "coefficients",
    [
        {"c0_ms": 5.0, "c1_ms": 0.02, "c2_ms": 0.002, "c3_ms": 2e-6, "c4_ms": 1e9},
        {"c0_ms": 5.0, "c1_ms": 1e308, "c2_ms": 0.0, "c3_ms": 1e308, "c4_ms": 1e308},
        None,
    ],
    ids=["c4=1e9", "c1=c3=c4=1e308", "missing"],
)
def test_the_files_coefficients_are_never_used_the_samples_are_fitted_again(cached, warnings_logged, coefficients):
    path = profile_file(cached)
    edit(path, lambda data: data.update(coefficients=coefficients))
    device = Device()
    model, samples, _ = start(cached, device)
    assert device.runs == 0 and not warnings_logged
    assert model == accept(samples, **DOMAIN)
    assert model.time_ms(8192, 65_536) == pytest.approx(TRUE.time_ms(8192, 65_536), rel=0.03)


# ---------------------------------------------------------------- a bad cache: one warning, a new profile
def set_latencies(value):
    def change(data):
        data["samples"] = [[c, h, value] for c, h, _ in data["samples"]]

    return change


def as_text(change):
    def mutate(raw: bytes) -> bytes:
        data = json.loads(raw)
        change(data)
        return json.dumps(data).encode()

    return mutate


BAD_FILES = {
    # samples that a fresh profile would not pass
    "flat-latencies": (as_text(set_latencies(50.0)), "quadratic"),
    "latency-1e308": (as_text(set_latencies(1e308)), "latency"),
    "five-samples": (as_text(lambda data: data.update(samples=data["samples"][:5])), "distinct"),
    # a file that is not our profile
    "truncated": (lambda raw: raw[: len(raw) // 2], "JSONDecodeError"),
    "not-an-object": (lambda raw: b"[1, 2, 3]", "JSON object"),
    "other-schema": (as_text(lambda data: data.update(schema_version=99)), "schema_version"),
    "other-fingerprint-inside": (
        as_text(lambda data: data["fingerprint"].update(tensor_parallel_size=8)),
        "fingerprint",
    ),
    "samples-not-a-list": (as_text(lambda data: data.update(samples={"a": 1})), "list"),
    "too-many-samples": (
        as_text(lambda data: data.update(samples=data["samples"] * (MAX_PROFILE_SAMPLES // len(data["samples"]) + 1))),
        "at most",
    ),
    "sample-as-text": (as_text(lambda data: data["samples"].__setitem__(3, "8192 0 50")), "numbers"),
    # input built to break a reader
    "nested-100k-deep": (lambda raw: b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
    "not-utf-8": (lambda raw: raw.replace(b'"model"', b'"mod\xff\xfeel"'), "UnicodeDecodeError"),
}


HUGE_CHUNK = pytest.param(
    as_text(lambda data: data["samples"].__setitem__(3, [10**400, 0, 50.0])),
    "numbers",
    id="chunk-of-400-digits",
)


@pytest.mark.parametrize(
    "mutate, cause", [*(pytest.param(*case, id=name) for name, case in BAD_FILES.items()), HUGE_CHUNK]
)
def test_a_bad_cache_file_is_ignored_with_one_warning_and_profiled_again(cached, warnings_logged, mutate, cause):
    path = profile_file(cached)
    path.write_bytes(mutate(path.read_bytes()))
    device = Device()
    model, samples, source = start(cached, device)
    assert len(warnings_logged) == 1, warnings_logged
    assert "ignoring cached profile" in warnings_logged[0] and cause in warnings_logged[0]
    assert device.runs == len(samples) + cpp_profiling.WARMUP_RUNS and "saved to" in source
    assert model == accept(samples, **DOMAIN)
    # The new profile replaced the bad file: the next start reuses it.
    assert load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS) == samples


def deny(monkeypatch, method, path):
    """Path.<method> raises PermissionError for ``path`` (chmod 000 does not stop root, who may run this)."""
    original = getattr(Path, method)

    def denied(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, method, denied)


@pytest.mark.parametrize("method", ["open", "exists"], ids=["unreadable-file", "unreadable-folder"])
def test_an_unreadable_cache_is_ignored_with_one_warning_and_profiled_again(
    cached, warnings_logged, monkeypatch, method
):
    path = profile_file(cached)
    deny(monkeypatch, method, path)
    device = Device()
    model, _, _ = start(cached, device)
    assert model is not None and device.runs > 0
    assert len(warnings_logged) == 1 and "PermissionError" in warnings_logged[0]


class CountingReader:
    """A binary file that counts the bytes handed out."""

    def __init__(self, handle, counter):
        self.handle, self.counter = handle, counter

    def read(self, size=-1):
        data = self.handle.read(size)
        self.counter.append(len(data))
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def test_a_48_mb_cache_file_is_refused_after_reading_only_the_limit(cached, warnings_logged, monkeypatch):
    path = profile_file(cached)
    with path.open("r+b") as handle:
        handle.truncate(48 << 20)  # sparse: cheap to make
    counter = []
    original_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: CountingReader(original_open(self, *a, **k), counter))
    with pytest.raises(ProfileCacheError, match="larger than"):
        load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS)
    assert sum(counter) == MAX_PROFILE_BYTES + 1


def test_a_folder_at_the_cache_path_is_refused_and_saving_over_it_leaves_nothing_behind(cached, warnings_logged):
    path = profile_file(cached)
    path.unlink()
    path.mkdir()
    with pytest.raises(ProfileCacheError, match="not a regular file"):
        load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS)
    with pytest.raises(OSError):
        save_profile(path, fingerprint=fingerprint(), base_chunk_tokens=8192, model=TRUE, samples=start_up_samples())
    assert sorted(p.name for p in cached.iterdir()) == [path.name]  # no orphan .tmp
    device = Device()
    model, _, source = start(cached, device)  # profiles, cannot save, serves with the new model
    assert model is not None and device.runs > 0 and "saved" not in source
    assert len(warnings_logged) == 2
    assert "ignoring cached profile" in warnings_logged[0] and "could not save" in warnings_logged[1]
    assert sorted(p.name for p in cached.iterdir()) == [path.name]
