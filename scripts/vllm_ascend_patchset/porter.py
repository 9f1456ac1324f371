"""The series applied to a target's files, hunk by hunk: the merges behind ``port``.

A pinned patch is merged three-way, its base the pinned release's files with the earlier
patches applied (``_merge``); a target's own patch applies with zero fuzz (``_apply``),
or, when the pinned patch it stands for changed since it was made, takes that change by
the same merge (``_refresh``); the target's overlay patches follow later changes to the
overlay files the same way (``overlay``). Every hunk gets a ``HunkResult``; every step's
change to the files is kept (``StepChange``) for the target's mail series.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from .hunks import DiffError, FileDiff, Hunk, apply_exact, find_block, git_diff, merge_file, parse_diff
from .paths import PACKAGE, ROOT
from .port_report import ALREADY, APPLIES, CONFLICT, MERGED, REFRESHED, HunkResult, StepChange
from .series import OverlayFile, Patch
from .targets import OverlayPatch, Step, blob_text, git_blob, git_blob_of_text, with_header

DEFINITION_LINE = re.compile(r"^\s*(class|def|async def) \w+")  # a deleted one upstream also deleted is already there
UPSTREAM_LABEL = "upstream"


def read_lines(path: Path) -> list[str] | None:
    """A file's lines with their ends; None when there is no such file."""
    return path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else None


def _conflict_detail(merged: str, label: str, first: str = UPSTREAM_LABEL) -> str:
    """The conflict blocks a merge labelled ``label`` produced: the other side's change and ours, both from the base."""
    lines = merged.splitlines(keepends=True)
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(f"<<<<<<< {first}"):
            i += 1
            continue
        sections: list[list[str]] = [[], [], []]
        part = 0
        j = i + 1
        while j < len(lines) and not lines[j].startswith(">>>>>>> "):
            if lines[j].startswith("||||||| "):
                part = 1
            elif lines[j].startswith("=======") and part == 1:
                part = 2
            else:
                sections[part].append(lines[j])
            j += 1
        if j < len(lines) and lines[j].rstrip("\n") == f">>>>>>> {label}":
            blocks.append(sections)
        i = j + 1
    out = []
    for theirs, base, ours in blocks:
        out.append(f"{first} changed (base -> {first}):")
        out += _diff_body(base, theirs)
        out.append("the patch changes (base -> patch):")
        out += _diff_body(base, ours)
    return "\n".join(out)


def _diff_body(old: list[str], new: list[str]) -> list[str]:
    body = list(difflib.unified_diff(old, new, n=1, lineterm="\n"))[2:]
    return ["  " + line.rstrip("\n") for line in body if not line.startswith("@@")] or ["  (no change)"]


def _diff_part(patch_text: str) -> str:
    """The unified diff of a patch file, without its header (as ``Patch.diff``)."""
    m = re.search(r"^(diff |--- )", patch_text, re.M)
    return patch_text[m.start() :] if m else ""


def _apply_hunk(lines: list[str], hunk: Hunk, near: int) -> tuple[list[str], int] | None:
    """``lines`` with the hunk applied where its old text is, nearest ``near``; None if it is not there."""
    at = find_block(lines, hunk.old, near)
    if at is None:
        return None
    return lines[:at] + list(hunk.new) + lines[at + len(hunk.old) :], at


