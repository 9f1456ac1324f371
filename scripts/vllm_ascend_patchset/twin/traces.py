"""Public serving traces as twin workloads: ``--workload trace:PATH[@START[:COUNT]]``.

Formats, told apart by the file's suffix (``.jsonl``/``.json``, ``.csv``), else by its
first line:

- Mooncake JSONL: one JSON object a line, ``timestamp`` (ms), ``input_length``,
  ``output_length`` (tokens), ``hash_ids`` (one id per 512-token block of the prompt,
  ceil(input_length / 512) of them; optional: without them no prompt shares a prefix).
- Azure LLM inference CSV: ``TIMESTAMP`` (wall clock ``YYYY-MM-DD HH:MM:SS[.fraction]``),
  ``ContextTokens``, ``GeneratedTokens``; no prefix information.

The slice is records START .. START+COUNT-1 in file order (0-based; a CSV header and
blank lines are not records). The file is streamed: records before the slice are counted,
not read, so a slice at the end of a large trace holds only its own records, and a bad
record before the slice does not stop a slice without it; every record of the slice is
checked, and the slice must be in arrival order. Each request keeps its prompt length, its output length
(at most ``output_cap``; 0 becomes 1: a request yields at least its first token) and its
block ids (``workloads.prompt_token_ids`` makes equal ids equal tokens, so a shared
leading run of blocks is a prefix-cache hit in the scheduler). A request longer (prompt
plus output) than the twin's model takes is skipped, with a note.

Arrival gaps keep the trace's shape, scaled by one factor so the offered prefill work is
``load`` of the pipeline's capacity, as ``workloads.mixed`` defines both: the mean gap is
the mean prompt work over ``load`` x ``prefill_tokens_per_s`` at the reference chunk and
the mean history of a computed prompt token ((cached + prompt) / 2 over requests: mixed's
half the mean prompt when nothing is cached). Prompt work counts only the tokens the prefix
cache does not hold (``cached_prefix_tokens``): a hit costs no prefill compute.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .surface import Surface
from .surface_files import csv_cells
from .workloads import TRACE_BLOCK_TOKENS, RequestSpec, Workload, prefill_tokens_per_s

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SLICE = re.compile(r"^(\d+)(?::(\d+))?$")
MAX_ARRIVAL_SPAN_S = 1e6  # a replay's arrivals spread over at most this (11.6 days); a lower load is a typo


@dataclass(frozen=True)
class TraceRecord:
    index: int  # 0-based record number in the file
    line: int  # 1-based line in the file (for messages)
    timestamp_ms: float
    input_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...] = ()  # empty: the trace says nothing about shared prefixes


@dataclass(frozen=True)
class TraceSlice:
    path: Path
    start: int
    count: int

    @property
    def label(self) -> str:
        return f"{self.path.stem}-s{self.start}-n{self.count}"


def parse_trace_item(text: str, default_count: int, max_count: int | None = None) -> TraceSlice:
    """``PATH``, ``PATH@START`` or ``PATH@START:COUNT`` (the part after ``trace:``); COUNT at most ``max_count``."""
    path_text, at, tail = text.rpartition("@")
    match = _SLICE.match(tail) if at else None
    if not at or match is None:
        if at and re.match(r"^[-+\d:.]*$", tail):
            raise ValueError(
                f"--workload trace:{path_text}@{tail!r}: the slice after @ must be START or START:COUNT, whole"
                " numbers (e.g. trace:traces.jsonl@100:32)"
            )
        path_text, start, count = text, 0, default_count
    else:
        start, count = int(match.group(1)), int(match.group(2) or default_count)
    if not path_text:
        raise ValueError("--workload trace:: give the trace file, e.g. trace:tests/data/traces/mooncake.jsonl@0:32")
    if count < 1:
        raise ValueError(f"--workload trace:{text}: COUNT must be >= 1")
    if max_count is not None and count > max_count:
        raise ValueError(
            f"--workload trace:{text}: COUNT {count} is more than a run replays ({max_count} requests at most);"
            " take a shorter slice"
        )
    return TraceSlice(Path(path_text), start, count)


def trace_format(path: Path) -> str:
    """``mooncake`` or ``azure``: by suffix, else by the first non-blank line."""
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    if path.suffix == ".csv":
        return "azure"
    with open(path, encoding="utf-8-sig") as handle:
        first = next((line.strip() for line in handle if line.strip()), "")
    if first.startswith("{"):
        return "mooncake"
    if "ContextTokens" in first:
        return "azure"
    raise ValueError(
        f"{path}: not a trace this twin reads: give a Mooncake JSONL (.jsonl, one object a line with"
        f" {', '.join(MOONCAKE_KEYS)}, hash_ids) or an Azure CSV (.csv with {', '.join(AZURE_COLUMNS)})"
    )


def trace_records(path: Path, start: int = 0) -> Iterator[TraceRecord]:
    """The file's records from the ``start``-th on, each checked as it is read (errors name file:line); the
    ones before it are counted, not read. A generator: a caller takes what it needs and nothing more is read."""
    if not path.exists():
        raise ValueError(f"--workload trace:{path}: no such file (give a Mooncake .jsonl or an Azure .csv trace)")
    if not path.is_file():
        raise ValueError(f"--workload trace:{path}: not a regular file (give a Mooncake .jsonl or an Azure .csv trace)")
    try:
        reader = _mooncake if trace_format(path) == "mooncake" else _azure
        with open(path, encoding="utf-8-sig", newline="") as handle:
            yield from reader(path, handle, start)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--workload trace:{path}: cannot read it ({exc})") from None


def read_trace(path: Path, stop: int, start: int = 0) -> list[TraceRecord]:
    """Records ``start`` .. ``stop - 1`` of the file (fewer if it has fewer), checked and in arrival order."""
    with closing(trace_records(path, start)) as records:
        picked = list(itertools.islice(records, max(stop - start, 0)))
    for before, record in zip(picked, picked[1:], strict=False):
        if record.timestamp_ms < before.timestamp_ms:  # prefix hits and arrivals follow the file's order
            raise ValueError(
                f"{path}:{record.line}: timestamp {record.timestamp_ms:.3f} ms is before line {before.line}'s"
                f" {before.timestamp_ms:.3f}; a trace lists requests in arrival order (sort it by timestamp)"
            )
    return picked


def read_slice(trace: TraceSlice) -> list[TraceRecord]:
    """The slice's records (``read_trace``); a slice past the end of the file is an error saying so."""
    records = read_trace(trace.path, trace.start + trace.count, trace.start)
    if len(records) < trace.count:
        held = trace.start + len(records) if records else _record_count(trace.path)
        raise ValueError(
            f"--workload trace:{trace.path}@{trace.start}:{trace.count}: the trace has {held} request(s),"
            f" the slice needs {trace.start + trace.count}; give a smaller START or COUNT"
        )
    return records


