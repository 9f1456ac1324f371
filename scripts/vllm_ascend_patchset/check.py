"""Re-pin check: does the patch set apply to another published upstream release?

Downloads that release's wheel for this machine (trusting the index's own hash, since
it is not pinned yet), then reports per patch and per replaced overlay file whether it
still applies. Nothing is written outside the cache and a temporary folder.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .assemble import PatchError, apply_patch, check_overlay, pristine_tree
from .pin import Pin, PinError, Target, _index_links, fetch
from .series import PACKAGE, SeriesError, load_overlay, load_patches


@dataclass(frozen=True)
class CheckResult:
    item: str
    ok: bool
    detail: str


def find_release_wheel(project: str, version: str, target: Target) -> str:
    names = sorted(_index_links(project))
    dist = project.replace("-", "_")
    for name in names:
        parts = name[: -len(".whl")].split("-") if name.endswith(".whl") else []
        if (
            len(parts) == 5
            and parts[0] == dist
            and parts[1] == version
            and parts[2] == target.py
            and parts[4].endswith(target.arch)
        ):
            return name
    have = sorted({n.split("-")[1] for n in names if n.endswith(".whl")})
    raise PinError(
        f"no {project} {version} wheel for {target.name} on the index; releases with wheels: {', '.join(have[-10:])}"
    )


def check_release(version: str, target: Target | None = None, pin: Pin | None = None) -> list[CheckResult]:
    pin = pin or Pin.load()
    target = target or Target.host()
    wheel = fetch(find_release_wheel(pin.project, version, target), None, pin.project)
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
