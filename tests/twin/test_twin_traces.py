"""Trace workloads (twin/traces.py): reading both formats, slicing, prefix hits, load scaling, and bad input."""

from __future__ import annotations

import inspect
import json
from contextlib import closing
from pathlib import Path

import pytest
from vllm_ascend_patchset.paths import DATA_DIR
from vllm_ascend_patchset.twin.surface import SYNTHETIC, QuadraticSurface
from vllm_ascend_patchset.twin.traces import (
    TraceRecord,
    TraceSlice,
    cached_prefix_tokens,
    parse_trace_item,
    read_trace,
    trace_workload,
)
from vllm_ascend_patchset.twin.workloads import (
    TRACE_BLOCK_TOKENS,
    RequestSpec,
    Workload,
    prefill_tokens_per_s,
    prompt_token_ids,
)

MOONCAKE = DATA_DIR / "traces" / "mooncake.jsonl"
AZURE = DATA_DIR / "traces" / "azure_code.csv"
CACHE_BLOCK = 128


def blocks(tokens: int, first_id: int) -> list[int]:
    return list(range(first_id, first_id + -(-tokens // TRACE_BLOCK_TOKENS)))


def mooncake_line(stamp: float, tokens: int, output: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": stamp, "input_length": tokens, "output_length": output, "hash_ids": ids})


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def build(
    path: Path, start: int = 0, count: int = 3, load: float = 0.5, surface=SYNTHETIC, stages: int = 4, **kwargs
) -> Workload:
    options = {"reference_chunk_tokens": 8192, "cache_block_tokens": CACHE_BLOCK, "max_request_tokens": 1 << 20}
    return trace_workload(surface, stages, TraceSlice(path, start, count), load, **{**options, **kwargs})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("t.jsonl", ("t.jsonl", 0, 24)),
        ("t.jsonl@5", ("t.jsonl", 5, 24)),
        ("t.jsonl@5:8", ("t.jsonl", 5, 8)),
        ("dir@v2/t.jsonl@3:4", ("dir@v2/t.jsonl", 3, 4)),
        ("dir@v2/t.jsonl", ("dir@v2/t.jsonl", 0, 24)),
    ],
)
def test_a_trace_item_names_the_file_and_the_slice(text, expected):
    trace = parse_trace_item(text, default_count=24)
    assert (str(trace.path), trace.start, trace.count) == expected


@pytest.mark.parametrize("text", ["t.jsonl@5:", "t.jsonl@:5", "t.jsonl@5:0"])
def test_a_malformed_slice_says_what_to_give(text):
    with pytest.raises(ValueError, match=r"START or START:COUNT|COUNT must be >= 1"):
        parse_trace_item(text, default_count=24)


def test_slicing_picks_the_requests_by_position_in_the_file(tmp_path):
    lengths = [100 + i for i in range(8)]
    lines = [mooncake_line(10.0 * i, n, 2, blocks(n, 10 * i)) for i, n in enumerate(lengths)]
    lines.insert(3, "")  # a blank line is not a request
    path = write(tmp_path, "t.jsonl", lines)
    workload = build(path, start=2, count=4)
    assert [r.req_id for r in workload.requests] == ["t00002", "t00003", "t00004", "t00005"]
    assert [r.prompt_tokens for r in workload.requests] == lengths[2:6]
    assert workload.requests[0].arrival_ms == 0.0  # times start at the slice's first request
    assert workload.name == "t-s2-n4-load0.5"


def test_the_committed_traces_read_in_both_formats():
    moon = read_trace(MOONCAKE, 400)
    assert len(moon) == 400 and (moon[0].input_tokens, moon[0].output_tokens) == (40160, 6)
    assert all(len(r.block_ids) == -(-r.input_tokens // TRACE_BLOCK_TOKENS) for r in moon)
    azure = read_trace(AZURE, 3)
    assert [(r.input_tokens, r.output_tokens) for r in azure] == [(4808, 10), (3180, 8), (110, 27)]
    # 18:17:03.9799600 -> 18:17:04.0319600: a 52 ms gap, seven fraction digits read exactly.
    assert azure[1].timestamp_ms - azure[0].timestamp_ms == pytest.approx(52.0, abs=1e-6)
    assert azure[0].block_ids == ()


def test_the_format_is_told_by_content_when_the_suffix_says_nothing(tmp_path):
    moon = write(tmp_path, "requests.txt", [mooncake_line(0, 600, 3, [1, 2])])
    assert read_trace(moon, 1)[0].block_ids == (1, 2)
    azure = write(tmp_path, "azure.log", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03,700,4"])
    assert read_trace(azure, 1)[0].input_tokens == 700
    other = write(tmp_path, "other.txt", ["time;tokens"])
    with pytest.raises(ValueError, match=r"other.txt: not a trace this twin reads: give a Mooncake JSONL"):
        read_trace(other, 1)


GOOD = mooncake_line(0, 600, 3, [1, 2])


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"t.jsonl:2: not JSON"),
        ('{"timestamp": 1, "input_length": 5}', r"t.jsonl:2: each line must be an object with timestamp"),
        (mooncake_line(-1, 600, 3, [1, 2]), r"t.jsonl:2: timestamp -1 must be a finite number"),
        (mooncake_line(1, 0, 3, []), r"t.jsonl:2: input_length 0 must be a whole number >= 1"),
        (mooncake_line(1, 600, 2.5, [1, 2]), r"t.jsonl:2: output_length 2.5 must be a whole number >= 0"),
        (mooncake_line(1, 600, 3, [1]), r"t.jsonl:2: 1 hash_ids for input_length 600; give one id per 512-token"),
        (mooncake_line(1, 600, 3, [1, -2]), r"t.jsonl:2: a hash_ids entry -2 must be a whole number >= 0"),
        # numbers and nesting built to break a reader: named by file and line, never a traceback
        (mooncake_line(1, 10**400, 3, []), r"t.jsonl:2: input_length 1000000\d* must be a whole number"),
        (mooncake_line(10**400, 600, 3, [1, 2]), r"t.jsonl:2: timestamp 1000\d* must be a finite number"),
        ('{"timestamp": 1, "input_length": 1' + "0" * 5000 + "}", r"t.jsonl:2: unreadable .* thousands of digits"),
        ("[" * 100_000 + "]" * 100_000, r"t.jsonl:2: unreadable request object \(RecursionError\)"),
    ],
)
def test_a_bad_mooncake_line_is_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "t.jsonl", [GOOD, line, GOOD])
    with pytest.raises(ValueError, match=message):
        build(path)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["TIMESTAMP,Context,GeneratedTokens"], r"a.csv:1: header lacks ContextTokens"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "16/11/2023 18:17,5,5"], r"a.csv:2: TIMESTAMP '16/11/2023"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.5,x,5"], r"a.csv:2: ContextTokens 'x'"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03,-10,5"], r"a.csv:2: ContextTokens '-10'"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03,5"], r"a.csv:2: 2 value\(s\), the header"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens", '1,"' + "x" * 200_000 + '",5'], r"a.csv:2: not a CSV row"),
        (['TIMESTAMP,"' + "x" * 200_000 + '",GeneratedTokens'], r"a.csv:1: not a CSV row"),
    ],
)
def test_a_bad_azure_line_is_named_by_file_and_line(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message):
        build(write(tmp_path, "a.csv", lines), count=1)


