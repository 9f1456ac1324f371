"""Forward-port the patch set onto any vllm-ascend git checkout, and say what it took.

Each patch of ``patches/series`` is merged into the checkout hunk by hunk, with a
three-way merge whose base is the pinned release's own files (the pristine tree the
build unpacks, with the earlier patches applied): the hunk *applies* when its old
text is still in the file, is *merged* when the context moved or changed but the merge
is clean, and is a *conflict* when upstream changed lines the hunk changes; the report
shows that upstream change. Then the overlay is copied in, and for every overlay file
that replaces an upstream file the report shows whether (and how) upstream changed
that file since the pin, so the overlay can absorb it. Last, the metadata and config
contracts (``contracts.py``) run against the checkout.

The checkout is the work tree: the merged files (with conflict markers where a person
must decide) and the overlay files are written there, and nothing else is touched, not
even git's index. Files the port would write must have no uncommitted changes first,
so nothing is lost. ``dry_run`` writes nothing there and only reports.
"""

from __future__ import annotations

import difflib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .contracts import ContractResult, config_contract, metadata_contract
from .hunks import DiffError, FileDiff, find_block, merge_file, parse_diff
from .pin import ROOT
from .series import OVERLAY_DIR, PACKAGE, OverlayFile, Patch

APPLIES, MERGED, CONFLICT = "applies", "merged", "conflict"
REPORT_DIR = ROOT / "build" / "port"
UPSTREAM_LABEL = "upstream"


class PortError(RuntimeError):
    """The checkout cannot be ported into (not a git work tree, uncommitted changes, ...)."""


@dataclass(frozen=True)
class HunkResult:
    patch: str
    path: str
    number: int  # 1-based, within this file of this patch
    header: str
    status: str  # APPLIES | MERGED | CONFLICT
    detail: str  # where it went, or the conflicting upstream change


@dataclass(frozen=True)
class OverlayResult:
    relpath: str  # under vllm_ascend/
    replaces: bool
    status: str
    upstream_diff: str = ""  # pin -> target of the replaced upstream file

    @property
    def needs_attention(self) -> bool:
        return self.status != "new" and self.status != "unchanged since the pin"


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

    def patch_status(self, name: str) -> tuple[str, str]:
        """(worst status, summary) of one patch."""
        mine = [h for h in self.hunks if h.patch == name]
        conflicts = sum(h.status == CONFLICT for h in mine)
        merged = sum(h.status == MERGED for h in mine)
        if conflicts:
            return CONFLICT, f"{conflicts} of {len(mine)} hunks conflict" + (f", {merged} merged" if merged else "")
        if merged:
            return MERGED, f"{merged} of {len(mine)} hunks merged (context moved), the rest apply"
        return APPLIES, f"all {len(mine)} hunks apply"

    @property
    def patches(self) -> list[str]:
        return list(dict.fromkeys(h.patch for h in self.hunks))

    @property
    def conflicted_files(self) -> list[str]:
        return list(dict.fromkeys(h.path for h in self.hunks if h.status == CONFLICT))

    @property
    def ok(self) -> bool:
        return not self.conflicted_files and all(c.ok for c in self.contracts)

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
            out.append(f"  {h.patch} {h.path} hunk {h.number} {h.header}: {h.status}")
            if h.detail:
                out += [f"      {line}" for line in h.detail.splitlines()]
        out += ["", "Overlay files that replace an upstream file"]
        for o in self.overlay:
            if not o.replaces and o.status == "new":
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
        out += ["", "To resolve"]
        todo = []
        if self.conflicted_files:
            todo.append(
                "conflict markers (<<<<<<< upstream ... >>>>>>> <patch>) in: " + ", ".join(self.conflicted_files)
            )
        todo += [
            f"absorb the upstream change into vllm_ascend_overlay/{o.relpath}"
            for o in self.overlay
            if o.needs_attention
        ]
        todo += [f"contract failed: {c.name}" for c in self.contracts if not c.ok]
        out += [f"  - {t}" for t in todo] or ["  nothing"]
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
    if not (upstream / PACKAGE / "__init__.py").is_file():
        raise PortError(f"{upstream} holds no {PACKAGE}/__init__.py; point UPSTREAM_SRC at a vllm-ascend checkout")
    top = Path(_git(upstream, "rev-parse", "--show-toplevel")).resolve()
    if top != upstream.resolve():
        raise PortError(f"{upstream} is not the top of a git work tree (that is {top}); point UPSTREAM_SRC there")
    commit = _git(upstream, "rev-parse", "HEAD")
    describe = _git(upstream, "describe", "--tags", "--always")
    if not dry_run:
        dirty = _git(upstream, "status", "--porcelain", "--untracked-files=all", "--", *paths)
        if dirty:
            raise PortError(
                f"{upstream} has uncommitted changes in files the port writes:\n{dirty}\n"
                "commit or stash them (or 'git checkout -- <file>' to drop an earlier port), then run the port again"
            )
    return commit, describe


def _lines(path: Path) -> list[str] | None:
    return path.read_text().splitlines(keepends=True) if path.exists() else None


def _conflict_detail(merged: str, label: str) -> str:
    """The conflict blocks a hunk's merge produced: upstream's change and the patch's, both against the pin."""
    lines = merged.splitlines(keepends=True)
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(f"<<<<<<< {UPSTREAM_LABEL}"):
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
        out.append("upstream changed (pin -> upstream):")
        out += _diff_body(base, theirs)
        out.append("the patch changes (pin -> patch):")
        out += _diff_body(base, ours)
    return "\n".join(out)


