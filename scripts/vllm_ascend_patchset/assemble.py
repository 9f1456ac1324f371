"""Assemble ``build/<target>/vllm_ascend``: pristine wheel package + patches + overlay.

This one tree is what the tests import, what the wheel packs and what the upstream
diffs are made from. It is built in a temporary folder and moved into place only when
every step succeeded, so a failing patch leaves no half-applied tree behind.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .pin import ROOT, Pin, Target, cache_dir, fetch_wheel, sha256_of
from .series import OVERLAY_DIR, PACKAGE, PATCH_DIR, OverlayFile, Patch, SeriesError, load_overlay, load_patches

BUILD_DIR = ROOT / "build"


class PatchError(RuntimeError):
    """A patch of the series does not apply to the pristine tree."""


@dataclass(frozen=True)
class Assembly:
    target: Target
    root: Path  # holds vllm_ascend/
    pristine: Path  # holds the unpatched vllm_ascend/
    wheel: Path
    patches: tuple[Patch, ...]
    overlay: tuple[OverlayFile, ...]

    @property
    def package(self) -> Path:
        return self.root / PACKAGE


def pristine_tree(wheel: Path) -> Path:
    """The wheel unpacked once into the cache, keyed by its hash; read-only by convention."""
    dest = cache_dir() / "pristine" / sha256_of(wheel)[:16]
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="pristine-", dir=dest.parent))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
    (tmp / ".complete").write_text(wheel.name + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


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
    target: Target | None = None,
    *,
    pin: Pin | None = None,
    wheel: Path | None = None,
    out_dir: Path | None = None,
    patch_dir: Path | None = None,
    overlay_dir: Path | None = None,
) -> Assembly:
    pin = pin or Pin.load()
    target = target or Target.host()
    wheel = wheel or fetch_wheel(pin, target)
    patches = load_patches(patch_dir or PATCH_DIR)
    overlay = load_overlay(patch_dir or PATCH_DIR, overlay_dir or OVERLAY_DIR)
    pristine = pristine_tree(wheel)
    out = out_dir or BUILD_DIR / target.name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        shutil.copytree(pristine / PACKAGE, tmp / PACKAGE)
        for patch in patches:
            apply_patch(patch, tmp)
        check_overlay(overlay, patches, pristine / PACKAGE)
        for entry in overlay:
            dest = tmp / entry.repo_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(entry.source, dest)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Assembly(target, out, pristine, wheel, tuple(patches), tuple(overlay))
