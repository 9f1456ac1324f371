"""The pinned upstream release: which files, their hashes, and a verified local cache.

Every artefact the build reads is named in ``pin.json`` with its sha256. Files are
downloaded from the package indexes that pip is configured with (``PIP_INDEX_URL`` or
pip's default, then each ``PIP_EXTRA_INDEX_URL``) into a cache folder that git ignores,
and refused when the hash differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .atomic import remove_stale, scratch_dir
from .package_index import PinError, index_links, index_request, not_listed, shown_index
from .paths import PIN_FILE, cache_dir
from .wheel_target import WheelTarget

DOWNLOAD_SCRATCH = ".download-"


@dataclass(frozen=True)
class Pin:
    project: str
    version: str
    git_tag: str
    git_commit: str
    vllm_version: str
    local_version: str
    wheels: dict[str, str]
    sdist: dict[str, str]

    @classmethod
    def load(cls, path: Path = PIN_FILE) -> Pin:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise PinError(f"{path}: pin file missing; restore it from git") from exc
        except json.JSONDecodeError as exc:
            raise PinError(f"{path}: not valid JSON ({exc}); fix the syntax") from exc
        keys = ("project", "version", "git_tag", "git_commit", "vllm_version", "local_version", "wheels", "sdist")
        missing = [k for k in keys if k not in data]
        if missing:
            raise PinError(f"{path}: missing key(s) {', '.join(missing)}")
        return cls(**{k: data[k] for k in keys})

    @property
    def dist_name(self) -> str:
        return self.project.replace("-", "_")

    def targets(self) -> list[WheelTarget]:
        out = []
        for name in sorted(self.wheels):
            # vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl
            parts = name[: -len(".whl")].split("-")
            out.append(WheelTarget(parts[2], parts[4].removeprefix("manylinux_2_34_")))
        return out

    def wheel_name(self, target: WheelTarget) -> str:
        name = f"{self.dist_name}-{self.version}-{target.py}-{target.py}-{target.platform_tag}.whl"
        if name not in self.wheels:
            known = ", ".join(f"PY={t.py} ARCH={t.arch}" for t in self.targets())
            raise PinError(f"no pinned wheel for {target.name}; pinned targets: {known}")
        return name

    def all_files(self) -> dict[str, str]:
        return {**self.wheels, **self.sdist}


def sha256_of(path: Path) -> str:
    return file_digest(path, "sha256")


def file_digest(path: Path, algorithm: str) -> str:
    """A file's hex digest in ``algorithm`` (sha256, or another an index states a file's hash in)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def offline() -> bool:
    """``PATCHSET_OFFLINE=1`` (or true, yes, on): use only the cache, never the network; unset, empty, 0,
    false, no or off: the network too. Anything else is an error, not a silent download."""
    value = os.environ.get("PATCHSET_OFFLINE", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    shown = os.environ["PATCHSET_OFFLINE"][:40]
    raise PinError(f"PATCHSET_OFFLINE={shown!r}: set it to 1 to work from the cache only, or to 0 (or unset it)")


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(index_request(url), timeout=300) as resp, open(dest, "wb") as out:
        while block := resp.read(1 << 20):
            out.write(block)


def fetch(filename: str, sha256: str | None, project: str) -> Path:
    """Return the cached, verified file; download it (again, once) when needed.

    ``sha256=None`` trusts the index's own hash (used only by the re-pin check, for a
    release that is not pinned yet). A download lands in the cache only once it verifies,
    so a bad download or a wrong hash in ``pin.json`` never removes a good cached file.
    """
    dest_dir = cache_dir() / "downloads"
    dest = dest_dir / filename
    cached = sha256_of(dest) if dest.is_file() else None
    if cached is not None and (sha256 is None or cached == sha256):
        return dest
    if cached is not None:
        why = f"{dest} has sha256 {cached}, but pin.json pins {sha256}"
        if offline():
            raise PinError(
                f"{why}, and downloads are off (PATCHSET_OFFLINE=1); replace the file with the pinned one, "
                "or correct pin.json if the pin is wrong"
            )
        print(f"warning: {why}; downloading it again", file=sys.stderr)
    elif offline():
        raise PinError(
            f"{filename} is not in the cache {dest_dir} and downloads are off (PATCHSET_OFFLINE=1); "
            f"copy the file there (sha256 {sha256}) or allow network access"
        )
    remove_stale(dest_dir, DOWNLOAD_SCRATCH)
    scratch = scratch_dir(dest_dir, DOWNLOAD_SCRATCH)
    try:
        part = scratch / filename
        try:
            links = index_links(project)
            if filename not in links:
                raise PinError(not_listed(filename, links))
            url, index_hash = links[filename]
            _download(url, part)
        except (PinError, OSError, TimeoutError) as exc:
            raise PinError(
                f"cannot download {filename} from {shown_index()} ({exc}); with no network, put the file "
                f"(sha256 {sha256}) into {dest_dir}"
            ) from exc
        actual = sha256_of(part)
        if index_hash and ":" in index_hash:  # stated in another algorithm: checked in it, as pip does
            algorithm, _, stated = index_hash.partition(":")
            if (got := file_digest(part, algorithm)) != stated:
                raise PinError(
                    f"{filename}: {algorithm} mismatch: the index states {stated}, the download has {got}; "
                    "the download is corrupt or not the listed file (nothing was written to the cache)"
                )
            index_hash = None
        expected = sha256 or index_hash
        if expected and actual != expected:
            raise PinError(_mismatch(filename, sha256, index_hash, actual, cached))
        os.replace(part, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def _mismatch(filename: str, pinned: str | None, index_hash: str | None, actual: str, cached: str | None) -> str:
    """Why a download does not verify, and which side is likely wrong."""
    kept = "the cached copy was left as it was" if cached else "nothing was written to the cache"
    witnesses = [w for w, h in (("the index states it", index_hash), ("the cached copy has it", cached)) if h == actual]
    if pinned and witnesses:
        return (
            f"{filename}: sha256 mismatch: pin.json pins {pinned}, the download has {actual} and "
            f"{' and '.join(witnesses)}; pin.json's entry is probably wrong: check it against the index ({kept})"
        )
    return (
        f"{filename}: sha256 mismatch: expected {pinned or index_hash}, got {actual}; the download is corrupt "
        f"or not the expected file ({kept})"
    )


def fetch_wheel(pin: Pin, target: WheelTarget) -> Path:
    name = pin.wheel_name(target)
    return fetch(name, pin.wheels[name], pin.project)