def _diff_body(old: list[str], new: list[str]) -> list[str]:
    body = list(difflib.unified_diff(old, new, n=1, lineterm="\n"))[2:]
    return ["  " + line.rstrip("\n") for line in body if not line.startswith("@@")] or ["  (no change)"]


def _merge_file(
    patch: Patch, fd: FileDiff, pinned: list[str], current: list[str], pin_label: str
) -> tuple[list[str], list[str], list[HunkResult]]:
    """Merge one file's hunks one after another; returns (pinned after, merged target, per-hunk results)."""
    results = []
    before = pinned
    for n, hunk in enumerate(fd.hunks, 1):
        at_pin = find_block(before, hunk.old, hunk.old_start - 1)
        if at_pin is None:
            raise DiffError(f"{patch.name}: {fd.path} hunk {n} '{hunk.header}' does not apply to the pinned tree")
        after = before[:at_pin] + list(hunk.new) + before[at_pin + len(hunk.old) :]
        label = f"{patch.name} {fd.path} hunk {n}"
        expected = at_pin + len(current) - len(before)
        at = find_block(current, hunk.old, expected)
        text, conflicts = merge_file(
            "".join(current), "".join(before), "".join(after), (UPSTREAM_LABEL, pin_label, label)
        )
        merged = text.splitlines(keepends=True)
        if conflicts:
            status, detail = CONFLICT, _conflict_detail(text, label)
        elif at is not None:
            offset = at - at_pin
            status, detail = APPLIES, f"at line {at + 1}" + (f" ({offset:+d} lines from the pin)" if offset else "")
        else:
            landed = find_block(merged, hunk.added, expected) if hunk.added else None
            where = f"; its lines are at line {landed + 1}" if landed is not None else ""
            status, detail = MERGED, f"context changed upstream, three-way merge is clean{where}"
        results.append(HunkResult(patch.name, fd.path, n, hunk.header, status, detail))
        before, current = after, merged
    return before, current, results


def _overlay_result(entry: OverlayFile, pristine_pkg: Path, target_pkg: Path, pin_name: str) -> OverlayResult:
    pinned, target = _lines(pristine_pkg / entry.relpath), _lines(target_pkg / entry.relpath)
    if not entry.replaces:
        if target is not None:
            return OverlayResult(entry.relpath, False, "conflict: upstream now has a file at this path; rename ours")
        return OverlayResult(entry.relpath, False, "new")
    if target is None:
        return OverlayResult(entry.relpath, True, "removed upstream since the pin: decide whether ours is still needed")
    if target == pinned:
        return OverlayResult(entry.relpath, True, "unchanged since the pin")
    diff = "".join(
        difflib.unified_diff(
            pinned or [],
            target,
            f"a/{entry.repo_path} ({pin_name})",
            f"b/{entry.repo_path} (upstream)",
        )
    )
    return OverlayResult(entry.relpath, True, "changed upstream since the pin", diff)


def port(
    upstream: Path,
    *,
    patches: list[Patch],
    overlay: list[OverlayFile],
    pristine_pkg: Path,
    pin_name: str,
    overlay_dir: Path = OVERLAY_DIR,
    dry_run: bool = False,
) -> PortReport:
    """Merge ``patches`` and copy ``overlay`` into the checkout ``upstream``; see the module docstring."""
    upstream = upstream.resolve()
    diffs = [(patch, parse_diff(patch.diff, patch.name)) for patch in patches]
    patched_paths = list(dict.fromkeys(fd.path for _, fds in diffs for fd in fds))
    overlay_paths = [e.repo_path for e in overlay]
    commit, describe = _check_checkout(upstream, patched_paths + overlay_paths, dry_run)
    report = PortReport(upstream, commit, describe, f"vllm-ascend {pin_name} (the pinned release's files)")
    report.dry_run = dry_run

    pinned: dict[str, list[str]] = {}
    merged: dict[str, list[str]] = {}
    for patch, fds in diffs:
        for fd in fds:
            if fd.path not in pinned:
                pinned[fd.path] = _lines(pristine_pkg.parent / fd.path) or []
            current = merged.get(fd.path, _lines(upstream / fd.path))
            if current is None:
                for n, hunk in enumerate(fd.hunks, 1):
                    detail = f"upstream has no {fd.path} (moved or removed): port the hunk by hand"
                    report.hunks.append(HunkResult(patch.name, fd.path, n, hunk.header, CONFLICT, detail))
                continue
            pinned[fd.path], merged[fd.path], results = _merge_file(patch, fd, pinned[fd.path], current, pin_name)
            report.hunks += results

    report.overlay = [_overlay_result(e, pristine_pkg, upstream / PACKAGE, pin_name) for e in overlay]
    report.contracts = metadata_contract(upstream / PACKAGE, overlay_dir) + config_contract(
        upstream / PACKAGE, pristine_pkg, overlay_dir, patches
    )
    if not dry_run:
        for path, lines in merged.items():
            (upstream / path).write_text("".join(lines))
            report.written.append(path)
        for entry in overlay:
            if entry.replaces or not (upstream / entry.repo_path).exists():  # never overwrite a new upstream file
                dest = upstream / entry.repo_path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(entry.source.read_bytes())
                report.written.append(entry.repo_path)
    return report


def write_report(report: PortReport, path: Path | None = None) -> Path:
    path = path or REPORT_DIR / f"{report.describe}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.render(full=True))
    return path
