"""The measured gate's cache: keyed like the CPP profile, written atomically, untrusted on read."""

from __future__ import annotations

import json
import os

import pytest
from vllm_ascend.deployment import make_fingerprint
from vllm_ascend.dual_stream import measured_store
from vllm_ascend.dual_stream.measured import MeasuredGate, Probe, size_classes
from vllm_ascend.dual_stream.measured_store import MeasuredCacheError, cache_file, fingerprint, load, save

CLASSES = size_classes(8192)
DEPLOYMENT = make_fingerprint(
    model="Qwen/Qwen3-32B", dtype="bfloat16", quantization=None, tensor_parallel_size=2, pipeline_parallel_size=1,
    max_num_batched_tokens=8192, block_size=128, vllm_version="0.23.0", vllm_ascend_version="0.23.0+cpp.ds1",
    device_name="A2", cann_version="/usr/local/Ascend/ascend-toolkit/8.3.0",
)  # fmt: skip
KEY = fingerprint(DEPLOYMENT, split_strategy="token_balanced", balance_threshold=1.0, classes=CLASSES, repeats=2)
PROBES = [Probe(128, 1.0, 1.1), Probe(128, 1.0, 1.2), Probe(4096, 2.0, 1.5), Probe(4096, 2.0, 1.4)]


def _load(path, key=KEY):
    return load(path, key=key, classes=CLASSES, repeats=2)


def test_a_saved_cache_loads_the_same_probes_and_leaves_no_temporary_file(tmp_path):
    path = cache_file(str(tmp_path / "cache"), KEY)
    save(path, key=KEY, probes=PROBES)
    assert _load(path) == PROBES
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert path.name.startswith("dual-stream-probes-") and path.suffix == ".json"


def test_no_file_is_none(tmp_path):
    assert _load(tmp_path / "absent.json") is None


@pytest.mark.parametrize(
    "change",
    [
        dict(tensor_parallel_size=4),
        dict(model="Qwen/Qwen3-8B"),
        dict(vllm_ascend_version="0.23.0+cpp.ds2"),
        dict(device_name="A3"),
        dict(max_num_batched_tokens=16384),
    ],
)
def test_every_part_of_the_deployment_keys_the_file(tmp_path, change):
    other = fingerprint({**DEPLOYMENT, **change}, split_strategy="token_balanced", balance_threshold=1.0,
                        classes=CLASSES, repeats=2)  # fmt: skip
    assert cache_file(str(tmp_path), other) != cache_file(str(tmp_path), KEY)
    path = tmp_path / "probes.json"
    save(path, key=KEY, probes=PROBES)
    with pytest.raises(MeasuredCacheError, match="fingerprint differs"):
        _load(path, key=other)


@pytest.mark.parametrize("split", [dict(split_strategy="half_batch"), dict(balance_threshold=0.5), dict(repeats=3)])
def test_the_split_rules_key_the_file_too(split):
    rules = dict(split_strategy="token_balanced", balance_threshold=1.0, classes=CLASSES, repeats=2) | split
    assert fingerprint(DEPLOYMENT, **rules) != KEY


def _write(path, data):
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _valid():
    return {"schema_version": 1, "fingerprint": KEY, "probes": [[p.size_class, p.single_s, p.dual_s] for p in PROBES]}