def test_a_slice_past_the_end_or_without_spread_is_refused(tmp_path):
    path = write(tmp_path, "t.jsonl", [GOOD, GOOD, GOOD])
    with pytest.raises(ValueError, match=r"the trace has 3 request\(s\), the slice needs 5; give a smaller START"):
        build(path, start=1, count=4)
    with pytest.raises(ValueError, match="every request has the same timestamp"):
        build(path, count=3)
    with pytest.raises(ValueError, match=r"no such file"):
        build(tmp_path / "missing.jsonl")


def test_timestamps_that_go_back_or_cannot_be_scaled_to_the_load_are_refused(tmp_path):
    # prefix hits and arrivals follow the file's order, so a later line may not arrive earlier
    backwards = write(tmp_path, "b.jsonl", [mooncake_line(1000, 600, 3, [1, 2]), mooncake_line(0, 600, 3, [1, 2])])
    with pytest.raises(
        ValueError, match=r"b.jsonl:2: timestamp 0.000 ms is before line 1's 1000.000; .*sort it by timestamp"
    ):
        build(backwards, count=2)
    # a span so small (or a load so low) that the scaled arrivals are not finite: an error, not a hang
    tiny = write(tmp_path, "t.jsonl", [mooncake_line(0, 600, 3, [1, 2]), mooncake_line(1e-310, 600, 3, [3, 4])])
    with pytest.raises(ValueError, match=r"cannot be scaled to that load"):
        build(tiny, count=2)
    spread = write(tmp_path, "s.jsonl", [mooncake_line(0, 600, 3, [1, 2]), mooncake_line(500, 600, 3, [3, 4])])
    with pytest.raises(ValueError, match=r"at --load 9.99989e-321: .* cannot be scaled"):
        build(spread, count=2, load=1e-320)
    with pytest.raises(ValueError, match=r"at --load 1e-12: .* spread over more than 1e\+06 s"):
        build(spread, count=2, load=1e-12)  # finite, but a replay of 10^13 s is a typo
    assert [r.arrival_ms for r in build(spread, count=2).requests][0] == 0.0
    # epoch milliseconds one apart read apart in the message
    close = write(tmp_path, "c.jsonl", [mooncake_line(1234568, 600, 3, [1, 2]), mooncake_line(1234567, 600, 3, [3, 4])])
    with pytest.raises(ValueError, match=r"timestamp 1234567.000 ms is before line 1's 1234568.000"):
        build(close, count=2)


