"""The paths the port writes: our files where upstream has its own.

A file upstream added at the path of one of our new files is a conflict: the port keeps
upstream's, says so and says what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from git_repo import git
from scripted_upstream import pristine_package, status, upstream_repo
from vllm_ascend_patchset import cli
from vllm_ascend_patchset.contracts import ASCEND_CONFIG, ATTENTION_V1
from vllm_ascend_patchset.port import port
from vllm_ascend_patchset.series import OVERLAY_DIR, PACKAGE, load_overlay, load_patches

OURS = "core/cpp_config.py"  # a new file of ours that our patches import


@pytest.fixture(scope="module")
def pristine() -> Path:
    return pristine_package()


def _repo(tmp_path: Path, pristine: Path, change: Callable[[Path], None] | None = None) -> Path:
    """The pinned files the series and the contracts read; ``change`` (new entries staged) is committed."""
    wanted = {f for p in load_patches() for f in p.files}
    wanted |= {e.repo_path for e in load_overlay() if e.replaces}
    wanted |= {f"{PACKAGE}/{ATTENTION_V1}", f"{PACKAGE}/{ASCEND_CONFIG}"}

    def committed(repo: Path) -> None:
        assert change is not None
        change(repo)
        git(repo, "add", "-A")

    return upstream_repo(tmp_path / "upstream", pristine, wanted, committed if change else None)


def _port(repo: Path, pristine: Path, **kwargs):
    return port(
        repo, patches=load_patches(), overlay=load_overlay(), pristine_pkg=pristine, pin_name="v0.23.0", **kwargs
    )


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
    report = _port(repo, pristine)
    mine = next(o for o in report.overlay if o.relpath == OURS)
    assert "already there" in mine.status and report.ok, report.render()
    assert f"{PACKAGE}/{OURS}" not in report.written and f"{PACKAGE}/{OURS}" not in status(repo)


def test_exit_status_1_exactly_when_the_report_lists_something_to_resolve(tmp_path, pristine):
    """A replaced file upstream changed is reviewed (its diff is in the report), not resolved: exit 0."""
    replaced = next(e for e in load_overlay() if e.replaces)

    def change(repo: Path) -> None:
        path = repo / replaced.repo_path
        path.write_text(path.read_text() + "# upstream changed this file\n")

    report = _port(_repo(tmp_path, pristine, change), pristine, dry_run=True)
    text = report.render()
    assert report.ok and _to_resolve(text) == "\n  nothing", text
    review = text.split("\nTo review")[1]
    assert f"absorb upstream's change since the pin into vllm_ascend_overlay/{replaced.relpath}" in review
