"""Re-pin check: does the patch set apply to another published upstream release?

Downloads that release's wheel for this machine (trusting the index's own hash, since
it is not pinned yet; the pinned release is checked against ``pin.json`` and needs no
index when cached; ``PATCHSET_OFFLINE=1`` uses only the cache), then reports per patch
and per replaced overlay file whether it still applies. Nothing is written outside the
cache and a temporary folder.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .assemble import PatchError, apply_patch, check_overlay
from .paths import PACKAGE, cache_dir
from .pin import Pin, PinError, fetch, fetch_wheel, index_links, offline
from .series import SeriesError, load_overlay, load_patches
from .trees import pristine_tree
from .wheel_target import WheelTarget

try:
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare python3 with pip only: pip vendors packaging
    from pip._vendor.packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class CheckResult:
    item: str
    ok: bool
    detail: str


def _is_release_wheel(name: str, project: str, version: str, target: WheelTarget) -> bool:
    """``vllm_ascend-<version>-<py>-<py>-<platform ending in arch>.whl``."""
    parts = name[: -len(".whl")].split("-") if name.endswith(".whl") else []
    return (
        len(parts) == 5
        and parts[0] == project.replace("-", "_")
        and parts[1] == version
        and parts[2] == target.py
        and parts[4].endswith(target.arch)
    )


def _version_key(text: str) -> tuple[int, Any]:
    """PEP 440 order (0.10.0 after 0.9.2); a version that does not parse sorts first."""
    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, text)


def find_release_wheel(project: str, version: str, target: WheelTarget) -> str:
    names = sorted(index_links(project))
    for name in names:
        if _is_release_wheel(name, project, version, target):
            return name
    have = sorted({n.split("-")[1] for n in names if n.endswith(".whl")}, key=_version_key)
    raise PinError(
        f"no {project} {version} wheel for {target.name} on the index; releases with wheels, newest last: "
        f"{', '.join(have[-10:])}"
    )


def release_wheel(pin: Pin, version: str, target: WheelTarget) -> Path:
    """The verified wheel of ``version`` for ``target``.

    The pinned release is fetched by its pinned hash and needs no index when it is cached.
    Another release comes from the index, or with ``PATCHSET_OFFLINE=1`` from the cache.
    """
    if version == pin.version and target in pin.targets():
        return fetch_wheel(pin, target)
    if not offline():
        return fetch(find_release_wheel(pin.project, version, target), None, pin.project)
    downloads = cache_dir() / "downloads"
    cached = sorted(p.name for p in downloads.glob("*.whl") if _is_release_wheel(p.name, pin.project, version, target))
    if not cached:
        raise PinError(
            f"downloads are off (PATCHSET_OFFLINE=1) and the cache {downloads} holds no {pin.project} {version} "
            f"wheel for {target.name}; allow network access or put that wheel there"
        )
    return fetch(cached[0], None, pin.project)


def check_release(version: str, target: WheelTarget | None = None, pin: Pin | None = None) -> list[CheckResult]:
    try:  # before the index is read: it would only say that no wheel has that version
        Version(version)
    except InvalidVersion:
        raise ValueError(f"check-pin VERSION {version!r}: not a release version; give one such as 0.24.0") from None
    pin = pin or Pin.load()
    target = target or WheelTarget.host()
    wheel = release_wheel(pin, version, target)
    pristine = pristine_tree(wheel)
    results: list[CheckResult] = []
    patches = load_patches()
    with tempfile.TemporaryDirectory(prefix="check-pin-") as tmp:
        tree = Path(tmp)
        shutil.copytree(pristine / PACKAGE, tree / PACKAGE)
        for patch in patches:
            try:
                apply_patch(patch, tree)
                results.append(CheckResult(patch.name, True, "applies"))
            except PatchError as exc:
                results.append(CheckResult(patch.name, False, str(exc)))
    for entry in load_overlay():
        try:
            check_overlay([entry], patches, pristine / PACKAGE)
            results.append(CheckResult(f"overlay {entry.relpath}", True, "replaces" if entry.replaces else "new"))
        except SeriesError as exc:
            results.append(CheckResult(f"overlay {entry.relpath}", False, str(exc)))
    return results