def test_a_directory_or_a_negative_slice_is_named_for_what_it_is(tmp_path):
    with pytest.raises(ValueError, match=r"not a regular file"):
        build(tmp_path)
    with pytest.raises(ValueError, match=r"the slice after @ must be START or START:COUNT, whole numbers"):
        parse_trace_item(f"{tmp_path}/t.jsonl@-1:5", 4)
    with pytest.raises(ValueError, match=r"the slice after @ must be START or START:COUNT"):
        parse_trace_item("t.jsonl@1.5", 4)
    assert parse_trace_item("runs@home/t.jsonl", 4).path.name == "t.jsonl"  # an @ in the path is the path's


def test_a_byte_order_mark_is_read_past(tmp_path):
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:50.9951690,396,109",
    ]
    path = tmp_path / "bom.csv"
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    assert [r.prompt_tokens for r in build(path, count=2).requests] == [374, 396]


def test_equal_block_ids_give_equal_tokens_and_the_last_block_may_be_cut():
    full = RequestSpec("a", 0.0, 3 * TRACE_BLOCK_TOKENS, 1, prefix_group=0, block_ids=(7, 8, 9))
    partial = RequestSpec("b", 0.0, 2 * TRACE_BLOCK_TOKENS + 100, 1, prefix_group=1, block_ids=(7, 8, 9))
    other = RequestSpec("c", 0.0, 2 * TRACE_BLOCK_TOKENS, 1, prefix_group=2, block_ids=(7, 5))
    a, b, c = (prompt_token_ids(spec, seed) for spec, seed in ((full, 0), (partial, 1), (other, 2)))
    assert len(b) == 2 * TRACE_BLOCK_TOKENS + 100 and b == a[: len(b)]  # a block ignores the workload seed
    assert c[:TRACE_BLOCK_TOKENS] == a[:TRACE_BLOCK_TOKENS]
    assert c[TRACE_BLOCK_TOKENS:] != a[TRACE_BLOCK_TOKENS : 2 * TRACE_BLOCK_TOKENS]
    assert all(1 <= t < 1000 for t in a)


def record(index: int, tokens: int, ids: list[int]) -> TraceRecord:
    return TraceRecord(index, index + 1, float(index), tokens, 1, tuple(ids))


def test_expected_prefix_hits_follow_shared_leading_blocks_by_hand():
    records = [
        record(0, 1500, [1, 2, 3]),  # blocks of 512, 512, 476 tokens
        record(1, 1200, [1, 2, 4]),  # shares 1024 tokens with 0
        record(2, 1400, [1, 2, 3]),  # shares 1024 + 376 = 1400, but never its last token: 10 blocks of 128
        record(3, 100, [5]),  # nothing in common
        record(4, 300, [1]),  # 300 shared tokens in block 1: 2 whole cache blocks
        record(5, 2000, [1, 2, 3, 9]),  # the longest donor of block 3 has 476 tokens: 1500 shared
        record(6, 700, [2, 1]),  # same ids, other order: no shared prefix
    ]
    assert cached_prefix_tokens(records, CACHE_BLOCK) == [0, 1024, 1280, 0, 256, 1408, 0]