class Porter:
    """The series applied to a target's files: per-hunk results, per-step changes, refreshed target patches."""

    def __init__(self, read_target: Callable[[str], list[str] | None], pristine_pkg: Path, pin_name: str) -> None:
        self.read_target = read_target
        self.pristine_pkg = pristine_pkg
        self.pin_name = pin_name
        self.pinned: dict[str, list[str]] = {}  # the pin's files with the pinned patches so far
        self.current: dict[str, list[str]] = {}  # the target's files with the steps so far
        self.hunks: list[HunkResult] = []
        self.changes: list[StepChange] = []
        self.refreshed: dict[Path, str] = {}  # target patch file -> its text brought up to date
        self.history = ROOT  # where the blobs recorded by target patches are

    def _pinned(self, path: str) -> list[str]:
        if path not in self.pinned:
            self.pinned[path] = read_lines(self.pristine_pkg.parent / path) or []
        return self.pinned[path]

    def _current(self, path: str) -> list[str] | None:
        if path not in self.current:
            lines = self.read_target(path)
            if lines is None:
                return None
            self.current[path] = lines
        return self.current[path]

    def _advance_pinned(self, patch: Patch) -> None:
        for fd in parse_diff(patch.diff, patch.name):
            self.pinned[fd.path] = apply_exact(self._pinned(fd.path), fd.hunks, f"{patch.name}: {fd.path}")

    def run(self, step: Step) -> None:
        change = StepChange(step.patch)
        self.changes.append(change)
        if step.merge:
            self._merge(step.patch, change)
        elif step.stands_for is not None and self._changed_since(step):
            self._refresh(step, change)
        else:
            self._apply(step.patch, change)
            if step.stands_for is not None:
                self._advance_pinned(step.stands_for)

    def _changed_since(self, step: Step) -> bool:
        """Has the pinned patch's diff (not just its header) changed since its target version was made?"""
        assert step.stands_for is not None and step.ported_from is not None
        if git_blob(step.stands_for.path) == step.ported_from:
            return False
        old = blob_text(step.ported_from, str(step.patch.path), self.history)
        return _diff_part(old) != step.stands_for.diff

    def _missing(self, patch: Patch, fd: FileDiff) -> None:
        for n, hunk in enumerate(fd.hunks, 1):
            detail = f"the target has no {fd.path} (moved or removed): port the hunk by hand"
            self.hunks.append(HunkResult(patch.name, fd.path, n, hunk.header, CONFLICT, detail))

    def _target_files(self, patch: Patch, change: StepChange) -> Iterator[tuple[FileDiff, list[str]]]:
        """(file diff, the target's lines) for each file of the patch the target has; the others are reported."""
        for fd in parse_diff(patch.diff, patch.name):
            current = self._current(fd.path)
            if current is None:
                self._missing(patch, fd)
                continue
            change.before.setdefault(fd.path, current)
            yield fd, current

    def _merge(self, patch: Patch, change: StepChange) -> None:
        """A pinned patch, hunk by hunk, three-way with the pinned files as base."""
        for fd, current in self._target_files(patch, change):
            pinned, merged = self._merge_hunks(
                patch.name, f"{patch.name} {fd.path}", fd, self._pinned(fd.path), current
            )
            self.pinned[fd.path], self.current[fd.path] = pinned, merged
            change.after[fd.path] = merged

    def _merge_hunks(
        self,
        name: str,
        label: str,
        fd: FileDiff,
        before: list[str],
        current: list[str],
        removed_by: Collection[str] = frozenset(),
    ) -> tuple[list[str], list[str]]:
        """Merge ``fd``'s hunks (made on ``before``) into ``current`` one by one; returns both texts after them.

        A hunk whose new text is already in ``current`` and whose old text is not is
        already there; so is a deletion of definitions (``class``/``def`` lines) that
        ``removed_by`` (the lines the target's own version removes) removes as well.
        """
        for n, hunk in enumerate(fd.hunks, 1):
            applied = _apply_hunk(before, hunk, hunk.old_start - 1)
            if applied is None:
                raise DiffError(f"{label} hunk {n} '{hunk.header}' does not apply to the text it was made on")
            after, at_pin = applied
            hunk_label = f"{label} hunk {n}"
            expected = at_pin + len(current) - len(before)
            at = find_block(current, hunk.old, expected)
            definitions = [line for line in hunk.removed if DEFINITION_LINE.match(line)]
            if at is None and (
                find_block(current, hunk.new, expected) is not None
                or (not hunk.added and definitions and all(line in removed_by for line in definitions))
            ):
                self.hunks.append(HunkResult(name, fd.path, n, hunk.header, ALREADY, "its change is already there"))
                before = after
                continue
            text, conflicts = merge_file(
                "".join(current), "".join(before), "".join(after), (UPSTREAM_LABEL, self.pin_name, hunk_label)
            )
            merged = text.splitlines(keepends=True)
            if conflicts:
                status, detail = CONFLICT, _conflict_detail(text, hunk_label)
            elif at is not None:
                offset = at - at_pin
                status = APPLIES
                detail = f"at line {at + 1}" + (f" ({offset:+d} lines from the pin)" if offset else "")
            else:
                landed = find_block(merged, hunk.added, expected) if hunk.added else None
                where = f"; its lines are at line {landed + 1}" if landed is not None else ""
                status, detail = MERGED, f"context changed upstream, three-way merge is clean{where}"
            self.hunks.append(HunkResult(name, fd.path, n, hunk.header, status, detail))
            before, current = after, merged
        return before, current

    def _apply(self, patch: Patch, change: StepChange) -> None:
        """A target patch, made on the target: each hunk's old text must be there (zero fuzz)."""
        for fd, current in self._target_files(patch, change):
            offset = 0
            for n, hunk in enumerate(fd.hunks, 1):
                applied = _apply_hunk(current, hunk, hunk.old_start - 1 + offset)
                if applied is None:
                    detail = "its old text is not in the target file: the target moved on; port it again"
                    self.hunks.append(HunkResult(patch.name, fd.path, n, hunk.header, CONFLICT, detail))
                    continue
                current, at = applied
                offset = at - (hunk.old_start - 1) + len(hunk.new) - len(hunk.old)
                self.hunks.append(HunkResult(patch.name, fd.path, n, hunk.header, APPLIES, f"at line {at + 1}"))
            self.current[fd.path] = current
            change.after[fd.path] = current

    def _refresh(self, step: Step, change: StepChange) -> None:
        """The pinned patch changed since its target version was made: merge that change into the target version."""
        assert step.stands_for is not None and step.ported_from is not None
        what = f"{step.patch.path.relative_to(ROOT) if step.patch.path.is_relative_to(ROOT) else step.patch.path}"
        old_text = blob_text(step.ported_from, what, self.history)
        old = {fd.path: fd.hunks for fd in parse_diff(old_text, f"{step.stands_for.name} as ported")}
        new = {fd.path: fd.hunks for fd in parse_diff(step.stands_for.diff, step.stands_for.name)}
        mine = {fd.path: fd.hunks for fd in parse_diff(step.patch.diff, step.patch.name)}
        for path in dict.fromkeys([*mine, *old, *new]):
            current = self._current(path)
            if current is None:
                self._missing(step.patch, FileDiff(path, mine.get(path, ())))
                continue
            pinned = self._pinned(path)
            pinned_old = apply_exact(pinned, old.get(path, ()), f"{step.stands_for.name} as ported: {path}")
            pinned_new = apply_exact(pinned, new.get(path, ()), f"{step.stands_for.name}: {path}")
            try:
                target_old = apply_exact(current, mine.get(path, ()), f"{step.patch.name}: {path}")
            except DiffError as exc:
                self.hunks.append(HunkResult(step.patch.name, path, 0, "(whole file)", CONFLICT, str(exc)))
                continue
            delta = parse_diff(git_diff(pinned_old, pinned_new, path, False), path)
            removed_by = {line for hunk in mine.get(path, ()) for line in hunk.removed}
            label = f"{step.patch.name} {path}: the change of {step.stands_for.name} since the port,"
            first = len(self.hunks)
            for fd in delta:
                _, target_old = self._merge_hunks(step.patch.name, label, fd, pinned_old, target_old, removed_by)
            for i in range(first, len(self.hunks)):  # a clean merge of the change refreshes the target version
                h = self.hunks[i]
                if h.status in (APPLIES, MERGED):
                    detail = f"{step.stands_for.name} changed since the port; the change merged ({h.detail})"
                    self.hunks[i] = HunkResult(h.patch, h.path, h.number, h.header, REFRESHED, detail)
            change.before.setdefault(path, current)
            self.pinned[path] = pinned_new
            self.current[path] = change.after[path] = target_old
        if not any(h.status == CONFLICT for h in self.hunks if h.patch == step.patch.name):
            header = dict(step.patch.header)
            header["Ported-From"] = f"{step.stands_for.name} {git_blob(step.stands_for.path)}"
            diff = "".join(git_diff(change.before[p], change.after[p], p, False) for p in change.after)
            self.refreshed[step.patch.path] = with_header(header, diff)

    def overlay(self, entries: list[OverlayFile], patches: tuple[OverlayPatch, ...]) -> dict[str, list[str]]:
        """The overlay files (repo path -> lines) with the target's overlay patches applied."""
        files = {e.repo_path: e.source.read_text().splitlines(keepends=True) for e in entries}
        for op in patches:
            changed: dict[str, tuple[list[str], list[str]]] = {}  # path -> (before, after) of this patch
            stale = False
            for fd in parse_diff(op.patch.diff, op.patch.name):
                relpath = fd.path.removeprefix(f"{PACKAGE}/")
                current = files[fd.path]
                base = op.bases[relpath]
                made_on = current
                if git_blob_of_text("".join(current)) != base:
                    stale = True
                    what = f"{op.patch.name} on vllm_ascend_overlay/{relpath}"
                    made_on = blob_text(base, what, self.history).splitlines(True)
                try:
                    patched = apply_exact(made_on, fd.hunks, f"{op.patch.name}: {fd.path}")
                except DiffError as exc:
                    self.hunks.append(HunkResult(op.patch.name, fd.path, 0, "(whole file)", CONFLICT, str(exc)))
                    continue
                labels = ("overlay now", "overlay as ported", op.patch.name)
                text, conflicts = merge_file("".join(current), "".join(made_on), "".join(patched), labels)
                if conflicts:
                    status, detail = CONFLICT, _conflict_detail(text, op.patch.name, "overlay now")
                elif made_on is current:
                    status, detail = APPLIES, ""
                else:
                    status, detail = REFRESHED, "the overlay file changed since the patch was made; it merged cleanly"
                self.hunks.append(HunkResult(op.patch.name, fd.path, 0, "(whole file)", status, detail))
                files[fd.path] = text.splitlines(keepends=True)
                changed[fd.path] = (current, files[fd.path])
            if stale and not any(h.status == CONFLICT for h in self.hunks if h.patch == op.patch.name):
                header = dict(op.patch.header)
                header["Overlay-Base"] = "\n".join(
                    f"{path.removeprefix(PACKAGE + '/')} {git_blob_of_text(''.join(before))}"
                    for path, (before, _) in changed.items()
                )
                diff = "".join(git_diff(before, after, path, False) for path, (before, after) in changed.items())
                self.refreshed[op.patch.path] = with_header(header, diff)
        return files