def _rows(handle) -> Iterator[tuple[int, str]]:
    """(line number, line) of each line that is not blank: a record, or a CSV's header."""
    return ((line_no, line) for line_no, line in enumerate(handle, 1) if line.strip())


def _record_count(path: Path) -> int:
    """Records in the file (its rows, less a CSV's header), none of them read."""
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = sum(1 for _ in _rows(handle))
    return max(rows - (trace_format(path) == "azure"), 0)


def _number(value: object) -> bool:
    """A finite int or float, not a bool (an int too large for a float is not finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _whole(value: object, where: str, name: str, low: int) -> int:
    ok = _number(value)
    if not ok or value != int(value) or value < low:
        raise ValueError(f"{where}: {name} {value!r:.40} must be a whole number >= {low}")
    return int(value)


def _mooncake(path: Path, handle, start: int) -> Iterator[TraceRecord]:
    for index, (line_no, line) in enumerate(_rows(handle)):
        if index < start:  # before the slice: counted, not read
            continue
        where = f"{path}:{line_no}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg}); each line is one request object") from None
        except (ValueError, RecursionError) as exc:  # a number of thousands of digits; nesting too deep
            why = "a number thousands of digits long" if "digits" in str(exc) else type(exc).__name__
            raise ValueError(f"{where}: unreadable request object ({why}); each line is one flat object") from None
        if not isinstance(data, dict) or any(key not in data for key in MOONCAKE_KEYS):
            raise ValueError(f"{where}: each line must be an object with {', '.join(MOONCAKE_KEYS)} (and hash_ids)")
        stamp = data["timestamp"]
        if not _number(stamp) or stamp < 0:
            raise ValueError(f"{where}: timestamp {stamp!r} must be a finite number of milliseconds >= 0")
        tokens = _whole(data["input_length"], where, "input_length", 1)
        blocks = data.get("hash_ids", [])
        if not isinstance(blocks, list):
            raise ValueError(f"{where}: hash_ids must be a list of block ids")
        ids = tuple(_whole(b, where, "a hash_ids entry", 0) for b in blocks)
        needed = -(-tokens // TRACE_BLOCK_TOKENS)
        if ids and len(ids) != needed:
            raise ValueError(
                f"{where}: {len(ids)} hash_ids for input_length {tokens}; give one id per"
                f" {TRACE_BLOCK_TOKENS}-token block, {needed} here"
            )
        output = _whole(data["output_length"], where, "output_length", 0)
        yield TraceRecord(index, line_no, float(stamp), tokens, output, ids)


def _wall_clock_ms(text: str, where: str) -> float:
    """``2023-11-16 18:17:03.9799600`` -> ms since the epoch (any number of fraction digits)."""
    stamp, _, fraction = text.strip().partition(".")
    try:
        when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
        if fraction and not fraction.isdigit():
            raise ValueError(fraction)
    except ValueError:
        raise ValueError(f"{where}: TIMESTAMP {text!r} must read YYYY-MM-DD HH:MM:SS[.fraction]") from None
    seconds = (when - datetime(1970, 1, 1)).total_seconds() + (float(f"0.{fraction}") if fraction else 0.0)
    return seconds * 1000.0


def _cell_tokens(text: str, where: str, name: str, low: int) -> int:
    try:
        return _whole(float(text), where, name, low)
    except ValueError:  # the cell as the file has it, not as a float reads it
        raise ValueError(f"{where}: {name} {text.strip()!r} must be a whole number >= {low}") from None


def _azure(path: Path, handle, start: int) -> Iterator[TraceRecord]:
    rows = _rows(handle)
    header_no, header_line = next(rows, (1, ""))
    header = [name.strip() for name in csv_cells(header_line, f"{path}:{header_no}")]
    missing = [name for name in AZURE_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{path}:{header_no}: header lacks {', '.join(missing)}; expected {','.join(AZURE_COLUMNS)}")
    stamp_at, input_at, output_at = (header.index(name) for name in AZURE_COLUMNS)
    for index, (line_no, line) in enumerate(rows):
        if index < start:  # before the slice: counted, not read
            continue
        where = f"{path}:{line_no}"
        cells = csv_cells(line, where)
        if len(cells) != len(header):
            raise ValueError(f"{where}: {len(cells)} value(s), the header names {len(header)}")
        yield TraceRecord(
            index,
            line_no,
            _wall_clock_ms(cells[stamp_at], where),
            _cell_tokens(cells[input_at], where, "ContextTokens", 1),
            _cell_tokens(cells[output_at], where, "GeneratedTokens", 0),
        )


def cached_prefix_tokens(records: list[TraceRecord], cache_block_tokens: int) -> list[int]:
    """Per request, the prompt tokens the prefix cache holds when it arrives, if every earlier request's prompt
    is cached: the longest prefix it shares with one of them, in whole cache blocks, and never its last token
    (vLLM computes at least one). Requests are taken in the order given (arrival order)."""
    root: dict = {}  # trie over block ids; each node: [longest donor block length there, children]
    out = []
    for record in records:
        lengths = _block_lengths(record)
        shared, node = 0, root
        for block_id, length in zip(record.block_ids, lengths, strict=True):
            if block_id not in node:
                break
            donor_length, node = node[block_id]
            shared += min(length, donor_length)
            if min(length, donor_length) < TRACE_BLOCK_TOKENS:
                break
        limit = (record.input_tokens - 1) // cache_block_tokens
        out.append(min(shared // cache_block_tokens, limit) * cache_block_tokens)
        node = root
        for block_id, length in zip(record.block_ids, lengths, strict=True):
            entry = node.setdefault(block_id, [0, {}])
            entry[0] = max(entry[0], length)
            node = entry[1]
    return out


def _block_lengths(record: TraceRecord) -> list[int]:
    """Tokens of each block of the prompt: full blocks, the last one cut by input_tokens."""
    return [min(TRACE_BLOCK_TOKENS, record.input_tokens - i * TRACE_BLOCK_TOKENS) for i in range(len(record.block_ids))]


def _output_tokens(record: TraceRecord, output_cap: int | None) -> int:
    """The trace's output length, at least 1 (the first token) and at most the cap."""
    return min(max(record.output_tokens, 1), output_cap or record.output_tokens or 1)


