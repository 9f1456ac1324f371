"""The cached CPP profile: untrusted input, adopted only as a fresh profile would be, and written atomically.

``initialise_profile`` is run against a fake device that times the real start-up plan
on a known surface; every bad cache ends in one warning and a new profile, never a
crash and never a model the acceptance rule would refuse.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from cpp_samples import TRUE, model_of, start_up_samples
from vllm_ascend.core import cpp_profiling
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_config import CppConfig
from vllm_ascend.core.cpp_profile_store import (
    MAX_PROFILE_BYTES,
    MAX_PROFILE_SAMPLES,
    PROFILE_SCHEMA_VERSION,
    ProfileCacheError,
    cache_file,
    load_profile,
    save_profile,
)
from vllm_ascend.deployment import make_fingerprint

BASE_CHUNK_TOKENS = 8192
MAX_HISTORY = 65_536
STAGES = 4
# A small valid profile (the ladder's powers of two, 2 histories, one pass) keeps these tests fast.
PROFILE_SETTINGS = {"profile_points": 10, "profile_repeats": 1, "profile_history_points": 2}
# The most runs of one point a fresh profile makes: a probe point's, in both rounds, and every run placing steps.
MOST_OF_ONE_POINT = cpp_profiling.PROBE_REPEATS * 2 + cpp_profiling.LOCATE_RUNS


def limits(base_chunk_tokens=BASE_CHUNK_TOKENS):
    return ChunkLimits(base_chunk_tokens=base_chunk_tokens, max_model_len=MAX_HISTORY + base_chunk_tokens)


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
    """Times each profiling run on TRUE (1% deterministic wobble) and counts the runs."""

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
    handler = Warnings()
    cpp_profiling.logger.addHandler(handler)
    yield handler.messages
    cpp_profiling.logger.removeHandler(handler)


def start(cache_dir, device, *, base_chunk_tokens=BASE_CHUNK_TOKENS, **overrides):
    """What the scheduler does at start-up: the verdict, its samples and where they came from."""
    kwargs = dict(fingerprint=fingerprint(), measure=device, max_history_tokens=MAX_HISTORY)
    kwargs.update(overrides)
    config = CppConfig(cache_dir=str(cache_dir), **PROFILE_SETTINGS)
    return cpp_profiling.initialise_profile(config, limits(base_chunk_tokens), STAGES, **kwargs)


def judged(samples):
    return judge(samples, limits(), STAGES, max_history_tokens=MAX_HISTORY, last_round=True)


def profile_file(cache_dir) -> Path:
    return cache_file(str(cache_dir), fingerprint())


def plan_of():
    return cpp_profiling.profile_plan(
        base_chunk_tokens=BASE_CHUNK_TOKENS,
        points=PROFILE_SETTINGS["profile_points"],
        repeats=PROFILE_SETTINGS["profile_repeats"],
        history_points=PROFILE_SETTINGS["profile_history_points"],
        max_history_tokens=MAX_HISTORY,
    )


def plan_runs():
    return len(plan_of())


@pytest.fixture
def cached(tmp_path):
    """A cache folder holding the profile of a first start (one profiling run)."""
    device = Device()
    first = start(tmp_path, device)
    assert first.verdict.model is not None and device.runs == len(first.samples) + cpp_profiling.WARMUP_RUNS
    assert "saved to" in first.source and profile_file(tmp_path).is_file()
    return tmp_path


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


class Liar(Device):
    """A host whose first round put a slow spell where the decisions are made; the second round is clean."""

    def __call__(self, chunk_tokens, history_tokens):
        ms = super().__call__(chunk_tokens, history_tokens)
        first_round = self.runs <= cpp_profiling.WARMUP_RUNS + plan_runs()
        return ms * (3.0 if first_round and 256 <= chunk_tokens <= 2048 and history_tokens == 0 else 1.0)


def test_a_profile_too_noisy_to_decide_is_measured_once_more_and_accepted(tmp_path, warnings_logged):
    device = Liar()
    result = start(tmp_path, device)
    assert result.verdict.model is not None and not warnings_logged
    # One more round, not more; the slow spell made a jump of its own in the first round's
    # medians, which the runs placing steps may look into.
    located = device.runs - cpp_profiling.WARMUP_RUNS - 2 * plan_runs()
    assert 0 <= located <= cpp_profiling.LOCATE_RUNS, result.verdict.model.steps
    assert result.source.startswith(f"profiled ({2 * plan_runs() + located} runs")


def test_a_broken_profile_runs_the_best_fixed_chunk_without_saving(tmp_path, warnings_logged):
    """Every run at the deepest history but the smallest and the largest size gave no measurement: no grid."""
    device = Device()
    deepest = max(h for _, h in plan_of())
    result = start(tmp_path, lambda c, h: device(c, h) * (math.nan if h == deepest and 1 < c < 4096 else 1.0))
    assert result.verdict.model is None and result.verdict.fixed_chunk_tokens is not None
    assert "no usable profile" in result.verdict.reason
    assert device.runs == plan_runs() + cpp_profiling.WARMUP_RUNS
    assert not profile_file(tmp_path).exists()


def test_a_fall_every_run_shows_is_kept_and_saved(tmp_path, warnings_logged):
    """A size that is faster than a smaller one at every run is the device's, not broken data."""
    device = Device()
    result = start(tmp_path, lambda c, h: device(c, h) * (0.3 if c == 4096 else 1.0))
    assert result.verdict.model is not None and (4096, max(h for _, h in plan_of())) in result.verdict.model.odd_points
    assert profile_file(tmp_path).exists() and not warnings_logged


