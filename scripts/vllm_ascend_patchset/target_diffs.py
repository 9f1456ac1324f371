"""``make diffs TARGET=<name>``: the git am-able series for another upstream (e.g. main).

The series is regenerated from the current patches, overlay and ``patches/targets/<name>``:
the target's files are read from its commit in a local upstream checkout (nothing in
that checkout changes), the target's series is ported onto them in a scratch
repository (``port.py``), and each step's change becomes one mail, each overlay file
one mail, grouped by feature as ``make diffs`` does for the pin. It is then checked:
the mails are replayed with ``git am`` on a fresh copy of the target's files and must
give the ported tree exactly. Target patches whose pinned patch (or overlay file)
changed since they were made are brought up to date in ``patches/targets/<name>``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .assemble import Assembly
from .contracts import ASCEND_CONFIG, ATTENTION_V1
from .diffs import _diff_lines, write_diffs
from .pin import ROOT
from .pin import Target as Platform
from .port import PortReport, port
from .series import PACKAGE, OverlayFile, Patch, load_overlay, load_patches, parse_header
from .targets import Target, with_header

DIST_DIR = ROOT / "dist"


class TargetDiffsError(RuntimeError):
    """The target's series does not port cleanly, or its mails do not replay."""


@dataclass(frozen=True)
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


def _snapshot(upstream_src: Path, commit: str, paths: list[str], dest: Path) -> dict[str, bytes]:
    """The target commit's version of ``paths`` (those it has), committed in a new repository at ``dest``."""
    check = subprocess.run(["git", "-C", str(upstream_src), "cat-file", "-e", f"{commit}^{{commit}}"])
    if check.returncode != 0:
        raise TargetDiffsError(
            f"commit {commit} is not in {upstream_src}; fetch the target's ref there (git fetch origin) and run again"
        )
    files = {}
    for path in paths:
        res = subprocess.run(["git", "-C", str(upstream_src), "show", f"{commit}:{path}"], capture_output=True)
        if res.returncode == 0:
            files[path] = res.stdout
    dest.mkdir(parents=True)
    _git(dest, "init", "-q")
    for path, data in files.items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(data)
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", f"upstream {commit}")
    return files


def write_target_diffs(
    target: Target, upstream_src: Path, *, pristine_pkg: Path, pin_name: str, out_dir: Path | None = None
) -> TargetDiffs:
    out_dir = out_dir or DIST_DIR / f"upstream-{target.name}"
    overlay = load_overlay()
    paths = list(
        dict.fromkeys(
            [f"{PACKAGE}/__init__.py", f"{PACKAGE}/{ATTENTION_V1}", f"{PACKAGE}/{ASCEND_CONFIG}"]
            + [f for step in target.steps for f in step.patch.files]
            + [e.repo_path for e in overlay]
        )
    )
    with tempfile.TemporaryDirectory(prefix=f"diffs-{target.name}-") as tmp:
        work = Path(tmp)
        files = _snapshot(upstream_src, target.commit, paths, work / "ported")
        report = port(
            work / "ported",
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
        assert report.porter is not None
        # one mail per step: its change to the target's files, under its own header
        staged_patches = work / "patches"
        staged_patches.mkdir()
        patches = []
        for change in report.porter.changes:
            if change.after == change.before:
                continue
            diff = "".join(_diff_lines(change.before[p], change.after[p], p, False) for p in change.after)
            path = staged_patches / change.patch.name
            path.write_text(with_header(change.patch.header, diff))
            patches.append(Patch(path.name, path, parse_header(path), tuple(change.after)))
        # the overlay as the target gets it; replaced files diff against the target's version
        staged_overlay, target_files = work / "overlay", work / "target-files"
        entries = []
        for entry in overlay:
            dest = staged_overlay / entry.relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "ported" / entry.repo_path, dest)
            replaces = entry.replaces and entry.repo_path in files  # one the target dropped is new again
            entries.append(OverlayFile(entry.relpath, entry.feature, replaces, overlay_dir=staged_overlay))
            if replaces:
                (target_files / entry.repo_path).parent.mkdir(parents=True, exist_ok=True)
                (target_files / entry.repo_path).write_bytes(files[entry.repo_path])
        assembly = Assembly(
            target=Platform.host(),
            root=work / "ported",
            pristine=target_files,
            wheel=Path(),
            patches=tuple(patches),
            overlay=tuple(entries),
        )
        written = write_diffs(assembly, out_dir)
        (out_dir / "ORDER").write_text(
            f"Apply the series in this order on {target.repository} {target.ref} at {target.commit} "
            "(git am DIR/*.patch):\n" + "".join(f"{feature}\n" for feature in written)
        )
        _replay(written, files, work / "replay", work / "ported")
    refreshed = []
    for path, text in report.porter.refreshed.items():
        path.write_text(text)
        refreshed.append(path)
    return TargetDiffs(report, written, out_dir, refreshed)


def _replay(written: dict[str, list[Path]], files: dict[str, bytes], repo: Path, ported: Path) -> None:
    """git am every mail, feature by feature, on the target's files; the result must be the ported tree."""
    repo.mkdir()
    _git(repo, "init", "-q")
    for path, data in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "target")
    for mails in written.values():
        _git(repo, "am", "-q", *[str(m) for m in mails])
    changed = _git(repo, "diff", "--name-only", "HEAD~" + str(sum(len(m) for m in written.values())), "HEAD").split()
    ported_changed = [line[3:] for line in _git(ported, "status", "--porcelain", "--untracked-files=all").splitlines()]
    if sorted(changed) != sorted(ported_changed):
        raise TargetDiffsError(f"the mail series changes {sorted(changed)}, the port {sorted(ported_changed)}")
    for path in changed:
        if (repo / path).read_bytes() != (ported / path).read_bytes():
            raise TargetDiffsError(f"the mail series does not reproduce the ported {path}")