def test_load_scaling_offers_the_intended_prefill_work_counting_only_uncached_tokens(tmp_path):
    stamps = [0.0, 30.0, 40.0, 100.0, 250.0]
    lengths = [4096, 6000, 4096, 3000, 5000]
    ids = [blocks(4096, 0), blocks(6000, 100), blocks(4096, 0), blocks(3000, 200), blocks(4096, 0) + [300, 301]]
    path = write(tmp_path, "t.jsonl", [mooncake_line(*a) for a in zip(stamps, lengths, [4] * 5, ids, strict=True)])
    for load in (0.5, 0.8, 0.95):
        workload = build(path, count=5, load=load)
        arrivals = [r.arrival_ms for r in workload.requests]
        # Gaps keep the trace's shape.
        assert arrivals == pytest.approx([s * arrivals[-1] / stamps[-1] for s in stamps], abs=1e-3)
        cached = [0, 0, 4095 // 128 * 128, 0, 4096]
        work = [n - c for n, c in zip(lengths, cached, strict=True)]
        history = sum((n + c) / 2 for n, c in zip(lengths, cached, strict=True)) / 5
        capacity = prefill_tokens_per_s(SYNTHETIC, 4, 8192, int(history))
        # Mixed's rule: the mean gap is the mean prompt work over load x capacity.
        offered_per_s = sum(work) / 5 / (arrivals[-1] / 4 / 1000.0)
        assert offered_per_s == pytest.approx(load * capacity, rel=1e-5)  # arrivals kept to the microsecond
        assert f"{sum(cached)} of them expected prefix hits" in workload.notes[0]


def test_load_capacity_is_the_surface_s_so_a_slower_surface_spreads_arrivals(tmp_path):
    path = write(tmp_path, "t.jsonl", [mooncake_line(10.0 * i, 2048, 2, blocks(2048, 10 * i)) for i in range(4)])
    slow = QuadraticSurface(*(2 * c for c in SYNTHETIC.coefficients))
    fast, slower = (build(path, count=4, load=0.8, surface=surface) for surface in (SYNTHETIC, slow))
    assert slower.requests[-1].arrival_ms == pytest.approx(2 * fast.requests[-1].arrival_ms, rel=1e-3)


def test_outputs_are_the_trace_s_capped_and_long_requests_are_skipped_with_a_note(tmp_path):
    lines = [mooncake_line(0, 600, 300, [1, 2]), mooncake_line(5, 5000, 0, blocks(5000, 10))]
    lines += [mooncake_line(9, 700, 20, [3, 4])]
    path = write(tmp_path, "t.jsonl", lines)
    assert [r.max_output_tokens for r in build(path).requests] == [300, 1, 20]
    capped = build(path, output_cap=64)
    assert [r.max_output_tokens for r in capped.requests] == [64, 1, 20]
    assert "1 request(s) with 0 output tokens replayed with 1" in " ".join(capped.notes)
    short = build(path, max_request_tokens=1000)
    assert [r.req_id for r in short.requests] == ["t00000", "t00002"]
    assert "skipped 1 request(s) longer than the twin's model takes (1000 tokens, prompt + output): 1 (line 2)" in (
        " ".join(short.notes)
    )
    with pytest.raises(ValueError, match="every request was skipped"):
        build(path, max_request_tokens=100)


def test_azure_requests_share_no_prefix():
    workload = build(AZURE, count=6, stages=2)
    ids = [prompt_token_ids(spec, 0)[:128] for spec in workload.requests]
    assert len({tuple(i) for i in ids}) == 6
    assert "0 of them expected prefix hits" in workload.notes[0]


# Streaming: a slice reads only its own records.


def _counting(monkeypatch, module, name: str) -> list[int]:
    """Counts the calls of ``module.name`` (a parser of one record's fields)."""
    calls = [0]
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_slice_at_the_end_of_a_large_trace_reads_only_its_own_records(tmp_path, monkeypatch):
    """Every earlier record used to be parsed and kept: a slice at the end of a 1M-line file took 3.5 GB."""
    from vllm_ascend_patchset.twin import traces

    lines = 20_000
    path = write(tmp_path, "big.jsonl", [mooncake_line(i, 600, 3, [2 * i, 2 * i + 1]) for i in range(lines)])
    assert inspect.isgenerator(traces.trace_records(path))
    parsed = _counting(monkeypatch, traces.json, "loads")
    workload = build(path, start=lines - 4, count=4)
    assert [r.req_id for r in workload.requests] == [f"t{i:05d}" for i in range(lines - 4, lines)]
    assert parsed[0] == 4, "only the slice's lines are parsed"
    with closing(traces.trace_records(path)) as records:
        assert next(records).index == 0 and parsed[0] == 5, "a generator reads a record when asked for it"

    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:{i // 60 % 60:02d}:{i % 60:02d},{100 + i},5" for i in range(3600)]
    stamps = _counting(monkeypatch, traces, "_wall_clock_ms")
    azure = build(write(tmp_path, "big.csv", rows), start=3597, count=3)
    assert [r.prompt_tokens for r in azure.requests] == [3697, 3698, 3699] and stamps[0] == 3


def test_before_the_slice_records_are_counted_not_read(tmp_path):
    """A bad record (or a byte-order mark) before the slice does not stop a slice without it; in it, it does."""
    lines = [
        mooncake_line(0, 600, 3, [1, 2]),
        "{not json",
        mooncake_line(1, 600, 3, [3, 4]),
        mooncake_line(2, 5, 3, []),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\ufeff" + "\n\n".join(lines) + "\n", encoding="utf-8")  # blank lines are not records
    assert [r.prompt_tokens for r in build(path, start=2, count=2, load=0.5).requests] == [600, 5]
    with pytest.raises(ValueError, match=r"t.jsonl:3: not JSON"):
        build(path, start=1, count=2)
    assert build(path, start=0, count=1).requests[0].block_ids == (1, 2)  # the mark is read past
    with pytest.raises(ValueError, match=r"the trace has 4 request\(s\), the slice needs 11; give a smaller START"):
        build(path, start=10, count=1)