@pytest.mark.parametrize(
    "data, reason",
    [
        ("{not json", "JSONDecodeError"),
        (b'{"probes": "\xff"}', "UnicodeDecodeError"),
        ("[]", "not a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "RecursionError"),
        (_valid() | {"schema_version": 2}, "schema_version 2 != 1"),
        (_valid() | {"schema_version": True}, "schema_version True != 1"),
        ("null", "JSON null"),
        (_valid() | {"probes": {"128": [1, 1]}}, "probes must be a list of at most 12 entries"),
        (_valid() | {"probes": [[128, 1.0, 1.0]] * 13}, "at most 12 entries"),
        (_valid() | {"probes": [[100, 1.0, 1.0]]}, "size class 100 is not one of"),
        (_valid() | {"probes": [[128, 1.0]]}, "must be [size_class, single_s, dual_s] numbers"),
        (_valid() | {"probes": [[128, True, 1.0]]}, "must be [size_class, single_s, dual_s] numbers"),
        (_valid() | {"probes": [[128, "1.0", 1.0]]}, "must be [size_class, single_s, dual_s] numbers"),
        (_valid() | {"probes": [[128, 0.0, 1.0]]}, "a probe time must be in [1e-06, 3600] s (no forward of a probe"),
        (_valid() | {"probes": [[128, 1.0, 1e-300]]}, "batch takes less or more), got 1e-300"),
        (_valid() | {"probes": [[128, 9.9e-7, 1.0]]}, "got 9.9e-07"),
        (_valid() | {"probes": [[128, -1.0, 1.0]]}, "a probe time must be in"),
        (_valid() | {"probes": [[128, 1.0, 1e9]]}, "a probe time must be in"),
        (json.dumps(_valid()).replace("1.1", "NaN"), "a probe time must be in"),
        (json.dumps(_valid()).replace("1.1", "1" + "0" * 400), "a probe time must be in"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_an_unusable_file_is_refused_naming_why(tmp_path, data, reason):
    path = _write(tmp_path / "probes.json", data)
    with pytest.raises(MeasuredCacheError) as info:
        _load(path)
    assert reason in str(info.value)


def test_an_oversized_or_odd_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(measured_store, "MAX_BYTES", 64)
    path = _write(tmp_path / "probes.json", json.dumps(_valid()))
    with pytest.raises(MeasuredCacheError, match="larger than"):
        _load(path)
    os.remove(path)
    path.mkdir()
    with pytest.raises(MeasuredCacheError, match="not a regular file"):
        _load(path)


def test_the_decision_is_made_from_the_probes_not_read_from_the_file(tmp_path):
    """A file can say what it likes about the outcome: only its probes count, and they decide as fresh ones do."""
    data = _valid() | {"crossover": 128, "decision": "dual stream everywhere"}
    path = _write(tmp_path / "probes.json", data)
    with pytest.raises(MeasuredCacheError, match="fingerprint"):
        _load(path, key=KEY | {"extra": 1})
    probes = _load(path)
    gate = MeasuredGate(CLASSES, 2, probes)
    assert gate.crossover() == 4096 and gate.route(5000) == "dual"
    assert gate.route(200) == "single" and gate.route(300) == "probe", "128 measured slower, 256 not measured"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "probes.json"
    save(path, key=KEY, probes=PROBES)

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(measured_store.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        save(path, key=KEY, probes=PROBES[:1])
    monkeypatch.undo()
    assert _load(path) == PROBES and [p.name for p in tmp_path.iterdir()] == ["probes.json"]


def test_each_pipeline_stage_keeps_its_own_probes():
    """Under PP > 1 a stage measures its own layers: its key, and so its file, differ from the other stage's."""
    rules = dict(split_strategy="token_balanced", balance_threshold=1.0, classes=CLASSES, repeats=2)
    stage0, stage1 = (fingerprint(DEPLOYMENT, stage=s, **rules) for s in (0, 1))
    assert len({json.dumps(k, sort_keys=True) for k in (KEY, stage0, stage1)}) == 3
    assert stage0["dual_stream"]["pipeline_stage"] == 0 and "pipeline_stage" not in KEY["dual_stream"]


def test_times_below_a_microsecond_are_broken_data_not_a_win_for_dual_stream(tmp_path):
    """A forward of a probe batch cannot take 1e-300 s: such a file would turn dual stream on for every class."""
    tiny = _valid() | {"probes": [[c, 1.0, 1e-300] for c in CLASSES[:6]]}
    with pytest.raises(MeasuredCacheError, match="a probe time must be in"):
        _load(_write(tmp_path / "probes.json", tiny))
    floor = _valid() | {"probes": [[128, 1.0, measured_store.MIN_PROBE_SECONDS]]}
    assert _load(_write(tmp_path / "probes.json", floor)) == [Probe(128, 1.0, 1e-6)], "the floor itself is a time"


@pytest.mark.parametrize(
    "probes, start",
    [
        ([[128, [1.0] * 150_000, 1.0]], "a probe must be [size_class, single_s, dual_s] numbers, got [128, [1.0, "),
        ([[128, "x" * 900_000, 1.0]], "a probe must be [size_class, single_s, dual_s] numbers, got [128, 'xxx"),
        ([[int("9" * 4000), 1.0, 1.0]], "size class <an integer of about 4000 digits> is not one of"),
        ([[128, 1.0, int("9" * 4000)]], "a probe time must be in"),
    ],
    ids=["long list", "long string", "long class", "long time"],
)
def test_a_hand_edited_row_of_any_size_gives_a_short_message(tmp_path, probes, start):
    path = _write(tmp_path / "probes.json", _valid() | {"probes": probes})
    with pytest.raises(MeasuredCacheError) as info:
        _load(path)
    message = str(info.value)
    assert message.startswith(start) and len(message) <= measured_store.MAX_MESSAGE_CHARS, message[:1000]


def test_a_huge_schema_version_is_quoted_as_an_excerpt(tmp_path):
    path = _write(tmp_path / "probes.json", _valid() | {"schema_version": "v" * 500_000})
    with pytest.raises(MeasuredCacheError) as info:
        _load(path)
    assert str(info.value).startswith("schema_version 'vvv") and len(str(info.value)) < 300


def test_a_refused_file_is_one_short_warning_naming_it_and_the_gate_measures_again(tmp_path, monkeypatch):
    from vllm_ascend.dual_stream import measured_group

    warnings = []
    monkeypatch.setattr(measured_group.logger, "warning", lambda text, *args: warnings.append(text % args))
    for name, probes in (("huge.json", [[128, [1.0] * 150_000, 1.0]]), ("tiny.json", [[128, 1.0, 1e-300]] * 2)):
        path = _write(tmp_path / name, _valid() | {"probes": probes})
        assert measured_group._read(path, KEY, CLASSES, 2) == []
        assert MeasuredGate(CLASSES, 2, []).route(200) == "probe", "nothing adopted: the class is probed again"
    assert len(warnings) == 2 and all(len(w) < 1000 for w in warnings), [w[:300] for w in warnings]
    assert str(tmp_path / "huge.json") in warnings[0] and str(tmp_path / "tiny.json") in warnings[1]
    assert "got 1e-300" in warnings[1] and warnings[1].endswith("measuring again")
