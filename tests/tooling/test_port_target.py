"""A target series (patches/targets/<name>): ported versions of pinned patches, kept up to date.

A synthetic pinned series (one patch, two hunks on vllm_ascend/__init__.py) in its own git
repository stands in for patches/, so these tests do not depend on the real patches;
upstream changes the line one hunk replaces, and the target holds the version of the
patch made for that upstream.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from git_repo import git
from scripted_upstream import edit, status, upstream_repo
from vllm_ascend_patchset import port as port_mod
from vllm_ascend_patchset.contracts import ASCEND_CONFIG, ATTENTION_V1, ContractResult
from vllm_ascend_patchset.hunks import git_diff
from vllm_ascend_patchset.paths import OVERLAY_DIR, PATCH_DIR
from vllm_ascend_patchset.port import PortError, answered_contracts, check_descends, port, write_report
from vllm_ascend_patchset.port_report import ALREADY, APPLIES, CONFLICT, REFRESHED
from vllm_ascend_patchset.porter import Porter
from vllm_ascend_patchset.series import SeriesError, load_overlay, load_patches
from vllm_ascend_patchset.target_diffs import TargetDiffsError, write_target_diffs
from vllm_ascend_patchset.targets import git_blob, load_target, with_header

INIT = "vllm_ascend/__init__.py"
PINNED_RETURN = '    return "vllm_ascend.platform.NPUPlatform"\n'
UPSTREAM_RETURN = '    return "vllm_ascend.platform.AscendPlatform"\n'
LOADERS = "    register_rforkloader()\n"
HEADER = {"Description": "Mark the platform and the loaders", "Feature": "build", "Forwarded": "no"}
NAME = "0001-synthetic.patch"


def _marked(text: str, loaders_note: str = "    # patch set: loaders registered\n", ret: str = PINNED_RETURN) -> str:
    return text.replace(LOADERS, LOADERS + loaders_note).replace(ret, ret.rstrip("\n") + "  # patch set\n")


def _patch_text(before: str, after: str, path: str = INIT, **header: str) -> str:
    return with_header({**HEADER, **header}, git_diff(before.splitlines(True), after.splitlines(True), path, False))


class World:
    """Scripted upstream, synthetic pinned series with a target 't', and the target's own files."""

    def __init__(self, tmp_path: Path, pristine: Path) -> None:
        self.pristine = pristine
        self.pinned_text = (pristine.parent / INIT).read_text()
        files = [INIT, f"vllm_ascend/{ATTENTION_V1}", f"vllm_ascend/{ASCEND_CONFIG}"]
        files += [e.repo_path for e in load_overlay() if e.replaces]
        self.upstream = upstream_repo(
            tmp_path / "upstream", pristine, files, lambda r: edit(r, INIT, PINNED_RETURN, UPSTREAM_RETURN)
        )
        self.upstream_text = (self.upstream / INIT).read_text()
        self.patches = tmp_path / "repo" / "patches"
        self.patches.mkdir(parents=True)
        shutil.copyfile(PATCH_DIR / "overlay.manifest", self.patches / "overlay.manifest")
        (self.patches / "series").write_text(NAME + "\n")
        (self.patches / NAME).write_text(_patch_text(self.pinned_text, _marked(self.pinned_text)))
        self.folder = self.patches / "targets" / "t"
        self.folder.mkdir(parents=True)
        commit = git(self.upstream, "rev-parse", "HEAD").strip()
        meta = {"repository": "scripted", "ref": "main", "commit": commit}
        (self.folder / "target.json").write_text(json.dumps(meta))
        (self.folder / "series").write_text(NAME + "\n")
        ported = _marked(self.upstream_text, ret=UPSTREAM_RETURN)
        ported_from = f"{NAME} {git_blob(self.patches / NAME)}"
        (self.folder / NAME).write_text(_patch_text(self.upstream_text, ported, **{"Ported-From": ported_from}))
        git(tmp_path / "repo", "init", "-q")  # its history holds the blobs the target records
        git(tmp_path / "repo", "add", "-A")
        git(tmp_path / "repo", "commit", "-qm", "series and target")

    def port(self, overlay_dir: Path = OVERLAY_DIR, **kwargs):
        """Port the synthetic series; the overlay (entries and the contracts' reading of it) from ``overlay_dir``."""
        return port(
            self.upstream,
            patches=load_patches(self.patches),
            overlay=load_overlay(self.patches, overlay_dir),
            pristine_pkg=self.pristine,
            pin_name="v0.23.0",
            overlay_dir=overlay_dir,
            **kwargs,
        )

    def target(self):
        return load_target("t", self.patches)


