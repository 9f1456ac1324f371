"""What the patch set carries: ``patches/series``, patch headers and the overlay manifest.

A patch is a unified diff against the upstream repository root (paths
``a/vllm_ascend/...``), opened by a DEP-3 style header::

    Description: one line saying what, then indented lines saying why
    Author: Name <mail>
    Feature: cpp | dual-stream | hooks | build
    Forwarded: no | <url>
    Last-Update: 2026-11-29

The overlay manifest (``patches/overlay.manifest``) lists every file under
``vllm_ascend_overlay/`` with its feature and whether it is ``new`` or ``replaces`` an
upstream file, so nothing shadows upstream by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .paths import OVERLAY_DIR, PACKAGE, PATCH_DIR

FEATURES = ("build", "hooks", "cpp", "dual-stream")
HEADER_KEYS = ("Description", "Author", "Feature", "Forwarded", "Last-Update")


class SeriesError(ValueError):
    """The series, a patch header or the overlay manifest is malformed."""


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    header: dict[str, str]
    files: tuple[str, ...]  # repo-relative paths it changes

    @property
    def feature(self) -> str:
        return self.header["Feature"]

    @property
    def subject(self) -> str:
        return self.header["Description"].splitlines()[0].strip()

    @property
    def body(self) -> str:
        lines = self.header["Description"].splitlines()[1:]
        return "\n".join(line.strip() if line.strip() != "." else "" for line in lines).strip()

    @property
    def diff(self) -> str:
        text = self.path.read_text()
        m = re.search(r"^(diff |--- )", text, re.M)
        return text[m.start() :] if m else ""


@dataclass(frozen=True)
class OverlayFile:
    relpath: str  # relative to vllm_ascend/
    feature: str
    replaces: bool
    overlay_dir: Path = OVERLAY_DIR
    forwarded: bool = True  # False: the patch set's own (manifest 'not-forwarded'), never sent upstream

    @property
    def source(self) -> Path:
        return self.overlay_dir / self.relpath

    @property
    def repo_path(self) -> str:
        return f"{PACKAGE}/{self.relpath}"


def parse_header(path: Path) -> dict[str, str]:
    header: dict[str, str] = {}
    key = None
    for line in path.read_text().splitlines():
        if line.startswith(("--- ", "diff ", "Index: ")):
            break
        m = re.match(r"^([A-Za-z-]+):\s?(.*)$", line)
        if m and not line.startswith(" "):
            key = m.group(1)
            header[key] = m.group(2)
        elif line.startswith(" ") and key:
            header[key] += "\n" + line
        elif not line.strip():
            key = None
    missing = [k for k in ("Description", "Feature", "Forwarded") if not header.get(k, "").strip()]
    if missing:
        raise SeriesError(f"{path}: header lacks {', '.join(missing)}; see patches/README.md for the header format")
    if header["Feature"] not in FEATURES:
        raise SeriesError(f"{path}: Feature '{header['Feature']}' is not one of {', '.join(FEATURES)}")
    header.setdefault("Author", "vllm-ascend patch set <patchset@localhost>")
    return header


def changed_files(path: Path) -> tuple[str, ...]:
    files = []
    for line in path.read_text().splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            if target.startswith("b/"):
                target = target[2:]
            files.append(target)
    if not files:
        raise SeriesError(f"{path}: contains no unified diff ('+++ b/...' line)")
    return tuple(files)


def load_patches(patch_dir: Path = PATCH_DIR) -> list[Patch]:
    series = patch_dir / "series"
    if not series.exists():
        raise SeriesError(f"{series}: missing; it lists the patches to apply, one per line")
    patches = []
    for raw in series.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        path = patch_dir / name
        if not path.exists():
            raise SeriesError(f"{series}: names {name}, which does not exist in {patch_dir}")
        patches.append(Patch(name, path, parse_header(path), changed_files(path)))
    return patches


def load_overlay(patch_dir: Path = PATCH_DIR, overlay_dir: Path = OVERLAY_DIR) -> list[OverlayFile]:
    manifest = patch_dir / "overlay.manifest"
    entries: dict[str, OverlayFile] = {}
    if manifest.exists():
        for n, raw in enumerate(manifest.read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if (
                len(parts) not in (3, 4)
                or parts[2] not in ("new", "replaces")
                or parts[1] not in FEATURES
                or parts[3:] not in ([], ["not-forwarded"])
            ):
                raise SeriesError(
                    f"{manifest}:{n}: expected '<path under vllm_ascend/> <{'|'.join(FEATURES)}> <new|replaces>"
                    f" [not-forwarded]', got '{raw}'"
                )
            entries[parts[0]] = OverlayFile(parts[0], parts[1], parts[2] == "replaces", overlay_dir, not parts[3:])
    present = (
        sorted(
            p.relative_to(overlay_dir).as_posix()
            for p in overlay_dir.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
        )
        if overlay_dir.exists()
        else []
    )
    unlisted = [p for p in present if p not in entries]
    if unlisted:
        raise SeriesError(
            f"{manifest}: overlay file(s) not declared: {', '.join(unlisted)}; add a line "
            "'<path> <feature> new' (or 'replaces' when it intentionally replaces an upstream file)"
        )
    absent = [p for p in entries if p not in present]
    if absent:
        raise SeriesError(f"{manifest}: declares {', '.join(absent)}, which is not under {overlay_dir}")
    return [entries[p] for p in present]
