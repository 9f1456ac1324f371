"""Patch sets for another upstream than the pin: ``patches/targets/<name>/``.

A target (for instance upstream ``main``) is the pinned series plus what porting it
took, kept small and regenerable:

- ``target.json``: the upstream ``repository``, ``ref`` and ``commit`` the set is made for,
  and ``answered_contracts``: contract subject -> how the set answers a contract check
  that reads only upstream's files and so cannot see the answer (shown in the report).
- ``series``: the target's order. A line names either a patch of ``patches/series``, which
  is three-way merged onto the target (``port.py``), or a patch of this folder, applied
  with zero fuzz. Every pinned patch must be named, or replaced by one of this folder.
- A patch of this folder that stands for a pinned one says so in its header,
  ``Ported-From: <pinned patch> <git blob of that patch file>``. When the pinned patch has
  changed since, its change (old -> new, on the pinned files) is three-way merged into
  the target's version, so one command refreshes the set.
- A patch of this folder on overlay files (``vllm_ascend/<overlay path>``) adapts our
  modules to the target; it applies after the overlay is copied in and records the
  overlay files it was made on, ``Overlay-Base: <path under vllm_ascend/> <git blob>``
  (one per line), so a later change to those files is merged the same way.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .paths import PACKAGE, PATCH_DIR, ROOT
from .series import Patch, SeriesError, changed_files, load_overlay, load_patches, parse_header

TARGETS_DIR = PATCH_DIR / "targets"


@dataclass(frozen=True)
class Step:
    """One entry of a target's series."""

    patch: Patch
    merge: bool  # a pinned patch, three-way merged; else a target patch applied with zero fuzz
    stands_for: Patch | None = None  # the pinned patch a target patch replaces
    ported_from: str | None = None  # git blob of that pinned patch when the target patch was made


@dataclass(frozen=True)
class OverlayPatch:
    patch: Patch
    bases: dict[str, str]  # overlay path under vllm_ascend/ -> git blob it was made on


@dataclass(frozen=True)
class UpstreamTarget:
    """A patch set for another upstream than the pin (``patches/targets/<name>/``), as loaded."""

    name: str
    folder: Path
    repository: str
    ref: str
    commit: str
    steps: tuple[Step, ...]
    overlay_patches: tuple[OverlayPatch, ...]
    answers: dict[str, str]  # contract subject -> how this target's patches answer it
    history: Path = ROOT  # the git repository whose history holds the recorded blobs


def git_blob_of_text(text: str) -> str:
    """The git blob id of this content, as ``git hash-object`` computes it."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_blob(path: Path) -> str:
    return git_blob_of_text(path.read_text())


def blob_text(blob: str, what: str, history: Path = ROOT) -> str:
    """The content of a blob of the repository's history, or an error saying what is lost."""
    res = subprocess.run(["git", "-C", str(history), "cat-file", "blob", blob], capture_output=True, text=True)
    if res.returncode != 0:
        raise SeriesError(
            f"{what}: the version it was made on (git blob {blob}) is not in this repository's history, so the "
            "change since cannot be merged; port it again by hand against the current files"
        )
    return res.stdout


def _target_patch(path: Path) -> Patch:
    return Patch(path.name, path, parse_header(path), changed_files(path))


def load_target(name: str, patch_dir: Path = PATCH_DIR) -> UpstreamTarget:
    folder = patch_dir / "targets" / name
    if not folder.is_dir():
        have = (
            sorted(p.name for p in (patch_dir / "targets").iterdir() if p.is_dir())
            if (patch_dir / "targets").is_dir()
            else []
        )
        raise SeriesError(f"no target '{name}' under {patch_dir / 'targets'}; targets: {', '.join(have) or 'none'}")
    meta_file = folder / "target.json"
    try:
        meta = json.loads(meta_file.read_text())
        repository, ref, commit = meta["repository"], meta["ref"], meta["commit"]
        answers = dict(meta.get("answered_contracts", {}))
    except FileNotFoundError as exc:
        raise SeriesError(f"{meta_file}: missing; it names the upstream repository, ref and commit") from exc
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SeriesError(f"{meta_file}: needs JSON with repository, ref and commit ({exc})") from exc

    pinned = {p.name: p for p in load_patches(patch_dir)}
    overlay_paths = {e.repo_path for e in load_overlay(patch_dir)}
    series = folder / "series"
    if not series.exists():
        raise SeriesError(f"{series}: missing; it lists the target's patches in order")
    steps: list[Step] = []
    overlay_patches: list[OverlayPatch] = []
    covered: set[str] = set()
    for n, raw in enumerate(series.read_text().splitlines(), 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        local = folder / entry
        if local.exists():
            patch = _target_patch(local)
            on_overlay = [f for f in patch.files if f in overlay_paths]
            if on_overlay:
                if len(on_overlay) != len(patch.files):
                    raise SeriesError(f"{local}: changes overlay and upstream files at once; split it in two")
                overlay_patches.append(OverlayPatch(patch, _overlay_bases(patch, local)))
                continue
            stands_for = ported_from = None
            if "Ported-From" in patch.header:
                parts = patch.header["Ported-From"].split()
                if len(parts) != 2 or parts[0] not in pinned:
                    raise SeriesError(
                        f"{local}: 'Ported-From: {patch.header['Ported-From']}' must name a patch of "
                        "patches/series and the git blob it was ported from"
                    )
                stands_for, ported_from = pinned[parts[0]], parts[1]
                covered.add(parts[0])
            steps.append(Step(patch, False, stands_for, ported_from))
        elif entry in pinned:
            steps.append(Step(pinned[entry], True))
            covered.add(entry)
        else:
            raise SeriesError(f"{series}:{n}: {entry} is neither a patch of {folder} nor of patches/series")
    missing = [name for name in pinned if name not in covered]
    if missing:
        raise SeriesError(
            f"{series}: does not cover {', '.join(missing)} of patches/series; add the name (merged onto the target) "
            "or a target version of it with 'Ported-From: <name> <blob>' in its header"
        )
    top = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    history = Path(top.stdout.strip()) if top.returncode == 0 else ROOT
    return UpstreamTarget(name, folder, repository, ref, commit, tuple(steps), tuple(overlay_patches), answers, history)


def _overlay_bases(patch: Patch, path: Path) -> dict[str, str]:
    bases: dict[str, str] = {}
    for line in patch.header.get("Overlay-Base", "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            bases[parts[0]] = parts[1]
    missing = [f for f in patch.files if f.removeprefix(f"{PACKAGE}/") not in bases]
    if missing:
        raise SeriesError(
            f"{path}: header lacks 'Overlay-Base: <path under vllm_ascend/> <git blob>' for "
            f"{', '.join(f.removeprefix(PACKAGE + '/') for f in missing)}"
        )
    return bases


def with_header(header: dict[str, str], diff: str) -> str:
    """A patch file: DEP-3 header (in the given key order), a blank line, the diff."""
    lines = []
    for key, value in header.items():
        first, *rest = value.splitlines() or [""]
        lines.append(f"{key}: {first}".rstrip())
        lines += [line if line.startswith(" ") else f" {line}" for line in rest]
    return "\n".join(lines) + "\n\n" + diff