@pytest.fixture
def world(tmp_path, pristine) -> World:
    return World(tmp_path, pristine)


def test_the_pinned_patch_conflicts_where_the_target_version_applies_and_its_mails_replay(world, tmp_path):
    base = world.port(dry_run=True)
    assert [h.status for h in base.hunks] == [CONFLICT, APPLIES]

    report = world.port(target=world.target())
    assert [h.status for h in report.hunks] == [APPLIES, APPLIES] and report.ok, report.render()
    assert (world.upstream / INIT).read_text() == _marked(world.upstream_text, ret=UPSTREAM_RETURN)
    git(world.upstream, "checkout", "-q", "--", ".")
    git(world.upstream, "clean", "-qfd")

    out = tmp_path / "dist"
    result = write_target_diffs(
        world.target(), world.upstream, pristine_pkg=world.pristine, pin_name="v0.23.0", out_dir=out
    )
    assert result.refreshed == [] and status(world.upstream) == set(), "the checkout is only read"
    mails = result.written["build"]
    text = "".join(m.read_text() for m in mails)
    last = f"Subject: [PATCH {len(mails)}/{len(mails)}] build: Mark the platform"  # after the build overlay files
    assert 'AscendPlatform"  # patch set' in text and last in mails[-1].read_text()
    assert (
        (out / "ORDER")
        .read_text()
        .startswith(f"Apply the series in this order on scripted main at {world.target().commit}")
    )


def test_the_report_of_a_target_series_does_not_overwrite_the_pinned_one_of_the_same_checkout(
    world, tmp_path, monkeypatch
):
    monkeypatch.setattr(port_mod, "REPORT_DIR", tmp_path / "reports")
    pinned = write_report(world.port(dry_run=True))
    targeted = write_report(world.port(target=world.target(), dry_run=True))
    assert pinned.parent == targeted.parent == tmp_path / "reports"
    assert pinned.name.endswith(".txt") and targeted.name == pinned.name.removesuffix(".txt") + "-target-t.txt"
    assert "series of target 't'" in targeted.read_text() and "series of target" not in pinned.read_text()


def test_the_target_series_must_name_or_replace_every_pinned_patch(world):
    (world.folder / "series").write_text("# nothing\n")
    with pytest.raises(SeriesError, match=rf"does not cover {NAME} of patches/series; add the name"):
        world.target()


def test_a_later_change_to_the_pinned_patch_merges_into_the_target_version_and_is_written_back(world, tmp_path):
    note = "    # patch set: loaders registered, second version\n"
    (world.patches / NAME).write_text(_patch_text(world.pinned_text, _marked(world.pinned_text, note)))

    report = world.port(target=world.target(), dry_run=True)
    assert [h.status for h in report.hunks] == [REFRESHED] and report.ok, report.render()

    result = write_target_diffs(
        world.target(), world.upstream, pristine_pkg=world.pristine, pin_name="v0.23.0", out_dir=tmp_path / "d"
    )
    assert result.refreshed == [world.folder / NAME]
    refreshed = (world.folder / NAME).read_text()
    assert f"Ported-From: {NAME} {git_blob(world.patches / NAME)}" in refreshed
    git(world.patches.parent, "commit", "-qam", "refreshed")
    again = world.port(target=world.target())
    assert {h.status for h in again.hunks} == {APPLIES}
    assert (world.upstream / INIT).read_text() == _marked(world.upstream_text, note, UPSTREAM_RETURN)


