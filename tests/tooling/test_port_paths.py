"""The paths the port writes: our files where upstream has its own, links, and the wrong kind of entry.

A committed symlink at a path the port writes (or at one of its folders) would send our
text to a file outside the checkout, where git shows nothing and its content is lost; a
folder where a file goes (or the reverse) would stop the port half-way. Each is refused,
naming the path, before anything is written. A file upstream added at the path of one
of our new files is a conflict: the port keeps upstream's, says so and says what to do.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from git_repo import git
from scripted_upstream import port_inputs, port_onto, status, upstream_repo
from vllm_ascend_patchset import cli
from vllm_ascend_patchset import port as port_module
from vllm_ascend_patchset.checkout_files import CheckoutPathError, path_problems, write_text
from vllm_ascend_patchset.paths import OVERLAY_DIR, PACKAGE
from vllm_ascend_patchset.port import PortError, port
from vllm_ascend_patchset.series import load_overlay, load_patches

OURS = "core/cpp_config.py"  # a new file of ours that our patches import
FOLDER = "dual_stream"  # a folder only we have
PRECIOUS = "# a file outside the checkout\n"


def _repo(tmp_path: Path, pristine: Path, change: Callable[[Path], None] | None = None) -> Path:
    """The pinned files the series and the contracts read; ``change`` (new entries staged) is committed."""

    def committed(repo: Path) -> None:
        assert change is not None
        change(repo)
        git(repo, "add", "-A")

    return upstream_repo(tmp_path / "upstream", pristine, port_inputs(), committed if change else None)


def _outside(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "victim.py"
    victim.parent.mkdir()
    victim.write_text(PRECIOUS)
    return victim


def _to_resolve(text: str) -> str:
    return text.split("\nTo resolve")[1].split("\n\n")[0]


# Upstream added a file at the path of one of our new files.


def test_a_file_upstream_added_at_the_path_of_ours_is_a_conflict_that_fails_the_port(tmp_path, pristine, capsys):
    upstream_text = "UPSTREAMS_OWN_MODULE = True\n"
    repo = _repo(tmp_path, pristine, lambda r: (r / PACKAGE / OURS).write_text(upstream_text))

    code = cli.main(["port", str(repo), "--report", str(tmp_path / "report.txt")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert (repo / PACKAGE / OURS).read_text() == upstream_text, "upstream's file is kept"
    assert f"{PACKAGE}/{OURS}" not in status(repo), "ours was not written over it"
    todo = _to_resolve(out)
    # what it did and what it advises agree, in plain words
    assert f"{PACKAGE}/{OURS}: upstream added its own file here; the port kept it and did not write ours" in todo
    assert "import it now get upstream's module" in todo
    assert f"rename ours (vllm_ascend_overlay/{OURS}, its line in patches/overlay.manifest" in todo
    assert "to a path upstream does not use, then port again" in todo
    assert "once the pin has the file, declare ours 'replaces' in patches/overlay.manifest" in todo
    assert "absorb" not in todo


def test_upstream_holding_our_file_as_it_is_is_no_conflict(tmp_path, pristine):
    """Our file merged upstream unchanged (a contribution landed): nothing to decide."""
    repo = _repo(tmp_path, pristine, lambda r: (r / PACKAGE / OURS).write_bytes((OVERLAY_DIR / OURS).read_bytes()))
    report = port_onto(repo, pristine)
    mine = next(o for o in report.overlay if o.relpath == OURS)
    assert "already there" in mine.status and report.ok, report.render()
    assert f"{PACKAGE}/{OURS}" not in report.written and f"{PACKAGE}/{OURS}" not in status(repo)


def test_exit_status_1_exactly_when_the_report_lists_something_to_resolve(tmp_path, pristine):
    """A replaced file upstream changed is reviewed (its diff is in the report), not resolved: exit 0."""
    replaced = next(e for e in load_overlay() if e.replaces)

    def change(repo: Path) -> None:
        path = repo / replaced.repo_path
        path.write_text(path.read_text() + "# upstream changed this file\n")

    report = port_onto(_repo(tmp_path, pristine, change), pristine, dry_run=True)
    text = report.render()
    assert report.ok and _to_resolve(text) == "\n  nothing", text
    review = text.split("\nTo review")[1]
    assert f"absorb upstream's change since the pin into vllm_ascend_overlay/{replaced.relpath}" in review


# Links, folders and files where the port writes.


def test_a_committed_symlink_at_a_patched_file_is_refused_and_its_target_keeps_its_text(tmp_path, pristine, capsys):
    victim = _outside(tmp_path)
    path = load_patches()[0].files[0]

    def link(repo: Path) -> None:
        (repo / path).unlink()
        os.symlink(victim, repo / path)

    repo = _repo(tmp_path, pristine, link)
    for dry_run in (False, True):
        with pytest.raises(PortError) as error:
            port_onto(repo, pristine, dry_run=dry_run)
        assert f"{path} is a symbolic link (to {victim})" in str(error.value)
        assert "never writes through a link" in str(error.value) and "nothing was written" in str(error.value)
    assert victim.read_text() == PRECIOUS
    assert status(repo) == set(), "nothing written in the checkout either"

    assert cli.main(["port", str(repo), "--report", str(tmp_path / "r.txt")]) == 2
    assert f"{path} is a symbolic link" in capsys.readouterr().err


def test_a_dangling_symlink_at_the_path_of_a_new_file_of_ours_is_refused(tmp_path, pristine):
    missing = tmp_path / "elsewhere" / "not-yet.py"
    repo = _repo(tmp_path, pristine, lambda r: os.symlink(missing, r / PACKAGE / OURS))
    with pytest.raises(PortError, match=f"{PACKAGE}/{OURS} is a symbolic link"):
        port_onto(repo, pristine)
    assert not missing.exists() and not missing.parent.exists()


def test_a_symlinked_folder_the_port_writes_into_is_refused(tmp_path, pristine):
    elsewhere = _outside(tmp_path).parent
    folder = FOLDER
    assert [e for e in load_overlay() if e.relpath.startswith(f"{folder}/")], f"the overlay has {folder}/"
    repo = _repo(tmp_path, pristine, lambda r: os.symlink(elsewhere, r / PACKAGE / folder))
    with pytest.raises(PortError, match=f"{PACKAGE}/{folder} is a symbolic link .*a folder of {PACKAGE}/{folder}/"):
        port_onto(repo, pristine)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.py"]


def test_a_folder_where_a_file_goes_and_a_file_where_a_folder_goes_are_refused_together(tmp_path, pristine):
    """Both listed at once, before anything is written: the port used to stop half-way with a traceback."""
    folder = FOLDER

    def change(repo: Path) -> None:
        (repo / PACKAGE / OURS).mkdir()
        (repo / PACKAGE / OURS / "keep.txt").write_text("upstream's\n")
        (repo / PACKAGE / folder).write_text("a file named like our folder\n")

    repo = _repo(tmp_path, pristine, change)
    with pytest.raises(PortError) as error:
        port_onto(repo, pristine)
    message = str(error.value)
    assert f"{PACKAGE}/{OURS} is a folder where the port writes a file" in message
    assert f"{PACKAGE}/{folder} is a file where the port needs a folder" in message
    assert status(repo) == set()


def test_paths_that_leave_the_checkout_are_refused(tmp_path):
    (tmp_path / "pkg").mkdir()
    problems = path_problems(tmp_path, ["pkg/../../x.py", "/etc/x.py", "pkg/ok.py", ""])
    assert len(problems) == 3 and all("is not a path inside the checkout" in p for p in problems), problems


def test_a_patch_naming_a_file_outside_the_checkout_is_refused_before_anything_is_read(tmp_path, pristine):
    victim = _outside(tmp_path)
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "series").write_text("0001-out.patch\n")
    escape = os.path.relpath(victim, tmp_path / "upstream")
    (patches / "0001-out.patch").write_text(
        "Description: reaches out\nFeature: build\nForwarded: no\n\n"
        f"--- a/{escape}\n+++ b/{escape}\n@@ -1 +1 @@\n-{PRECIOUS}+# ours\n"
    )
    repo = _repo(tmp_path, pristine)
    for dry_run in (False, True):  # a dry run would read it
        with pytest.raises(PortError, match=re.escape(f"'{escape}' is not a path inside the checkout")):
            port(
                repo,
                patches=load_patches(patches),
                overlay=[],
                pristine_pkg=pristine,
                pin_name="v0.23.0",
                dry_run=dry_run,
            )
    assert victim.read_text() == PRECIOUS


def test_the_port_keeps_a_written_files_mode_and_leaves_its_other_hard_links_alone(tmp_path, pristine):
    path = load_patches()[0].files[0]
    repo = _repo(tmp_path, pristine)
    (repo / path).chmod(0o755)
    git(repo, "commit", "-qam", "executable")
    linked = tmp_path / "hard-link.py"
    os.link(repo / path, linked)
    before = linked.read_text()
    report = port_onto(repo, pristine)
    assert path in report.written and (repo / path).read_text() != before
    assert stat.S_IMODE((repo / path).stat().st_mode) == 0o755 and linked.read_text() == before
    assert not [p for p in (repo / path).parent.iterdir() if p.name.startswith(".")], "no temporary file left"


def test_write_text_refuses_a_symlink_that_appeared_after_the_check(tmp_path):
    victim = _outside(tmp_path)
    (tmp_path / "co").mkdir()
    os.symlink(victim, tmp_path / "co" / "f.py")
    with pytest.raises(CheckoutPathError, match="f.py is a symbolic link"):
        write_text(tmp_path / "co", "f.py", "ours\n")
    assert victim.read_text() == PRECIOUS


def test_a_checkout_that_is_a_file_or_missing_is_refused_plainly(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a checkout\n")
    for where in (afile, tmp_path / "missing"):
        assert cli.main(["port", str(where), "--dry-run", "--report", str(tmp_path / "r.txt")]) == 2
        assert f"{where} holds no {PACKAGE}/__init__.py; point UPSTREAM_SRC at" in capsys.readouterr().err
    assert afile.read_text() == "not a checkout\n"


def test_a_git_ignored_file_at_the_path_of_ours_is_refused_and_kept(tmp_path, pristine):
    """git status hides ignored files: one at our path was taken for upstream's own module."""
    repo = _repo(tmp_path, pristine, lambda r: (r / ".gitignore").write_text("cpp_config.py\n"))
    (repo / PACKAGE / OURS).write_text("# a local, ignored file\n")
    with pytest.raises(PortError) as error:
        port_onto(repo, pristine)
    message = str(error.value)
    assert f"uncommitted changes in files the port writes:\n!! {PACKAGE}/{OURS}\n" in message
    assert "move an ignored (!!) file away" in message
    assert (repo / PACKAGE / OURS).read_text() == "# a local, ignored file\n"


