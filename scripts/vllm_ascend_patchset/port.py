"""Forward-port the patch set onto any vllm-ascend git checkout, and say what it took.

Each patch of ``patches/series`` is merged into the checkout hunk by hunk, with a
three-way merge whose base is the pinned release's own files (the pristine tree the
build unpacks, with the earlier patches applied): the hunk *applies* when its old
text is still in the file, is *merged* when the context moved or changed but the merge
is clean, is *already there* when upstream already has its change, and is a
*conflict* when upstream changed lines the hunk changes; the report shows that upstream
change. A target's series (``targets.py``) also has target versions of pinned patches,
applied with zero fuzz, or *refreshed* when the pinned patch changed since they were
made (that change is merged into them the same way). Then the overlay is copied in
(with the target's overlay patches), and for every overlay file
that replaces an upstream file the report shows whether (and how) upstream changed
that file since the pin, so the overlay can absorb it. Last, the metadata and config
contracts (``contracts.py``) run against the checkout.

The checkout is the work tree: the merged files (with conflict markers where a person
must decide) and the overlay files are written there, and nothing else is touched, not
even git's index. Files the port would write must have no uncommitted changes first,
so nothing is lost, and must not be links or the wrong kind of entry (``checkout_files``).
``dry_run`` writes nothing there and only reports. The merges are ``porter``'s, the
report ``port_report``'s, and what happens at each overlay file's path ``port_overlay``'s.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .checkout_files import path_problems, write_text
from .contracts import ASCEND_CONFIG, ATTENTION_V1, ContractResult, config_contract, metadata_contract
from .paths import BUILD_DIR, OVERLAY_DIR, PACKAGE
from .port_overlay import overlay_result
from .port_report import HEADING, PortReport
from .porter import Porter, read_lines
from .series import OverlayFile, Patch
from .targets import Step, UpstreamTarget

REPORT_DIR = BUILD_DIR / "port"


class PortError(RuntimeError):
    """The checkout cannot be ported into (not a git work tree, uncommitted changes, ...)."""


def _git(cwd: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise PortError(f"git {' '.join(args)} in {cwd} failed: {res.stderr.strip()}")
    return res.stdout.rstrip()


def check_top_level(upstream: Path) -> None:
    """UPSTREAM_SRC must name the top of a git checkout: refused, with the fix, when it is missing,
    not a git checkout, or a folder inside one."""
    if not upstream.is_dir():
        raise PortError(f"UPSTREAM_SRC {upstream}: not a directory; give a vllm-ascend git checkout")
    res = subprocess.run(["git", "-C", str(upstream), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if res.returncode != 0:
        raise PortError(f"UPSTREAM_SRC {upstream}: not a git checkout; give a vllm-ascend git checkout")
    top = Path(res.stdout.strip()).resolve()
    if top != upstream.resolve():
        raise PortError(f"UPSTREAM_SRC {upstream}: a folder inside a checkout; give its top level, {top}")


def not_utf8(upstream: Path, paths: list[str]) -> list[str]:
    """One line per file of ``paths`` (in the checkout; absent ones skipped) that is not UTF-8, with where."""
    found = []
    for path in dict.fromkeys(paths):
        try:
            data = (upstream / path).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            found.append(f"{path}: byte 0x{data[error.start]:02x} on line {line} ({error.reason})")
    return found


def _check_checkout(upstream: Path, paths: list[str], dry_run: bool) -> tuple[str, str]:
    """(commit, describe) of the checkout; refuses one the port could damage."""
    problems = path_problems(upstream, paths)
    if problems:
        raise PortError(
            f"{upstream}: the port refuses paths it writes, and nothing was written:\n  " + "\n  ".join(problems)
        )
    if not (upstream / PACKAGE / "__init__.py").is_file():
        raise PortError(f"{upstream} holds no {PACKAGE}/__init__.py; point UPSTREAM_SRC at a vllm-ascend checkout")
    undecodable = not_utf8(upstream, [*paths, f"{PACKAGE}/{ATTENTION_V1}", f"{PACKAGE}/{ASCEND_CONFIG}"])
    if undecodable:
        raise PortError(
            f"{upstream}: the port reads and writes UTF-8 text, and these files it reads are not UTF-8:\n  "
            + "\n  ".join(undecodable)
            + "\nconvert each to UTF-8 in a commit (e.g. iconv -f latin1 -t utf-8 FILE), then port again; "
            "nothing was written"
        )
    check_top_level(upstream)
    commit = _git(upstream, "rev-parse", "HEAD")
    describe = _git(upstream, "describe", "--tags", "--always")
    if not dry_run:
        dirty = _git(upstream, "status", "--porcelain", "--untracked-files=all", "--ignored=matching", "--", *paths)
        if dirty:
            raise PortError(
                f"{upstream} has uncommitted changes in files the port writes:\n{dirty}\ncommit or stash them, "
                "move an ignored (!!) file away (or 'git checkout -- <file>' to drop an earlier port), then run the "
                "port again"
            )
    return commit, describe


def check_descends(upstream: Path, target: UpstreamTarget) -> None:
    """A target's series is made for its commit: a checkout whose HEAD does not build on it (a
    release branch, an older commit) would only report the differences as conflicts."""
    check_top_level(upstream)
    res = subprocess.run(
        ["git", "-C", str(upstream), "merge-base", "--is-ancestor", target.commit, "HEAD"], capture_output=True
    )
    if res.returncode != 0:
        raise PortError(
            f"{upstream}: its HEAD does not contain {target.ref} at {target.commit[:12]}, which target "
            f"'{target.name}' is made for; check out {target.ref} (or a later commit of it) there, or drop "
            "TARGET to port the pinned series (a release branch)"
        )


def port(
    upstream: Path,
    *,
    patches: list[Patch],
    overlay: list[OverlayFile],
    pristine_pkg: Path,
    pin_name: str,
    overlay_dir: Path = OVERLAY_DIR,
    dry_run: bool = False,
    target: UpstreamTarget | None = None,
) -> PortReport:
    """Port the series (or ``target``'s) and the overlay into the checkout ``upstream``; see the module docstring."""
    upstream = upstream.resolve()
    steps = target.steps if target else tuple(Step(p, True) for p in patches)
    overlay_patches = target.overlay_patches if target else ()
    patched_paths = list(dict.fromkeys(f for step in steps for f in step.patch.files))
    overlay_paths = [e.repo_path for e in overlay]
    commit, describe = _check_checkout(upstream, patched_paths + overlay_paths, dry_run)
    base = f"vllm-ascend {pin_name} (the pinned release's files)"
    if target:
        base += f"; series of target '{target.name}' (made for {target.ref} at {target.commit[:12]})"
    report = PortReport(upstream, commit, describe, base, dry_run=dry_run, target=target.name if target else "")

    porter = Porter(lambda path: read_lines(upstream / path), pristine_pkg, pin_name)
    if target:
        porter.history = target.history
    for step in steps:
        porter.run(step)
    overlay_files = porter.overlay(overlay, overlay_patches)
    report.hunks = porter.hunks
    report.changes, report.refreshed = porter.changes, porter.refreshed
    report.overlay = [
        overlay_result(e, overlay_files[e.repo_path], pristine_pkg, upstream / PACKAGE, pin_name) for e in overlay
    ]
    with tempfile.TemporaryDirectory(prefix="port-overlay-") as tmp:
        if overlay_patches:  # the contracts read our modules as the target gets them
            overlay_dir = Path(tmp)
            for path, lines in overlay_files.items():
                dest = overlay_dir / path.removeprefix(f"{PACKAGE}/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text("".join(lines))
        report.contracts = metadata_contract(upstream / PACKAGE, overlay_dir) + config_contract(
            upstream / PACKAGE, pristine_pkg, overlay_dir, [step.patch for step in steps]
        )
    if target:
        report.contracts = answered_contracts(report.contracts, target)
    if not dry_run:
        for path, lines in porter.current.items():
            if any(path in change.after for change in porter.changes):
                write_text(upstream, path, "".join(lines))
                report.written.append(path)
        for entry, result in zip(overlay, report.overlay, strict=True):
            if result.written:  # never over a file upstream added at the path of a new one of ours
                write_text(upstream, entry.repo_path, "".join(overlay_files[entry.repo_path]))
                report.written.append(entry.repo_path)
    return report


def answered_contracts(results: list[ContractResult], target: UpstreamTarget) -> list[ContractResult]:
    """Failed contracts the target's patches answer become ok, saying how; an answer to nothing is an error."""
    out = []
    used = set()
    for c in results:
        answer = target.answers.get(c.subject)
        if answer is not None and not c.ok:
            used.add(c.subject)
            c = ContractResult(
                c.subject, True, f"answered by target {target.name}: {answer} (check: {c.detail})", c.where
            )
        out.append(c)
    for subject in sorted(set(target.answers) - used):
        detail = "no failing contract has this subject any more: drop it from answered_contracts"
        out.append(ContractResult(subject, False, detail, f"patches/targets/{target.name}/target.json"))
    return out


def _report_problem(path: Path, upstream: Path | None = None) -> str | None:
    """Why the report cannot be written at ``path`` (made with its folders), or None. It must lie outside the
    checkout ``upstream`` (the port writes there, and git shows the checkout's own files), and an existing file
    is written over only when it is empty or a report this tool wrote (its first line starts with ``HEADING``)."""
    path = Path(os.path.realpath(path))  # a link is written through: check where it leads
    if upstream is not None and path.is_relative_to(top := Path(os.path.realpath(upstream))):
        return f"is inside the checkout being ported ({top}); give a path outside it, e.g. --report {REPORT_DIR}/x.txt"
    if path.is_dir():
        return f"is a folder; give a file in it, e.g. --report {path / 'port-report.txt'}"
    if path.exists():
        if not path.is_file():
            return "is not a regular file; give the path of a file (new or a report to overwrite)"
        try:
            with open(path, "rb") as handle:  # opening to read changes nothing
                first = handle.read(len(HEADING.encode()))
            with open(path, "a"):  # nor does opening for append
                pass
        except OSError as error:
            return f"cannot be written ({error.strerror}); give a writable path"
        if first and first != HEADING.encode():
            return (
                f"is a file that is not a port report (its first line does not start with '{HEADING.strip()}'), "
                "and the report would replace it; give a new path, or move that file away"
            )
        return None
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file where a folder is needed; give a path under a folder"
    try:  # the only sure test that a file can be made there (permissions, read-only mounts, /proc)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".port-report-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return f"no file can be made in {folder} ({error.strerror}); give a path in a writable folder"
    return None


def check_report_path(path: Path | None, upstream: Path | None = None) -> None:
    """Refuse a report path that cannot be written, or must not be, before the port writes anything (``port``
    would have written the checkout first, then failed, and a rerun is refused for the changes it made). The
    default path's name comes from the checkout, so its folder is what is checked."""
    shown = f"--report {path}" if path is not None else f"the report folder {REPORT_DIR}"
    problem = _report_problem(path if path is not None else REPORT_DIR / "report.txt", upstream)
    if problem is not None:
        raise PortError(f"{shown}: {problem}; nothing was ported")


def write_report(report: PortReport, path: Path | None = None) -> Path:
    """The full report, by default ``build/port/<ref>.txt`` (``<ref>-target-<name>.txt`` for a target's series)."""
    path = path or REPORT_DIR / (
        f"{report.describe}-target-{report.target}.txt" if report.target else f"{report.describe}.txt"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.render(full=True))
    except OSError as error:  # checked before the port (check_report_path); the disk may still fill up
        done = "nothing was written to the checkout" if report.dry_run else f"{len(report.written)} files were written"
        raise PortError(
            f"the full report could not be written to {path} ({error.strerror}); {done}, as the short report "
            "above says; 'git -C <checkout> diff' shows the port's changes"
        ) from None
    return path