def test_a_worker_that_fails_gives_upstream_behaviour_and_the_reason(tmp_path):
    def failing(chunk_tokens, history_tokens):
        raise TimeoutError("rank 3 did not answer")

    result = start(tmp_path, failing)
    assert result.verdict.model is None and result.verdict.fixed_chunk_tokens is None
    assert "TimeoutError: rank 3 did not answer" in result.verdict.reason


# ---------------------------------------------------------------- reuse
def test_a_second_start_reuses_the_profile_without_profiling(cached, warnings_logged):
    device = Device()
    first = load_profile(profile_file(cached), fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS)
    result = start(cached, device)
    assert device.runs == 0 and not warnings_logged
    assert result.source.startswith("cache") and result.samples == first
    assert result.verdict.model == judged(first).model


def test_a_cache_measured_over_too_little_history_is_profiled_again(cached, warnings_logged):
    device = Device()
    result = start(cached, device, max_history_tokens=4 * MAX_HISTORY)
    assert device.runs > 0 and result.verdict.model is not None
    assert len(warnings_logged) == 1 and "history" in warnings_logged[0]


def test_save_then_load_gives_back_the_samples(tmp_path):
    samples = start_up_samples()
    path = tmp_path / "profile.json"
    save_profile(path, fingerprint=fingerprint(), base_chunk_tokens=4096, samples=samples)
    loaded = load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=4096)
    assert loaded == [(int(c), int(h), float(ms)) for c, h, ms in samples]
    assert json.loads(path.read_text())["schema_version"] == PROFILE_SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left


def test_a_missing_file_is_quietly_absent(tmp_path, warnings_logged):
    assert load_profile(tmp_path / "none.json", fingerprint=fingerprint(), base_chunk_tokens=8192) is None
    device = Device()
    assert start(tmp_path, device).verdict.model is not None and device.runs > 0 and not warnings_logged


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
    result = start(cached, device, base_chunk_tokens=4096)
    assert device.runs > 0 and result.verdict.model is not None and "saved to" in result.source
    assert len(warnings_logged) == 1 and "base_chunk_size" in warnings_logged[0]


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


def set_sample(index, value):
    return as_text(lambda data: data["samples"].__setitem__(index, value))


def set_first_point(value):
    """Every repeat of the first history-0 point set to ``value`` (as a denormal once hung the fit)."""

    def change(data):
        first = data["samples"][0][:2]
        data["samples"] = [[c, h, value if [c, h] == first else ms] for c, h, ms in data["samples"]]

    return as_text(change)