# The report's path, checked before anything is written.


def test_a_report_path_that_cannot_be_written_is_refused_before_the_checkout_is_touched(tmp_path, pristine, capsys):
    """The port used to write the checkout, then fail on the report with a traceback: the report was lost and
    a rerun refused for the port's own changes."""
    repo = _repo(tmp_path, pristine)
    afile = tmp_path / "afile"
    afile.write_text("a file\n")
    bad = {tmp_path: "is a folder; give a file in it", afile / "r.txt": f"{afile} is a file where a folder is needed"}
    if Path("/proc/self").is_dir():  # no file can be made there, whoever runs the test
        bad[Path("/proc/port-report.txt")] = "no file can be made in /proc"
    _refused_reports(repo, bad, capsys, set())
    assert afile.read_text() == "a file\n"
    report = tmp_path / "new" / "folder" / "r.txt"  # folders still to make are fine
    assert cli.main(["port", str(repo), "--dry-run", "--report", str(report)]) == 0, capsys.readouterr().err
    assert report.read_text().startswith("Port of the patch set to")


def _refused_reports(repo, bad: dict, capsys, changed: set) -> None:
    """Each --report path refused (exit 2, naming it and why), with and without --dry-run, nothing ported."""
    for where, why in bad.items():
        for dry_run in ([], ["--dry-run"]):
            assert cli.main(["port", str(repo), *dry_run, "--report", str(where)]) == 2
            captured = capsys.readouterr()
            assert f"error: --report {where}: {why}" in captured.err and "nothing was ported" in captured.err
            assert "Traceback" not in captured.err and captured.out == ""
            assert status(repo) == changed, "nothing written to the checkout"