def test_a_pinned_change_to_the_lines_the_target_rewrote_is_a_conflict_and_nothing_is_written(world, tmp_path):
    changed = _marked(world.pinned_text).replace("  # patch set\n", "  # patch set, changed\n")
    (world.patches / NAME).write_text(_patch_text(world.pinned_text, changed))
    before = (world.folder / NAME).read_text()

    report = world.port(target=world.target(), dry_run=True)
    assert [h.status for h in report.hunks] == [CONFLICT] and "the patch changes" in report.hunks[0].detail
    with pytest.raises(TargetDiffsError, match="does not port cleanly"):
        write_target_diffs(
            world.target(), world.upstream, pristine_pkg=world.pristine, pin_name="v0.23.0", out_dir=tmp_path / "d"
        )
    assert (world.folder / NAME).read_text() == before and not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("where", "says"),
    [("missing", "not a directory"), ("plain", "not a git checkout"), ("inside", "a folder inside a checkout")],
)
def test_a_wrong_upstream_src_is_named_with_the_fix(world, tmp_path, where, says):
    """A mistyped UPSTREAM_SRC says what is wrong with it, not git's error and advice for another mistake."""
    (tmp_path / "plain").mkdir()
    src = {"missing": tmp_path / "missing", "plain": tmp_path / "plain", "inside": world.upstream / "vllm_ascend"}
    with pytest.raises(TargetDiffsError, match=says):
        write_target_diffs(
            world.target(), src[where], pristine_pkg=world.pristine, pin_name="v0.23.0", out_dir=tmp_path / "d"
        )
    assert not (tmp_path / "d").exists()


def test_a_checkout_that_does_not_build_on_the_targets_commit_is_refused_with_the_fix(world):
    """A release branch (or an older commit) given with TARGET would report every difference as a conflict."""
    git(world.upstream, "checkout", "-q", "HEAD~1")
    with pytest.raises(PortError, match="does not contain main at .* check out main"):
        check_descends(world.upstream, world.target())
    git(world.upstream, "checkout", "-q", "-")
    check_descends(world.upstream, world.target())  # the target's commit itself (or a later one) is fine