def trace_workload(
    surface: Surface,
    num_stages: int,
    trace: TraceSlice,
    load: float,
    *,
    reference_chunk_tokens: int,
    cache_block_tokens: int,
    max_request_tokens: int,
    output_cap: int | None = None,
) -> Workload:
    """The slice as a workload at offered prefill ``load`` (module doc: what is kept, skipped and scaled)."""
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"--load must be > 0, got {load}")
    picked = read_slice(trace)
    notes = []
    kept = [r for r in picked if _output_tokens(r, output_cap) + r.input_tokens <= max_request_tokens]
    if len(kept) < len(picked):
        skipped = [f"{r.index} (line {r.line})" for r in picked if r.index not in {k.index for k in kept}]
        notes.append(
            f"skipped {len(skipped)} request(s) longer than the twin's model takes ({max_request_tokens} tokens,"
            f" prompt + output): {', '.join(skipped)}"
        )
    if not kept:
        raise ValueError(
            f"--workload trace:{trace.path}@{trace.start}:{trace.count}: every request was skipped (each is longer"
            f" than the {max_request_tokens} tokens, prompt + output, the model takes); take another slice"
        )
    zero = sum(1 for r in kept if r.output_tokens == 0)
    if zero:
        notes.append(f"{zero} request(s) with 0 output tokens replayed with 1 (the first token)")
    cached = cached_prefix_tokens(kept, cache_block_tokens)
    work = [r.input_tokens - c for r, c in zip(kept, cached, strict=True)]
    history = sum((r.input_tokens + c) / 2 for r, c in zip(kept, cached, strict=True)) / len(kept)
    capacity = prefill_tokens_per_s(surface, num_stages, reference_chunk_tokens, int(history))
    stamps = [r.timestamp_ms for r in kept]
    span_ms = max(stamps) - min(stamps)
    if len(kept) > 1 and span_ms <= 0:
        raise ValueError(
            f"--workload trace:{trace.path}@{trace.start}:{trace.count}: every request has the same timestamp,"
            " so no gap can be scaled to a load; take a slice with some spread"
        )
    mean_gap_ms = sum(work) / len(work) / (load * capacity) * 1000.0
    scale = mean_gap_ms * (len(kept) - 1) / span_ms if len(kept) > 1 else 1.0
    if not (math.isfinite(scale) and scale * span_ms <= MAX_ARRIVAL_SPAN_S * 1000.0):
        raise ValueError(
            f"--workload trace:{trace.path}@{trace.start}:{trace.count} at --load {load:g}: the slice's"
            f" {span_ms:g} ms of arrivals cannot be scaled to that load (they would spread over more than"
            f" {MAX_ARRIVAL_SPAN_S:g} s);"
            " take a slice with more spread or a load nearer 1"
        )
    first = min(stamps)
    specs = tuple(
        RequestSpec(
            f"t{r.index:05d}",
            round((r.timestamp_ms - first) * scale, 3),
            r.input_tokens,
            _output_tokens(r, output_cap),
            prefix_group=r.index,
            group_tokens=0,
            block_ids=r.block_ids,
        )
        for r in kept
    )
    hits = sum(cached)
    notes.insert(
        0,
        f"requests {trace.start}..{trace.start + trace.count - 1} of {trace.path.name}: prompts {sum(work) + hits}"
        f" tokens, {hits} of them expected prefix hits ({hits / (sum(work) + hits):.1%}); arrivals over"
        f" {max(r.arrival_ms for r in specs) / 1000:.2f} s (the trace's {span_ms / 1000:.2f} s x {scale:.3g})"
        + (f"; outputs capped at {output_cap}" if output_cap else ""),
    )
    return Workload(f"{trace.label}-load{load:g}", 0, specs, tuple(notes))