def test_a_report_path_in_the_checkout_or_over_a_file_not_a_report_is_refused_and_the_file_kept(
    tmp_path, pristine, capsys
):
    """The report used to replace any file: one the port had just patched, or uncommitted work in the checkout
    (even with --dry-run, which writes nothing there), or a file of the user's elsewhere."""
    repo = _repo(tmp_path, pristine)
    patched = repo / load_patches()[0].files[0]
    notes = repo / "NOTES.md"
    notes.write_text("uncommitted work\n")
    mine = tmp_path / "mine.txt"
    mine.write_text("a file of the user's\n")
    link = tmp_path / "link.txt"
    link.symlink_to(patched)
    kept = {path: path.read_bytes() for path in (patched, notes, mine)}
    inside = "is inside the checkout being ported"
    bad = {patched: inside, notes: inside, link: inside, mine: "is a file that is not a port report"}
    _refused_reports(repo, bad, capsys, {"NOTES.md"})
    assert {path: path.read_bytes() for path in kept} == kept
    empty, earlier = tmp_path / "empty.txt", tmp_path / "earlier.txt"
    empty.touch()  # as mktemp makes it: nothing to lose
    earlier.write_text("Port of the patch set to an earlier checkout\n")
    for report in (empty, earlier):
        assert cli.main(["port", str(repo), "--dry-run", "--report", str(report)]) == 0, capsys.readouterr().err
        assert report.read_text().startswith(f"Port of the patch set to {repo}")