def _overlay_patch(world: World, tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A target patch on a copy of the overlay's patchset.py: (overlay copy, module, its text, the added line)."""
    overlay = tmp_path / "overlay"
    shutil.copytree(OVERLAY_DIR, overlay, ignore=shutil.ignore_patterns("__pycache__"))
    module = overlay / "patchset.py"
    original = module.read_text()
    target_line = "TARGET_NOTE = 'made for the target'\n"
    (world.folder / "0900-overlay.patch").write_text(
        _patch_text(
            original,
            original + target_line,
            "vllm_ascend/patchset.py",
            **{"Overlay-Base": f"patchset.py {git_blob(module)}"},
        )
    )
    with open(world.folder / "series", "a") as f:
        f.write("0900-overlay.patch\n")
    git(world.patches.parent, "add", "-A")
    git(world.patches.parent, "commit", "-qm", "overlay patch")
    shutil.copyfile(module, world.patches.parent / "patchset-as-ported.py")  # keep the blob in the history
    git(world.patches.parent, "add", "-A")
    git(world.patches.parent, "commit", "-qm", "keep the overlay file's version")
    return overlay, module, original, target_line


def test_an_overlay_patch_follows_a_later_change_to_its_overlay_file(world, tmp_path):
    overlay, module, original, target_line = _overlay_patch(world, tmp_path)
    first = world.port(target=world.target(), dry_run=True, overlay_dir=overlay)
    assert [h.status for h in first.hunks if h.patch == "0900-overlay.patch"] == [APPLIES]

    module.write_text("# changed after the target patch was made\n" + original)
    report = world.port(target=world.target(), overlay_dir=overlay)
    assert [h.status for h in report.hunks if h.patch == "0900-overlay.patch"] == [REFRESHED], report.render()
    written = (world.upstream / "vllm_ascend/patchset.py").read_text()
    assert written == "# changed after the target patch was made\n" + original + target_line
    assert report.refreshed[world.folder / "0900-overlay.patch"].count(f"patchset.py {git_blob(module)}") == 1


def test_an_overlay_patch_that_conflicts_with_a_later_change_is_reported_and_fails_the_config_contract(world, tmp_path):
    """The conflict markers make the overlay file unparseable: the report says so, the port does not crash."""
    overlay, module, original, _ = _overlay_patch(world, tmp_path)
    module.write_text(original + "OTHER_NOTE = 'added where the target patch adds its line'\n")
    report = world.port(target=world.target(), dry_run=True, overlay_dir=overlay)
    assert [h.status for h in report.hunks if h.patch == "0900-overlay.patch"] == [CONFLICT], report.render()
    failed = [c for c in report.contracts if not c.ok]
    assert [c.subject for c in failed] == ["config"], report.render()
    assert "overlay file patchset.py:" in failed[0].detail and "conflict markers" in failed[0].detail
    assert not report.ok and "contract failed: config" in report.render()


def test_an_answered_contract_is_ok_and_says_how_and_an_unused_answer_fails(world):
    target = world.target()
    object.__setattr__(target, "answers", {"key x": "read where upstream reads it", "key gone": "old"})
    results = answered_contracts(
        [ContractResult("key x", False, "it moved", "a.py:1"), ContractResult("y", True, "fine")], target
    )
    assert results[0].ok and "answered by target t: read where upstream reads it (check: it moved)" in results[0].detail
    assert results[1] == ContractResult("y", True, "fine")
    assert (
        results[2].subject == "key gone"
        and not results[2].ok
        and "drop it from answered_contracts" in results[2].detail
    )


SERVICE_DEF = (
    "def register_service_profiling():\n"
    "    _ensure_global_patch()\n\n"
    "    from .profiling_config import generate_service_profiling_config\n\n"
    "    generate_service_profiling_config()\n\n\n"
)


def test_a_pinned_deletion_the_target_version_already_makes_is_already_there(world):
    """Upstream changed the definition and the line after it: a plain merge of the deletion would conflict."""
    edit(
        world.upstream,
        INIT,
        "    generate_service_profiling_config()\n",
        "    generate_service_profiling_config(True)\n",
    )
    edit(
        world.upstream,
        INIT,
        "    from .models import register_model\n",
        "    from .models import register_model as models\n",
    )
    git(world.upstream, "commit", "-qam", "upstream changes the definition")
    upstream_text = (world.upstream / INIT).read_text()
    upstream_def = SERVICE_DEF.replace("config()\n", "config(True)\n")
    ported = _marked(upstream_text, ret=UPSTREAM_RETURN).replace(upstream_def, "")
    ported_from = f"{NAME} {git_blob(world.patches / NAME)}"
    (world.folder / NAME).write_text(_patch_text(upstream_text, ported, **{"Ported-From": ported_from}))
    git(world.patches.parent, "commit", "-qam", "the target version also drops the definition")
    (world.patches / NAME).write_text(
        _patch_text(world.pinned_text, _marked(world.pinned_text).replace(SERVICE_DEF, ""))
    )

    report = world.port(target=world.target())
    statuses = [h.status for h in report.hunks]
    assert ALREADY in statuses and CONFLICT not in statuses and report.ok, report.render()
    assert (world.upstream / INIT).read_text() == ported
    assert f"Ported-From: {NAME} {git_blob(world.patches / NAME)}" in report.refreshed[world.folder / NAME]


@pytest.mark.parametrize("name", sorted(p.name for p in (PATCH_DIR / "targets").iterdir() if p.is_dir()))
def test_every_committed_target_still_merges_with_the_overlay_and_the_pinned_patches(name):
    """The repo's own targets: their overlay patches merge into the overlay as it is now, and every
    version a target patch records is in the history, so ``make diffs TARGET=...`` can refresh them.

    An overlay change that the target's version also changes (a conflict) fails here, on any
    machine, rather than only when a maintainer next ports to that upstream."""
    target = load_target(name)
    for step in target.steps:
        if step.ported_from is not None:
            assert git(PATCH_DIR.parent, "cat-file", "-t", step.ported_from).strip() == "blob", step.patch.name
    porter = Porter(lambda path: None, PATCH_DIR, "pin")
    porter.overlay(load_overlay(), target.overlay_patches)
    assert target.overlay_patches and porter.hunks
    conflicts = [f"{h.patch} {h.path}: {h.detail}" for h in porter.hunks if h.status == CONFLICT]
    assert not conflicts, "refresh the target (patches/README.md):\n" + "\n".join(conflicts)
