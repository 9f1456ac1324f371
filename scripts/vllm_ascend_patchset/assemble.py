"""Assemble ``build/<target>/vllm_ascend``: pristine wheel package + patches + overlay.

This one tree is what the tests import, what the wheel packs and what the upstream
diffs are made from. It is built in a scratch folder and published in one rename only
when every step succeeded (``atomic.publish_dir``), so a failing patch or an interrupt
leaves the previous tree, never a half-applied or half-deleted one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .atomic import publish_dir, remove_stale, scratch_dir
from .paths import OVERLAY_DIR, PACKAGE, PATCH_DIR, assembled_root
from .pin import Pin, fetch_wheel
from .series import OverlayFile, Patch, SeriesError, load_overlay, load_patches
from .trees import pristine_tree
from .wheel_target import WheelTarget


class PatchError(RuntimeError):
    """A patch of the series does not apply to the pristine tree."""


@dataclass(frozen=True)
class Assembly:
    target: WheelTarget
    root: Path  # holds vllm_ascend/
    pristine: Path  # holds the unpatched vllm_ascend/
    wheel: Path
    patches: tuple[Patch, ...]
    overlay: tuple[OverlayFile, ...]

    @property
    def package(self) -> Path:
        return self.root / PACKAGE


def _patch_cmd(patch: Patch, tree: Path, dry_run: bool) -> subprocess.CompletedProcess:
    cmd = [
        "patch",
        "-p1",
        "--fuzz=0",
        "--batch",
        "--forward",
        "--no-backup-if-mismatch",
        "-r",
        "-",
        "-d",
        str(tree),
        "-i",
        str(patch.path),
    ]
    if dry_run:
        cmd.insert(1, "--dry-run")
    if shutil.which("patch") is None:
        raise RuntimeError(
            "GNU patch is not installed (the series is applied with it): install it, e.g. apt install patch"
        )
    return subprocess.run(cmd, capture_output=True, text=True)


def _describe_failure(patch: Patch, output: str) -> str:
    current = None
    problems = []
    for line in output.splitlines():
        m = re.match(r"^(?:checking|patching) file (.+)$", line)
        if m:
            current = m.group(1).strip("'")
            continue
        m = re.match(r"^Hunk #(\d+) FAILED at (\d+)", line)
        if m:
            problems.append(f"{current}: hunk #{m.group(1)} (at line {m.group(2)}) does not apply")
        elif "can't find file" in line or "No file to patch" in line:
            problems.append(f"{current or '?'}: file not found in the pristine tree")
        elif "Reversed (or previously applied)" in line:
            problems.append(f"{current}: already applied or reversed")
    if not problems:
        problems.append(output.strip() or "patch failed without output")
    return f"patch {patch.name} does not apply: " + "; ".join(problems)


def apply_patch(patch: Patch, tree: Path) -> None:
    """Apply with zero fuzz; check first so a failing patch changes nothing."""
    res = _patch_cmd(patch, tree, dry_run=True)
    if res.returncode != 0:
        raise PatchError(_describe_failure(patch, res.stdout + res.stderr))
    res = _patch_cmd(patch, tree, dry_run=False)
    if res.returncode != 0:  # pragma: no cover - the dry run passed
        raise PatchError(_describe_failure(patch, res.stdout + res.stderr))


def check_overlay(overlay: list[OverlayFile], patches: list[Patch], pristine_pkg: Path) -> None:
    patched = {f for p in patches for f in p.files}
    for entry in overlay:
        exists = (pristine_pkg / entry.relpath).exists()
        if exists and not entry.replaces:
            raise SeriesError(
                f"overlay file vllm_ascend_overlay/{entry.relpath} would overwrite upstream "
                f"{entry.repo_path}; declare it '{entry.relpath} {entry.feature} replaces' in "
                "patches/overlay.manifest if that is intended, or rename it"
            )
        if entry.replaces and not exists:
            raise SeriesError(
                f"patches/overlay.manifest declares {entry.relpath} as 'replaces', but upstream has no "
                f"{entry.repo_path}; declare it 'new'"
            )
        if entry.repo_path in patched:
            raise SeriesError(f"{entry.repo_path} is both patched and replaced by the overlay; keep one of the two")


def assemble(
    target: WheelTarget | None = None,
    *,
    pin: Pin | None = None,
    wheel: Path | None = None,
    out_dir: Path | None = None,
    patch_dir: Path | None = None,
    overlay_dir: Path | None = None,
) -> Assembly:
    pin = pin or Pin.load()
    target = target or WheelTarget.host()
    wheel = wheel or fetch_wheel(pin, target)
    patches = load_patches(patch_dir or PATCH_DIR)
    overlay = load_overlay(patch_dir or PATCH_DIR, overlay_dir or OVERLAY_DIR)
    pristine = pristine_tree(wheel)
    check_overlay(overlay, patches, pristine / PACKAGE)
    out = out_dir or assembled_root(target)
    scratch_prefix = f".{out.name}-"
    remove_stale(out.parent, scratch_prefix)
    tmp = scratch_dir(out.parent, scratch_prefix)
    try:
        shutil.copytree(pristine / PACKAGE, tmp / PACKAGE)
        for patch in patches:
            apply_patch(patch, tmp)
        for entry in overlay:
            dest = tmp / entry.repo_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(entry.source, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, out)
    return Assembly(target, out, pristine, wheel, tuple(patches), tuple(overlay))
