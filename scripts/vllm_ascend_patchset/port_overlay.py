"""What upstream did at the path of each overlay file since the pin, what the port does there, and what is left.

- A file of ours that replaces an upstream file is written over it. If upstream changed
  that file since the pin, its change is not in the checkout: the report shows the diff
  to absorb into ours (a review, not a failure).
- A new file of ours is written where upstream has nothing. Where upstream now has a
  file of its own, the port keeps upstream's and does not write ours, so the patches
  and modules that import that module get upstream's: a conflict, the port fails, and
  a person renames ours, or takes ours over upstream's when upstream's is our own
  contribution. Upstream holding our file exactly as ours is no conflict.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from .series import OverlayFile

NEW = "new"
UNCHANGED = "unchanged since the pin"
CHANGED = "changed upstream since the pin"
REMOVED = "removed upstream since the pin; ours was written there"
SAME = "already there: upstream has this file exactly as ours, so it was not written"
TAKEN = "CONFLICT: upstream added its own file here; the port kept it and did not write ours"


@dataclass(frozen=True)
class OverlayResult:
    relpath: str  # under vllm_ascend/
    replaces: bool
    status: str
    upstream_diff: str = ""  # pin -> target of the replaced upstream file

    @property
    def conflict(self) -> bool:
        return self.status == TAKEN

    @property
    def written(self) -> bool:
        """Does the port write ours at this path?"""
        return self.status not in (TAKEN, SAME)

    @property
    def needs_attention(self) -> bool:
        return self.status not in (NEW, UNCHANGED, SAME)

    def to_resolve(self) -> str:
        """What a person must do before the port succeeds ("" when nothing)."""
        if not self.conflict:
            return ""
        path = f"vllm_ascend/{self.relpath}"
        return (
            f"{path}: upstream added its own file here; the port kept it and did not write ours, so our patches "
            "and modules that import it now get upstream's module. If upstream's is another module, rename ours "
            f"(vllm_ascend_overlay/{self.relpath}, its line in patches/overlay.manifest and every import of it) "
            "to a path upstream does not use, then port again. If it is ours as contributed, merge upstream's "
            "changes into ours and copy ours over it in the checkout; once the pin has the file, declare ours "
            "'replaces' in patches/overlay.manifest."
        )

    def to_review(self) -> str:
        """What a person should look at although the port succeeded ("" when nothing)."""
        if self.status == CHANGED:
            return (
                f"absorb upstream's change since the pin into vllm_ascend_overlay/{self.relpath} "
                "(ours replaced upstream's file without it; the diff is in the report)"
            )
        if self.status == REMOVED:
            return f"upstream removed vllm_ascend/{self.relpath}: decide whether ours is still needed"
        return ""


def overlay_result(
    entry: OverlayFile, ours: list[str], pristine_pkg: Path, target_pkg: Path, pin_name: str
) -> OverlayResult:
    """Upstream's file at ``entry``'s path against the pin's (and, for a new file, against ``ours``)."""
    pinned, target = _lines(pristine_pkg / entry.relpath), _lines(target_pkg / entry.relpath)
    if not entry.replaces:
        if target is None:
            return OverlayResult(entry.relpath, False, NEW)
        return OverlayResult(entry.relpath, False, SAME if target == ours else TAKEN)
    if target is None:
        return OverlayResult(entry.relpath, True, REMOVED)
    if target == pinned:
        return OverlayResult(entry.relpath, True, UNCHANGED)
    diff = "".join(
        difflib.unified_diff(
            pinned or [], target, f"a/{entry.repo_path} ({pin_name})", f"b/{entry.repo_path} (upstream)"
        )
    )
    return OverlayResult(entry.relpath, True, CHANGED, diff)


def _lines(path: Path) -> list[str] | None:
    return path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else None
