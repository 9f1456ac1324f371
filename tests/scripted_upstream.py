"""A scripted vllm-ascend upstream for the port tests: pinned files in git, then scripted changes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path

from git_repo import git, init_repo
from vllm_ascend_patchset.contracts import ASCEND_CONFIG, ATTENTION_V1
from vllm_ascend_patchset.paths import PACKAGE
from vllm_ascend_patchset.port import port
from vllm_ascend_patchset.port_report import PortReport
from vllm_ascend_patchset.series import load_overlay, load_patches
from vllm_ascend_patchset.trees import pristine_root

PIN_NAME = "v0.23.0"


@functools.cache
def pristine_package() -> Path:
    """The pinned release's vllm_ascend/ (unpacked from the cached pinned wheel); checked once per session."""
    return pristine_root() / PACKAGE


def port_inputs() -> set[str]:
    """The pinned files the series and the contracts read (repo paths): what a scripted upstream holds."""
    wanted = {f for p in load_patches() for f in p.files}
    wanted |= {e.repo_path for e in load_overlay() if e.replaces}
    return wanted | {f"{PACKAGE}/{ATTENTION_V1}", f"{PACKAGE}/{ASCEND_CONFIG}"}


def port_onto(repo: Path, pristine: Path, **kwargs) -> PortReport:
    """The pinned series and overlay ported onto ``repo`` (``port``'s keyword arguments pass through)."""
    return port(
        repo, patches=load_patches(), overlay=load_overlay(), pristine_pkg=pristine, pin_name=PIN_NAME, **kwargs
    )


def upstream_repo(
    path: Path, pristine: Path, files: Iterable[str], change: Callable[[Path], None] | None = None
) -> Path:
    """``files`` (repo paths) as pinned, committed as 'pin'; then ``change`` committed as 'upstream moves on'."""
    repo = init_repo(path, {rel: (pristine.parent / rel).read_bytes() for rel in sorted(set(files))}, "pin")
    if change is not None:
        change(repo)
        git(repo, "commit", "-qam", "upstream moves on")
    return repo


def edit(repo: Path, path: str, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``repo/path``."""
    target = repo / path
    text = target.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path}"
    target.write_text(text.replace(old, new))


def status(repo: Path) -> set[str]:
    """Paths git reports as changed or untracked."""
    return {line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()}