BAD_FILES = {
    # samples that are not measurements
    "latency-denormal": (set_sample(3, [8192, 0, 1e-320]), "latency_ms"),
    "every-repeat-denormal": (set_first_point(1e-320), "latency_ms"),
    "latency-5e-324": (set_sample(3, [8192, 0, 5e-324]), "latency_ms"),
    "latency-1e308": (as_text(set_latencies(1e308)), "latency_ms"),
    "sample-as-string": (set_sample(3, "123"), "a sample is"),
    "latency-as-string": (set_sample(3, [8192, 0, "50"]), "latency_ms"),
    "bool-tokens": (set_sample(3, [True, 0, 50.0]), "chunk_tokens"),
    "fractional-tokens": (set_sample(3, [8192.5, 0, 50.0]), "chunk_tokens"),
    "float-tokens": (set_sample(3, [8192.0, 0, 50.0]), "chunk_tokens"),
    "chunk-of-400-digits": (set_sample(3, [10**400, 0, 50.0]), "chunk_tokens"),
    # samples that a fresh profile would not pass
    "five-samples": (as_text(lambda data: data.update(samples=data["samples"][:5])), "measured"),
    "no-samples": (as_text(lambda data: data.update(samples=[])), "1 to"),
    "small-chunks-only": (
        as_text(lambda data: data.update(samples=[s for s in data["samples"] if s[0] <= 64])),
        "not 1..8192",
    ),
    "deep-histories-only": (
        as_text(lambda data: data.update(samples=[[c, 2**30, ms] for c, _, ms in data["samples"]])),
        "without history",
    ),
    "two-chunk-sizes": (
        as_text(lambda data: data.update(samples=[s for s in data["samples"] if s[0] in (1, 8192)])),
        "chunk sizes",
    ),
    # more than a fresh profile of these settings makes (the judgement's cost grows with it)
    "three-rounds": (as_text(lambda data: data.update(samples=data["samples"] * 3)), "samples, more than the"),
    "one-point-repeated": (
        as_text(lambda data: data["samples"].extend([data["samples"][0]] * MOST_OF_ONE_POINT)),
        f"{1 + MOST_OF_ONE_POINT} runs of 1 tokens after 0 of history, more than the {MOST_OF_ONE_POINT}",
    ),
    # a file that is not our profile
    "truncated": (lambda raw: raw[: len(raw) // 2], "JSONDecodeError"),
    "not-an-object": (lambda raw: b"[1, 2, 3]", "JSON object"),
    "null": (lambda raw: b"null", "null"),
    "other-schema": (as_text(lambda data: data.update(schema_version=99)), "schema_version"),
    "schema-true": (as_text(lambda data: data.update(schema_version=True)), "schema_version"),
    "schema-float": (as_text(lambda data: data.update(schema_version=float(PROFILE_SCHEMA_VERSION))), "schema_version"),
    "base-chunk-float": (as_text(lambda data: data.update(base_chunk_size=8192.0)), "base_chunk_size"),
    "other-fingerprint-inside": (
        as_text(lambda data: data["fingerprint"].update(tensor_parallel_size=8)),
        "fingerprint",
    ),
    "samples-not-a-list": (as_text(lambda data: data.update(samples={"a": 1})), "list"),
    "too-many-samples": (
        as_text(lambda data: data.update(samples=data["samples"] * (MAX_PROFILE_SAMPLES // len(data["samples"]) + 1))),
        f"1 to {MAX_PROFILE_SAMPLES}",
    ),
    # input built to break a reader
    "nested-100k-deep": (lambda raw: b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
    "not-utf-8": (lambda raw: raw.replace(b'"model"', b'"mod\xff\xfeel"'), "UnicodeDecodeError"),
}


@pytest.mark.parametrize("mutate, cause", [pytest.param(*case, id=name) for name, case in BAD_FILES.items()])
def test_a_bad_cache_file_is_ignored_with_one_warning_and_profiled_again(cached, warnings_logged, mutate, cause):
    path = profile_file(cached)
    path.write_bytes(mutate(path.read_bytes()))
    device = Device()
    result = start(cached, device)
    assert len(warnings_logged) == 1, warnings_logged
    assert "ignoring cached profile" in warnings_logged[0] and cause in warnings_logged[0]
    assert device.runs == len(result.samples) + cpp_profiling.WARMUP_RUNS and "saved to" in result.source
    assert result.verdict.model == judged(result.samples).model
    # The new profile replaced the bad file: the next start reuses it.
    assert load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS) == result.samples


def test_a_small_file_repeating_one_sample_is_refused_by_name_without_reading_every_pair(tmp_path, warnings_logged):
    """A 3x2 grid and 19,994 copies of one sample (360 kB, within the file limits) once took 40 s and 10 GB to
    adopt, or failed start-up with a MemoryError at every restart; it is refused and profiled again."""
    grid = [(c, h, TRUE.time_ms(c, h)) for h in (0, MAX_HISTORY) for c in (1, 4096, BASE_CHUNK_TOKENS)]
    path = profile_file(tmp_path)
    copies = MAX_PROFILE_SAMPLES - len(grid)
    save_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS, samples=grid + grid[:1] * copies)
    device = Device()
    result = start(tmp_path, device)
    assert len(warnings_logged) == 1 and str(path) in warnings_logged[0], warnings_logged
    most = 2 * plan_runs() + cpp_profiling.after_rounds_budget([None] * plan_runs())
    assert f"{MAX_PROFILE_SAMPLES} samples, more than the {most}" in warnings_logged[0]
    assert device.runs > 0 and result.verdict.model is not None and "saved to" in result.source
    assert load_profile(path, fingerprint=fingerprint(), base_chunk_tokens=BASE_CHUNK_TOKENS) == result.samples


def test_the_largest_profile_a_fresh_start_makes_is_reused(tmp_path, warnings_logged):
    """Two rounds (a noisy host) and the runs placing a step: the most a fresh profile makes is within the bound."""
    first = start(tmp_path, Liar())
    assert first.verdict.model is not None and len(first.samples) > 2 * plan_runs() - 1
    device = Device()
    again = start(tmp_path, device)
    assert device.runs == 0 and again.source.startswith("cache") and not warnings_logged


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
    assert start(cached, device).verdict.model is not None and device.runs > 0
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
        save_profile(path, fingerprint=fingerprint(), base_chunk_tokens=8192, samples=start_up_samples())
    assert sorted(p.name for p in cached.iterdir()) == [path.name]  # no orphan .tmp
    device = Device()
    result = start(cached, device)  # profiles, cannot save, serves with the new model
    assert result.verdict.model is not None and device.runs > 0 and "saved" not in result.source
    assert len(warnings_logged) == 2
    assert "ignoring cached profile" in warnings_logged[0] and "could not save" in warnings_logged[1]
    assert sorted(p.name for p in cached.iterdir()) == [path.name]


def test_the_models_of_equal_samples_are_equal():
    samples = start_up_samples()
    assert model_of(samples) == model_of(list(samples))


def test_the_fingerprints_version_is_the_patch_sets_or_else_the_installed_packages(monkeypatch):
    """Upstream has no vllm_ascend.patchset: a profile is then keyed by the installed vllm-ascend's version."""
    import importlib.metadata
    import sys

    import vllm_ascend
    from vllm_ascend import deployment

    monkeypatch.setitem(sys.modules, "vllm_ascend.patchset", None)  # importing it raises ImportError
    monkeypatch.delattr(vllm_ascend, "patchset", raising=False)  # (as the package's attribute, once imported)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"vllm_ascend": "0.23.0"}[name])
    assert deployment._ascend_version() == "0.23.0"

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert deployment._ascend_version() == "unknown"


def test_a_fresh_profile_places_a_wave_between_its_sizes_within_the_default_run_budget(tmp_path):
    """At the default settings and base chunk the grid, the tile probe and the runs placing a
    step's jump stay within 218 runs; the saved profile gives the same model when read back."""
    from cpp_samples import Waves

    truth, runs = Waves(2560), []

    def device(chunk_tokens, history_tokens):
        runs.append((chunk_tokens, history_tokens))
        return truth.time_ms(chunk_tokens, history_tokens)

    kwargs = dict(fingerprint=fingerprint(), measure=device, max_history_tokens=MAX_HISTORY)
    config = CppConfig(cache_dir=str(tmp_path))
    result = cpp_profiling.initialise_profile(config, limits(), STAGES, **kwargs)
    model = result.verdict.model
    assert model is not None and len(runs) - cpp_profiling.WARMUP_RUNS <= 218
    assert 2560 in [model.chunk_tokens[i] for i in model.steps]
    assert result.source.startswith(f"profiled ({len(runs) - cpp_profiling.WARMUP_RUNS} runs")
    again = cpp_profiling.initialise_profile(config, limits(), STAGES, **kwargs)
    assert again.source.startswith("cache") and again.verdict.model == model


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_saved_file_gets_the_mode_the_umask_gives_not_the_temporary_files(tmp_path, umask):
    """Written through a temporary file (owner-only) and renamed, the file still gets the mode open() gives a
    new file, so a cache folder shared by several users stays readable to those the umask allows."""
    import os

    from vllm_ascend.json_file import write_json_atomically

    before = os.umask(umask)
    try:
        write_json_atomically(tmp_path / "profile.json", {"a": 1})
    finally:
        os.umask(before)
    assert (tmp_path / "profile.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert json.loads((tmp_path / "profile.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left


def test_a_temporary_file_a_killed_writer_left_is_removed_by_the_next_write_once_stale(tmp_path):
    """A writer killed between writing and renaming leaves its temporary file beside the target; the next
    write removes it once it is STALE_TMP_S old, and leaves a young one (another writer's, under way) and
    other files' temporary files alone."""
    import os

    from vllm_ascend import json_file

    stale, young = tmp_path / "profile.json1a2b.tmp", tmp_path / "profile.json3c4d.tmp"
    other = tmp_path / "probes.json5e6f.tmp"
    for leftover in (stale, young, other):
        leftover.write_text("{")
    old = os.stat(stale).st_mtime - json_file.STALE_TMP_S - 60
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    json_file.write_json_atomically(tmp_path / "profile.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probes.json5e6f.tmp", "profile.json", young.name]
