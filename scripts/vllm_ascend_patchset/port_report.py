"""What a port did, as data and as the report a person reads: per patch, hunk, overlay file and contract.

Statuses of a hunk (or, number 0, of a whole file): it *applies* where its old text is,
is *merged* three-way when the context moved or changed, is *already there* when upstream
has its change, is *refreshed* when a target patch took its pinned patch's later change,
and is a *conflict* otherwise. ``PortReport.to_resolve`` is what fails the port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .contracts import ContractResult
from .port_overlay import NEW, OverlayResult
from .series import Patch

APPLIES, MERGED, REFRESHED, ALREADY, CONFLICT = "applies", "merged", "refreshed", "already there", "conflict"
HEADING = "Port of the patch set to "  # a report's first line starts so: only such a file is written over


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
class StepChange:
    """What one series entry did to the target's files (for the target's mail series)."""

    patch: Patch  # gives the header
    before: dict[str, list[str]] = field(default_factory=dict)
    after: dict[str, list[str]] = field(default_factory=dict)


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
    target: str = ""  # the name of the target series ported, if not the pinned one
    changes: list[StepChange] = field(default_factory=list)  # what each series entry did to the target's files
    refreshed: dict[Path, str] = field(default_factory=dict)  # target patch file -> its text brought up to date

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
            f"{HEADING}{self.upstream} at {self.describe} ({self.commit})",
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
