"""The port merges the series into a scripted upstream repository and reports each hunk.

The repository holds the pinned files the series touches (and the ones the contracts
read), committed as they are at the pin; each test then commits an upstream change
and ports the current series onto it. The hunks the changes aim at are picked from the
series itself, so the tests keep working as the patches change.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import conftest
import pytest
from git_repo import git
from scripted_upstream import edit, port_inputs, port_onto, status, upstream_repo
from vllm_ascend_patchset import cli
from vllm_ascend_patchset.contracts import ASCEND_CONFIG, ATTENTION_V1, overlay_config_reads
from vllm_ascend_patchset.hunks import Hunk, parse_diff
from vllm_ascend_patchset.paths import OVERLAY_DIR, PACKAGE
from vllm_ascend_patchset.port import PortError
from vllm_ascend_patchset.port_report import APPLIES, CONFLICT, MERGED
from vllm_ascend_patchset.porter import DEFINITION_LINE
from vllm_ascend_patchset.series import load_patches

ASSEMBLED = conftest.ASSEMBLED


def _repo(tmp_path: Path, pristine: Path, change: Callable[[Path], None] | None = None) -> Path:
    """The pinned files the series and the contracts read, then ``change``."""
    return upstream_repo(tmp_path / "upstream", pristine, port_inputs(), change)


def _hunks():
    """(patch, path, 1-based number, hunk) for every hunk of the series."""
    for patch in load_patches():
        for fd in parse_diff(patch.diff, patch.name):
            for n, hunk in enumerate(fd.hunks, 1):
                yield patch, fd.path, n, hunk


def _unique(text: str, line: str) -> bool:
    return line.strip() != "" and text.count(line) == 1


@pytest.mark.full_tier("compares with the assembled tree")
def test_porting_onto_the_pin_itself_applies_every_hunk_and_reproduces_the_assembly(tmp_path, pristine):
    repo = _repo(tmp_path, pristine)
    report = port_onto(repo, pristine)
    assert report.hunks and {h.status for h in report.hunks} == {APPLIES}
    assert report.ok, report.render()
    assert not [o for o in report.overlay if o.needs_attention]
    for rel in report.written:
        assert (repo / rel).read_bytes() == (ASSEMBLED / rel).read_bytes(), rel


def _context_hunk(pristine: Path) -> tuple[str, str, int, Hunk]:
    """A hunk whose first line is unique context three lines or more before its first change."""
    for patch, path, n, hunk in _hunks():
        text = (pristine.parent / path).read_text()
        common = 0
        while common < min(len(hunk.old), len(hunk.new)) and hunk.old[common] == hunk.new[common]:
            common += 1
        if common >= 3 and _unique(text, hunk.old[0]):
            return patch.name, path, n, hunk
    pytest.skip("no hunk of the series has three lines of leading context")


@pytest.mark.full_tier("compares with the assembled tree")
def test_moved_and_changed_context_merges_cleanly(tmp_path, pristine):
    patch, path, number, hunk = _context_hunk(pristine)
    edited = hunk.old[0].rstrip("\n") + "  # upstream edited this context line\n"
    moved = "".join(f"# upstream added line {i}\n" for i in range(7))

    def change(repo: Path) -> None:
        edit(repo, path, hunk.old[0], edited)
        target = repo / path
        target.write_text(moved + target.read_text())

    repo = _repo(tmp_path, pristine, change)
    report = port_onto(repo, pristine)
    mine = next(h for h in report.hunks if (h.patch, h.path, h.number) == (patch, path, number))
    assert mine.status == MERGED, report.render()
    others = [h for h in report.hunks if h.path == path and h is not mine]
    assert all(h.status == APPLIES and "+7 lines from the pin" in h.detail for h in others if h.patch == patch)
    assert not report.conflicted_files and report.ok, report.render()
    expected = moved + (ASSEMBLED / path).read_text().replace(hunk.old[0], edited, 1)
    assert (repo / path).read_text() == expected
    assert f"{patch}: {MERGED}" in report.render()


def _removed_line_hunk(pristine: Path) -> tuple[str, str, int, str]:
    """A hunk and a line it removes or replaces that occurs once in the pinned file."""
    for patch, path, n, hunk in _hunks():
        text = (pristine.parent / path).read_text()
        for line in hunk.removed:
            if _unique(text, line):
                return patch.name, path, n, line
    pytest.skip("no hunk of the series removes a line")


def test_a_change_to_a_line_the_hunk_changes_is_a_conflict_named_by_patch_file_and_hunk(tmp_path, pristine, capsys):
    patch, path, number, line = _removed_line_hunk(pristine)
    upstream_line = line.rstrip("\n") + "  # upstream changed this line too\n"
    repo = _repo(tmp_path, pristine, lambda r: edit(r, path, line, upstream_line))
    head = git(repo, "rev-parse", "HEAD")

    report = port_onto(repo, pristine)
    mine = next(h for h in report.hunks if (h.patch, h.path, h.number) == (patch, path, number))
    assert mine.status == CONFLICT
    assert "upstream changed" in mine.detail and upstream_line.strip() in mine.detail
    assert [h for h in report.hunks if h.status == CONFLICT] == [mine], "only the hunk upstream collided with"
    assert not report.ok and report.conflicted_files == [path]
    text = report.render()
    assert (
        f"{patch} {path} hunk {number}" in text and f"{patch}: CONFLICT" in text and path in text.split("To resolve")[1]
    )

    merged = (repo / path).read_text()
    assert merged.count("<<<<<<< upstream") == 1 and f">>>>>>> {patch} {path} hunk {number}\n" in merged
    assert upstream_line in merged
    # only the files the port writes changed; git's HEAD and index are untouched
    assert status(repo) == set(report.written)
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "diff", "--cached", "--name-only") == ""
    for rel in set(git(repo, "ls-files").split()) - set(report.written):
        assert git(repo, "diff", "--name-only", "--", rel) == "", rel


def test_upstream_editing_a_definition_a_hunk_deletes_is_a_conflict(tmp_path, pristine):
    """A hunk that only deletes code (a class or function) whose text upstream changed: the deletion is the
    person's call, with upstream's change shown."""
    found = None
    for patch, path, n, hunk in _hunks():
        text = (pristine.parent / path).read_text()
        if not hunk.added and any(DEFINITION_LINE.match(line) for line in hunk.removed):
            body = [line for line in hunk.removed if not DEFINITION_LINE.match(line) and _unique(text, line)]
            if body:
                found = patch.name, path, n, body[0]
                break
    if found is None:
        pytest.skip("no hunk of the series only deletes a definition")
    patch, path, number, line = found
    upstream_line = line.rstrip("\n") + "  # upstream changed the deleted code\n"
    repo = _repo(tmp_path, pristine, lambda r: edit(r, path, line, upstream_line))
    report = port_onto(repo, pristine, dry_run=True)
    mine = next(h for h in report.hunks if (h.patch, h.path, h.number) == (patch, path, number))
    assert mine.status == CONFLICT and upstream_line.strip() in mine.detail, report.render()


def test_the_cli_prints_the_report_and_fails_on_a_conflict(tmp_path, pristine, capsys):
    patch, path, number, line = _removed_line_hunk(pristine)
    repo = _repo(tmp_path, pristine, lambda r: edit(r, path, line, "# upstream replaced this line\n"))
    report_file = tmp_path / "report.txt"
    code = cli.main(["port", str(repo), "--dry-run", "--report", str(report_file)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"{patch} {path} hunk {number}" in out and "Dry run: nothing was written" in out
    assert f"{patch} {path} hunk {number}" in report_file.read_text()
    assert status(repo) == set(), "a dry run writes nothing into the checkout"


def test_a_removed_ascend_metadata_field_fails_the_metadata_contract(tmp_path, pristine):
    source = (pristine / ATTENTION_V1).read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "AscendMetadata")
    field = [n for n in cls.body if isinstance(n, ast.AnnAssign)][-1]
    lines = source.splitlines(keepends=True)
    removed = "".join(lines[field.lineno - 1 : field.end_lineno])

    repo = _repo(tmp_path, pristine, lambda r: edit(r, f"{PACKAGE}/{ATTENTION_V1}", removed, ""))
    report = port_onto(repo, pristine, dry_run=True)
    failed = [c for c in report.contracts if not c.ok]
    assert len(failed) == 1 and "AscendMetadata" in failed[0].name
    assert field.target.id in failed[0].detail and "no longer exist" in failed[0].detail
    assert not report.ok and f"contract failed: {failed[0].name}" in report.render()


def test_a_config_flag_our_code_reads_that_upstream_renamed_fails_the_config_contract(tmp_path, pristine):
    config_source = (pristine / ASCEND_CONFIG).read_text()
    flag = next(r.path[0] for r in overlay_config_reads(OVERLAY_DIR) if f"self.{r.path[0]} = " in config_source)
    repo = _repo(
        tmp_path,
        pristine,
        lambda r: (r / PACKAGE / ASCEND_CONFIG).write_text(
            config_source.replace(f"self.{flag} ", f"self.{flag}_renamed ")
        ),
    )
    report = port_onto(repo, pristine, dry_run=True)
    failed = [c for c in report.contracts if not c.ok]
    assert failed and all(f"AscendConfig.{flag}" in c.name for c in failed), [c.name for c in failed]
    assert f"has no attribute {flag}" in failed[0].detail


def test_uncommitted_changes_in_a_file_the_port_writes_are_refused_and_kept(tmp_path, pristine):
    repo = _repo(tmp_path, pristine)
    path = next(iter(load_patches())).files[0]
    (repo / path).write_text((repo / path).read_text() + "# local work\n")
    with pytest.raises(PortError, match=rf"uncommitted changes in files the port writes:\n M {path}\ncommit or stash"):
        port_onto(repo, pristine)
    assert (repo / path).read_text().endswith("# local work\n")
    assert status(repo) == {path}
