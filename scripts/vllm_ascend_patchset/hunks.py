"""Unified diffs as data: files, hunks, exact application, a three-way merge, and writing one.

The port (``port.py``) merges the series hunk by hunk, so it needs what ``patch`` hides:
each hunk's old and new lines, applying a chosen subset of hunks exactly at their line
numbers (the pinned tree they were made on), finding a hunk's old text elsewhere in a
file, and ``git merge-file``'s three-way merge of one file.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


class DiffError(ValueError):
    """A unified diff is malformed, or does not match the text it was made on."""


@dataclass(frozen=True)
class Hunk:
    old_start: int  # 1-based first line of the old text (0 for an empty old side)
    new_start: int
    header: str  # the '@@ ... @@' line
    old: tuple[str, ...]  # context and removed lines, with their line ends
    new: tuple[str, ...]  # context and added lines
    removed: tuple[str, ...]
    added: tuple[str, ...]


@dataclass(frozen=True)
class FileDiff:
    path: str  # repository-relative, without the a/ b/ prefix
    hunks: tuple[Hunk, ...]


def _strip_prefix(name: str) -> str:
    name = name.split("\t")[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_diff(text: str, source: str = "diff") -> list[FileDiff]:
    """The files and hunks of a unified diff; ``source`` names it in errors."""
    files: list[FileDiff] = []
    lines = text.splitlines(keepends=True)
    i = 0
    path: str | None = None
    hunks: list[Hunk] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if path is not None:
                files.append(FileDiff(path, tuple(hunks)))
            path, hunks = _strip_prefix(lines[i + 1][4:]), []
            i += 2
            continue
        m = _HUNK_HEADER.match(line.rstrip("\n"))
        if not m:
            i += 1
            continue
        if path is None:
            raise DiffError(f"{source}: hunk '{line.strip()}' before any '--- a/... +++ b/...' lines")
        old_len = 1 if m.group(2) is None else int(m.group(2))
        new_len = 1 if m.group(4) is None else int(m.group(4))
        old: list[str] = []
        new: list[str] = []
        removed: list[str] = []
        added: list[str] = []
        i += 1
        while (len(old) < old_len or len(new) < new_len) and i < len(lines):
            body = lines[i]
            tag, rest = body[:1], body[1:]
            if body in ("\n", "\r\n"):  # an editor stripped the space of a blank context line
                tag, rest = " ", body
            if tag == " ":
                old.append(rest)
                new.append(rest)
            elif tag == "-":
                old.append(rest)
                removed.append(rest)
            elif tag == "+":
                new.append(rest)
                added.append(rest)
            elif tag == "\\":
                pass
            else:
                raise DiffError(f"{source}: {path}: unexpected line in hunk '{line.strip()}': {body!r}")
            i += 1
            # '\ No newline at end of file' belongs to the line just read
            if i < len(lines) and lines[i].startswith("\\"):
                if tag in (" ", "-"):
                    old[-1] = old[-1].rstrip("\n")
                if tag in (" ", "+"):
                    new[-1] = new[-1].rstrip("\n")
                if tag == "-":
                    removed[-1] = old[-1]
                if tag == "+":
                    added[-1] = new[-1]
                i += 1
        if len(old) != old_len or len(new) != new_len:
            raise DiffError(f"{source}: {path}: hunk '{line.strip()}' is truncated")
        hunks.append(
            Hunk(
                int(m.group(1)),
                int(m.group(3)),
                line.rstrip("\n"),
                tuple(old),
                tuple(new),
                tuple(removed),
                tuple(added),
            )
        )
    if path is not None:
        files.append(FileDiff(path, tuple(hunks)))
    return files


def apply_exact(lines: list[str], hunks: list[Hunk] | tuple[Hunk, ...], source: str = "diff") -> list[str]:
    """Apply hunks as ``patch --fuzz=0`` does: exact text, nearest its line number; else raise."""
    out = list(lines)
    offset = 0  # lines added by the hunks already applied
    floor = 0  # a hunk applies after the previous one
    for hunk in hunks:
        expected = (hunk.old_start - 1 if hunk.old else hunk.old_start) + offset
        at = find_block(out, hunk.old, expected, start=floor)
        if at is None:
            raise DiffError(f"{source}: hunk '{hunk.header}' does not match the text it was made on")
        out[at : at + len(hunk.old)] = hunk.new
        offset += len(hunk.new) - len(hunk.old) + (at - expected)
        floor = at + len(hunk.new)
    return out


def find_block(lines: list[str], block: tuple[str, ...], near: int, start: int = 0) -> int | None:
    """0-based index (>= ``start``) of ``block`` in ``lines`` closest to ``near``, or None."""
    if not block:
        return min(max(near, start), len(lines))
    best = None
    first = block[0]
    for i in range(start, len(lines) - len(block) + 1):
        if lines[i] == first and tuple(lines[i : i + len(block)]) == block:
            if best is None or abs(i - near) < abs(best - near):
                best = i
    return best


def merge_file(current: str, base: str, ours: str, labels: tuple[str, str, str]) -> tuple[str, int]:
    """``git merge-file --diff3``: apply base->ours onto current; returns (text, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="merge-") as tmp:
        paths = []
        for name, text in (("current", current), ("base", base), ("ours", ours)):
            path = Path(tmp) / name
            path.write_text(text)
            paths.append(str(path))
        cmd = ["git", "merge-file", "-p", "--diff3"]
        for label in labels:
            cmd += ["-L", label]
        res = subprocess.run(cmd + paths, capture_output=True, text=True)
    if res.returncode < 0 or res.returncode > 127:
        raise RuntimeError(f"git merge-file failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout, res.returncode


def git_diff(old: list[str], new: list[str], path: str, created: bool) -> str:
    """A git-style unified diff, with 'No newline' markers where a file lacks one."""
    out = [f"diff --git a/{path} b/{path}\n"]
    if created:
        out += ["new file mode 100644\n", "--- /dev/null\n", f"+++ b/{path}\n"]
    else:
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    body = list(difflib.unified_diff(old, new, n=3))[2:]  # drop difflib's own ---/+++ lines
    for line in body:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)
