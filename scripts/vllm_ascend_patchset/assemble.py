"""Assemble ``build/<target>/vllm_ascend``: pristine wheel package + patches + overlay.

This one tree is what the tests import, what the wheel packs and what the upstream
diffs are made from. It is built in a scratch folder and published in one rename only
when every step succeeded (``atomic.publish_dir``), so a failing patch or an interrupt
leaves the previous tree, never a half-applied or half-deleted one.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .atomic import publish_dir, remove_stale, scratch_dir
from .pin import ROOT, Pin, Target, cache_dir, fetch_wheel, sha256_of
from .record import matches, read_record
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


PRISTINE_MARKER = ".complete"  # written last into an unpacked tree; its ctime dates the unpacking
PRISTINE_SCRATCH = "pristine-"


def pristine_tree(wheel: Path) -> Path:
    """The wheel unpacked into the cache, keyed by its hash, checked against the wheel at every use.

    A tree that differs from the wheel's RECORD (a file edited, added, removed) is unpacked
    again, with a warning that says what differed, so an edit in the cache never reaches a
    build.
    """
    parent = cache_dir() / "pristine"
    remove_stale(parent, PRISTINE_SCRATCH)
    dest = parent / sha256_of(wheel)[:16]
    if (dest / PRISTINE_MARKER).exists():
        problems = pristine_problems(dest, wheel)
        if not problems:
            return dest
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        print(f"warning: {dest} differs from {wheel.name} ({shown}); unpacking it again", file=sys.stderr)
    tmp = scratch_dir(parent, PRISTINE_SCRATCH)
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        (tmp / PRISTINE_MARKER).write_text(wheel.name + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, dest)
    return dest


def pristine_problems(tree: Path, wheel: Path) -> list[str]:
    """How an unpacked tree differs from the wheel's RECORD; empty if it does not.

    Cheap enough for every assemble: the file list is compared in full, but only files
    whose inode changed after the unpacking (ctime later than the marker's; no tool can
    set a ctime back) are read and hashed. When those all match, the marker is renewed so
    they are not hashed again. (File-system clocks advance in steps of a few ms: a change
    within the same step as the unpacking goes unseen.)
    """
    with zipfile.ZipFile(wheel) as z:
        record_name, rows = read_record(z)
        record_bytes = z.read(record_name)
    marker = tree / PRISTINE_MARKER
    unpacked_ns = marker.stat().st_ctime_ns
    problems: list[str] = []
    seen: set[str] = set()
    rehashed = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(tree).as_posix()
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) or rel == PRISTINE_MARKER:
                continue
            seen.add(rel)
            if rel not in rows:
                problems.append(f"{rel} is not in the wheel")
            elif not stat.S_ISREG(info.st_mode):
                problems.append(f"{rel} is not a regular file")
            elif info.st_ctime_ns > unpacked_ns:
                rehashed += 1
                data = path.read_bytes()
                same = data == record_bytes if rel == record_name else matches(data, *rows[rel])
                if not same:
                    problems.append(f"{rel} was changed")
    problems += [f"{rel} is missing" for rel in sorted(set(rows) - seen)]
    if rehashed and not problems:
        renewed = marker.with_name(f"{PRISTINE_MARKER}.{os.getpid()}")
        renewed.write_text(marker.read_text())
        os.replace(renewed, marker)
    return problems


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
    check_overlay(overlay, patches, pristine / PACKAGE)
    out = out_dir or BUILD_DIR / target.name
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
