"""Forward-port the patch set onto any vllm-ascend git checkout, and say what it took.

Each patch of ``patches/series`` is merged into the checkout hunk by hunk, with a
three-way merge whose base is the pinned release's own files (the pristine tree the
build unpacks, with the earlier patches applied): the hunk *applies* when its old
text is still in the file, is *merged* when the context moved or changed but the merge
is clean, is *already there* when upstream already has its change, and is a
*conflict* when upstream changed lines the hunk changes; the report shows that upstream
change. A target's series (``targets.py``) also has target versions of pinned patches,
applied with zero fuzz, or *refreshed* when the pinned patch changed since they were
made (that change is merged into them the same way). Then the overlay is copied in
(with the target's overlay patches), and for every overlay file
that replaces an upstream file the report shows whether (and how) upstream changed
that file since the pin, so the overlay can absorb it. Last, the metadata and config
contracts (``contracts.py``) run against the checkout.

The checkout is the work tree: the merged files (with conflict markers where a person
must decide) and the overlay files are written there, and nothing else is touched, not
even git's index. Files the port would write must have no uncommitted changes first,
so nothing is lost, and must not be links or the wrong kind of entry (``checkout_files``).
``dry_run`` writes nothing there and only reports. What happens at each overlay file's
path is ``port_overlay``'s.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .checkout_files import path_problems, write_text
from .contracts import ContractResult, config_contract, metadata_contract
from .diffs import _diff_lines
from .hunks import DiffError, FileDiff, Hunk, apply_exact, find_block, merge_file, parse_diff
from .pin import ROOT
from .port_overlay import NEW, OverlayResult, overlay_result
from .series import OVERLAY_DIR, PACKAGE, OverlayFile, Patch
from .targets import OverlayPatch, Step, Target, blob_text, git_blob, git_blob_of_text, with_header

APPLIES, MERGED, REFRESHED, ALREADY, CONFLICT = "applies", "merged", "refreshed", "already there", "conflict"
_DEFINITION = re.compile(r"^\s*(class|def|async def) \w+")
REPORT_DIR = ROOT / "build" / "port"
UPSTREAM_LABEL = "upstream"


class PortError(RuntimeError):
    """The checkout cannot be ported into (not a git work tree, uncommitted changes, ...)."""


@dataclass(frozen=True)
class HunkResult:
    patch: str
    path: str
    number: int  # 1-based, within this file of this patch (0: see below)
    header: str
    status: str  # APPLIES | MERGED | ALREADY | REFRESHED | CONFLICT
    detail: str  # where it went, or the conflicting upstream change
    # number 0: a result for a whole file (a target patch on an overlay file, or one that no longer applies)


@dataclass
class PortReport:
    upstream: Path
    commit: str
    describe: str
    base: str  # what the merge base is
    hunks: list[HunkResult] = field(default_factory=list)
    overlay: list[OverlayResult] = field(default_factory=list)
    contracts: list[ContractResult] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    dry_run: bool = False
    porter: Porter | None = None
    target: str = ""  # the name of the target series ported, if not the pinned one

    def patch_status(self, name: str) -> tuple[str, str]:
        """(worst status, summary) of one patch."""
        mine = [h for h in self.hunks if h.patch == name]
        count = {status: sum(h.status == status for h in mine) for status in (CONFLICT, MERGED, REFRESHED, ALREADY)}
        unit = "files" if all(h.number == 0 for h in mine) else "hunks"
        if count[CONFLICT]:
            more = f", {count[MERGED]} merged" if count[MERGED] else ""
            return CONFLICT, f"{count[CONFLICT]} of {len(mine)} {unit} conflict{more}"
        if count[REFRESHED]:
            return REFRESHED, f"changed since it was ported; the change merged into {count[REFRESHED]} {unit}"
        if count[MERGED]:
            return MERGED, f"{count[MERGED]} of {len(mine)} hunks merged (context moved), the rest apply"
        if count[ALREADY]:
            return ALREADY, f"{count[ALREADY]} of {len(mine)} {unit} already there, the rest apply"
        return APPLIES, f"all {len(mine)} {unit} apply"

    @property
    def patches(self) -> list[str]:
        return list(dict.fromkeys(h.patch for h in self.hunks))

    @property
    def conflicted_files(self) -> list[str]:
        return list(dict.fromkeys(h.path for h in self.hunks if h.status == CONFLICT))

    @property
    def to_resolve(self) -> list[str]:
        """What a person must do before the port is done; the exit status is 1 while there is any."""
        todo = []
        if self.conflicted_files:
            todo.append(
                f"conflict markers (<<<<<<< upstream ... >>>>>>> <patch>) in: {', '.join(self.conflicted_files)}"
            )
        todo += [o.to_resolve() for o in self.overlay if o.conflict]
        return todo + [f"contract failed: {c.name}" for c in self.contracts if not c.ok]

    @property
    def ok(self) -> bool:
        return not self.to_resolve

    def render(self, full: bool = True) -> str:
        out = [
            f"Port of the patch set to {self.upstream} at {self.describe} ({self.commit})",
            f"Merge base: {self.base}",
            "",
            "Patches",
        ]
        for name in self.patches:
            status, summary = self.patch_status(name)
            out.append(f"  {name}: {status.upper() if status == CONFLICT else status} ({summary})")
        out += ["", "Hunks"]
        for h in self.hunks:
            where = f"hunk {h.number} {h.header}" if h.number else "(whole file)"
            out.append(f"  {h.patch} {h.path} {where}: {h.status}")
            if h.detail:
                out += [f"      {line}" for line in h.detail.splitlines()]
        out += ["", "Overlay files that replace an upstream file or meet one"]
        for o in self.overlay:
            if o.status == NEW:
                continue
            out.append(f"  {o.relpath}: {o.status}")
            if o.upstream_diff:
                if full:
                    out += [f"      {line}" for line in o.upstream_diff.splitlines()]
                else:
                    plus = sum(1 for line in o.upstream_diff.splitlines() if line[:1] == "+" and line[:3] != "+++")
                    minus = sum(1 for line in o.upstream_diff.splitlines() if line[:1] == "-" and line[:3] != "---")
                    out.append(f"      upstream diff since the pin: +{plus} -{minus} lines (in the report file)")
        out += ["", "Contracts"]
        for c in self.contracts:
            out.append(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        out += ["", "To resolve"] + ([f"  - {t}" for t in self.to_resolve] or ["  nothing"])
        out += ["", "To review (not a failure)"]
        out += [f"  - {t}" for t in (o.to_review() for o in self.overlay) if t] or ["  nothing"]
        out.append("")
        if self.dry_run:
            out.append("Dry run: nothing was written to the checkout.")
        else:
            out.append(
                f"Written to the checkout ({len(self.written)} files, nothing else touched; "
                f"'git -C {self.upstream} status' lists them)."
            )
        return "\n".join(out) + "\n"


def _git(cwd: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise PortError(f"git {' '.join(args)} in {cwd} failed: {res.stderr.strip()}")
    return res.stdout.rstrip()


def _check_checkout(upstream: Path, paths: list[str], dry_run: bool) -> tuple[str, str]:
    """(commit, describe) of the checkout; refuses one the port could damage."""
    problems = path_problems(upstream, paths)
    if problems:
        raise PortError(
            f"{upstream}: the port refuses paths it writes, and nothing was written:\n  " + "\n  ".join(problems)
        )
    if not (upstream / PACKAGE / "__init__.py").is_file():
        raise PortError(f"{upstream} holds no {PACKAGE}/__init__.py; point UPSTREAM_SRC at a vllm-ascend checkout")
    top = Path(_git(upstream, "rev-parse", "--show-toplevel")).resolve()
    if top != upstream.resolve():
        raise PortError(f"{upstream} is not the top of a git work tree (that is {top}); point UPSTREAM_SRC there")
    commit = _git(upstream, "rev-parse", "HEAD")
    describe = _git(upstream, "describe", "--tags", "--always")
    if not dry_run:
        dirty = _git(upstream, "status", "--porcelain", "--untracked-files=all", "--ignored=matching", "--", *paths)
        if dirty:
            raise PortError(
                f"{upstream} has uncommitted changes in files the port writes:\n{dirty}\ncommit or stash them, "
                "move an ignored (!!) file away (or 'git checkout -- <file>' to drop an earlier port), then run the "
                "port again"
            )
    return commit, describe


def _lines(path: Path) -> list[str] | None:
    return path.read_text().splitlines(keepends=True) if path.exists() else None


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


@dataclass
class StepChange:
    """What one series entry did to the target's files (for the target's mail series)."""

    patch: Patch  # gives the header
    before: dict[str, list[str]] = field(default_factory=dict)
    after: dict[str, list[str]] = field(default_factory=dict)


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
            self.pinned[path] = _lines(self.pristine_pkg.parent / path) or []
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
            definitions = [line for line in hunk.removed if _DEFINITION.match(line)]
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
            delta = parse_diff(_diff_lines(pinned_old, pinned_new, path, False), path)
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
            diff = "".join(_diff_lines(change.before[p], change.after[p], p, False) for p in change.after)
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
                diff = "".join(_diff_lines(before, after, path, False) for path, (before, after) in changed.items())
                self.refreshed[op.patch.path] = with_header(header, diff)
        return files


def port(
    upstream: Path,
    *,
    patches: list[Patch],
    overlay: list[OverlayFile],
    pristine_pkg: Path,
    pin_name: str,
    overlay_dir: Path = OVERLAY_DIR,
    dry_run: bool = False,
    target: Target | None = None,
) -> PortReport:
    """Port the series (or ``target``'s) and the overlay into the checkout ``upstream``; see the module docstring."""
    upstream = upstream.resolve()
    steps = target.steps if target else tuple(Step(p, True) for p in patches)
    overlay_patches = target.overlay_patches if target else ()
    patched_paths = list(dict.fromkeys(f for step in steps for f in step.patch.files))
    overlay_paths = [e.repo_path for e in overlay]
    commit, describe = _check_checkout(upstream, patched_paths + overlay_paths, dry_run)
    base = f"vllm-ascend {pin_name} (the pinned release's files)"
    if target:
        base += f"; series of target '{target.name}' (made for {target.ref} at {target.commit[:12]})"
    report = PortReport(upstream, commit, describe, base, dry_run=dry_run, target=target.name if target else "")

    porter = Porter(lambda path: _lines(upstream / path), pristine_pkg, pin_name)
    if target:
        porter.history = target.history
    for step in steps:
        porter.run(step)
    overlay_files = porter.overlay(overlay, overlay_patches)
    report.hunks = porter.hunks
    report.porter = porter
    report.overlay = [
        overlay_result(e, overlay_files[e.repo_path], pristine_pkg, upstream / PACKAGE, pin_name) for e in overlay
    ]
    with tempfile.TemporaryDirectory(prefix="port-overlay-") as tmp:
        if overlay_patches:  # the contracts read our modules as the target gets them
            overlay_dir = Path(tmp)
            for path, lines in overlay_files.items():
                dest = overlay_dir / path.removeprefix(f"{PACKAGE}/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text("".join(lines))
        report.contracts = metadata_contract(upstream / PACKAGE, overlay_dir) + config_contract(
            upstream / PACKAGE, pristine_pkg, overlay_dir, [step.patch for step in steps]
        )
    if target:
        report.contracts = _answered(report.contracts, target)
    if not dry_run:
        for path, lines in porter.current.items():
            if any(path in change.after for change in porter.changes):
                write_text(upstream, path, "".join(lines))
                report.written.append(path)
        for entry, result in zip(overlay, report.overlay, strict=True):
            if result.written:  # never over a file upstream added at the path of a new one of ours
                write_text(upstream, entry.repo_path, "".join(overlay_files[entry.repo_path]))
                report.written.append(entry.repo_path)
    return report


def _answered(results: list[ContractResult], target: Target) -> list[ContractResult]:
    """Failed contracts the target's patches answer become ok, saying how; an answer to nothing is an error."""
    out = []
    used = set()
    for c in results:
        answer = target.answers.get(c.subject)
        if answer is not None and not c.ok:
            used.add(c.subject)
            c = ContractResult(
                c.subject, True, f"answered by target {target.name}: {answer} (check: {c.detail})", c.where
            )
        out.append(c)
    for subject in sorted(set(target.answers) - used):
        detail = "no failing contract has this subject any more: drop it from answered_contracts"
        out.append(ContractResult(subject, False, detail, f"patches/targets/{target.name}/target.json"))
    return out


def write_report(report: PortReport, path: Path | None = None) -> Path:
    """The full report, by default ``build/port/<ref>.txt`` (``<ref>-target-<name>.txt`` for a target's series)."""
    path = path or REPORT_DIR / (
        f"{report.describe}-target-{report.target}.txt" if report.target else f"{report.describe}.txt"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.render(full=True))
    return path
