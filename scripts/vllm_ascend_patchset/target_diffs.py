"""``make diffs TARGET=<name>``: the git am-able series for another upstream (e.g. main).

The series is regenerated from the current patches, overlay and ``patches/targets/<name>``:
the target commit's ``vllm_ascend/`` is read from a local upstream checkout (nothing in
that checkout changes), the target's series is ported onto it in a scratch repository
(``port.py``), and each step's change and each overlay file become the changes that
``make diffs`` orders and groups into commits for the pin (by feature, then by what they
import, read from the whole target package). It is then checked: the mails are replayed
with ``git am`` on a fresh copy of the target's files and must give the ported tree
exactly. Target patches whose pinned patch (or overlay file)
changed since they were made are brought up to date in ``patches/targets/<name>``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .assemble import Assembly
from .diffs import left_out, write_diffs
from .hunks import git_diff
from .paths import DIST_DIR, PACKAGE
from .port import PortError, check_top_level, port
from .port_report import PortReport
from .series import OverlayFile, Patch, load_overlay, load_patches, parse_header
from .targets import UpstreamTarget, with_header
from .wheel_target import WheelTarget


class TargetDiffsError(RuntimeError):
    """The target's series does not port cleanly, or its mails do not replay."""


@dataclass
class TargetDiffs:
    report: PortReport
    written: dict[str, list[Path]]
    out_dir: Path
    refreshed: list[Path]


def _git(cwd: Path, *args: str, env: dict | None = None) -> str:
    base = {
        "GIT_AUTHOR_NAME": "port",
        "GIT_AUTHOR_EMAIL": "port@localhost",
        "GIT_COMMITTER_NAME": "port",
        "GIT_COMMITTER_EMAIL": "port@localhost",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**base, **(env or {})})
    if res.returncode != 0:
        raise TargetDiffsError(f"git {' '.join(args)} in {cwd}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def _snapshot(upstream_src: Path, commit: str, dest: Path) -> None:
    """The target commit's ``vllm_ascend/``, committed in a new repository at ``dest``.

    The whole package, not only the files the series touches: the mail series is ordered
    by what each change imports (``diffs``), and whether an imported name is a submodule is
    read from the files of the tree.
    """
    try:
        check_top_level(upstream_src)
    except PortError as error:
        raise TargetDiffsError(str(error)) from None
    check = subprocess.run(
        ["git", "-C", str(upstream_src), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if check.returncode != 0:
        raise TargetDiffsError(
            f"commit {commit} is not in {upstream_src}; fetch the target's ref there (git fetch origin) and run again"
        )
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(upstream_src), "archive", "--format=tar", commit, PACKAGE], capture_output=True
    )
    if archive.returncode != 0:
        raise TargetDiffsError(f"git archive {commit} {PACKAGE} in {upstream_src}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", f"upstream {commit}")


def write_target_diffs(
    target: UpstreamTarget,
    upstream_src: Path,
    *,
    pristine_pkg: Path,
    pin_name: str,
    out_dir: Path | None = None,
    author: str | None = None,
) -> TargetDiffs:
    out_dir = out_dir or DIST_DIR / f"upstream-{target.name}"
    overlay = load_overlay()
    with tempfile.TemporaryDirectory(prefix=f"diffs-{target.name}-") as tmp:
        work = Path(tmp)
        ported, target_tree = work / "ported", work / "target"
        _snapshot(upstream_src, target.commit, ported)
        _git(work, "clone", "-q", str(ported), str(target_tree))  # the target's files: the mails' base, then replay
        report = port(
            ported,
            patches=load_patches(),
            overlay=overlay,
            pristine_pkg=pristine_pkg,
            pin_name=pin_name,
            target=target,
        )
        if not report.ok:
            raise TargetDiffsError(
                f"the series of target {target.name} does not port cleanly onto {target.commit}:\n\n"
                + report.render(full=False)
            )
        # one mail per step: its change to the target's files, under its own header
        staged_patches = work / "patches"
        staged_patches.mkdir()
        patches = []
        for change in report.changes:
            if change.after == change.before:
                continue
            diff = "".join(git_diff(change.before[p], change.after[p], p, False) for p in change.after)
            path = staged_patches / change.patch.name
            path.write_text(with_header(change.patch.header, diff))
            patches.append(Patch(path.name, path, parse_header(path), tuple(change.after)))
        # the overlay as the target gets it; replaced files diff against the target's version
        staged_overlay = work / "overlay"
        entries = []
        for entry in overlay:
            dest = staged_overlay / entry.relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ported / entry.repo_path, dest)
            replaces = entry.replaces and (target_tree / entry.repo_path).is_file()  # one the target dropped is new
            entries.append(OverlayFile(entry.relpath, entry.feature, replaces, staged_overlay, entry.forwarded))
        assembly = Assembly(
            target=WheelTarget.host(),
            root=ported,
            pristine=target_tree,
            wheel=Path(),
            patches=tuple(patches),
            overlay=tuple(entries),
        )
        written = write_diffs(assembly, out_dir, f"{target.repository} {target.ref} at {target.commit}", author)
        _replay(written, target_tree, ported, left_out(assembly))
    refreshed = []
    for path, text in report.refreshed.items():
        path.write_text(text)
        refreshed.append(path)
    return TargetDiffs(report, written, out_dir, refreshed)


def _replay(written: dict[str, list[Path]], repo: Path, ported: Path, own: set[str]) -> None:
    """git am every mail, feature by feature, on the target's files (``repo``); the result must be the ported
    tree, but for the files only the patch set's own changes touch (``own``: the mails leave them alone)."""
    for mails in written.values():
        _git(repo, "am", "-q", *[str(m) for m in mails])
    changed = _git(repo, "diff", "--name-only", "HEAD~" + str(sum(len(m) for m in written.values())), "HEAD").split()
    ported_changed = [
        path
        for path in (line[3:] for line in _git(ported, "status", "--porcelain", "--untracked-files=all").splitlines())
        if path not in own
    ]
    if sorted(changed) != sorted(ported_changed):
        raise TargetDiffsError(f"the mail series changes {sorted(changed)}, the port {sorted(ported_changed)}")
    for path in changed:
        if (repo / path).read_bytes() != (ported / path).read_bytes():
            raise TargetDiffsError(f"the mail series does not reproduce the ported {path}")