def test_the_default_report_folder_is_checked_and_a_late_write_failure_is_an_error_not_a_traceback(
    tmp_path, pristine, monkeypatch
):
    afile = tmp_path / "afile"
    afile.write_text("a file\n")
    monkeypatch.setattr(port_module, "REPORT_DIR", afile / "port")
    with pytest.raises(PortError, match=f"the report folder {afile}/port: {afile} is a file where a folder is needed"):
        port_module.check_report_path(None)
    report = port_onto(_repo(tmp_path, pristine), pristine, dry_run=True)
    with pytest.raises(PortError, match=f"could not be written to {afile}/r.txt .*nothing was written to the checkout"):
        port_module.write_report(report, afile / "r.txt")


def test_files_the_port_reads_that_are_not_utf8_are_named_with_the_fix_before_anything_is_written(
    tmp_path, pristine, capsys
):
    """A decode error used to name no file: 'utf-8' codec can't decode byte 0xe9 ..."""
    patched = load_patches()[0].files[0]
    replaced = next(e for e in load_overlay() if e.replaces).repo_path

    def latin1(repo: Path) -> None:
        for path in (patched, replaced):
            (repo / path).write_bytes((repo / path).read_bytes() + b"# caf\xe9\n")

    repo = _repo(tmp_path, pristine, latin1)
    lines = {path: (repo / path).read_bytes().count(b"\n") for path in (patched, replaced)}
    for dry_run in (False, True):
        with pytest.raises(PortError) as error:
            port_onto(repo, pristine, dry_run=dry_run)
        message = str(error.value)
        for path, line in lines.items():
            assert f"\n  {path}: byte 0xe9 on line {line} (invalid continuation byte)" in message, message
        assert "convert each to UTF-8 in a commit" in message and "nothing was written" in message
    assert cli.main(["port", str(repo), "--report", str(tmp_path / "r.txt")]) == 2
    assert f"{patched}: byte 0xe9" in capsys.readouterr().err
    assert status(repo) == set()
