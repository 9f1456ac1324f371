"""The wheel is valid, installs, is reproducible and never reaches dist/ unverified; every commit of
the upstream diff series applies with git am and imports, and the last one is the assembled tree."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import zipfile
from pathlib import Path

import pytest
from git_repo import GIT_IDENTITY, git, init_repo
from tooling.replay_series import replay
from tooling.tiny_wheel import write_wheel
from vllm_ascend_patchset import wheel as wheel_mod
from vllm_ascend_patchset.assemble import assemble
from vllm_ascend_patchset.diffs import left_out, series_by_feature, write_diffs
from vllm_ascend_patchset.imports import imported_modules, module_of
from vllm_ascend_patchset.pin import Pin
from vllm_ascend_patchset.series import SeriesError
from vllm_ascend_patchset.wheel import WheelError, build_wheel
from vllm_ascend_patchset.wheel_target import WheelTarget


@pytest.fixture(scope="module")
def assembly(tmp_path_factory):
    return assemble(out_dir=tmp_path_factory.mktemp("assembled") / "t")


def test_assembled_tree_is_pristine_plus_series_plus_overlay(assembly):
    a = assembly
    for entry in a.overlay:
        assert (a.package / entry.relpath).read_bytes() == entry.source.read_bytes()
    touched = {f for p in a.patches for f in p.files} | {e.repo_path for e in a.overlay}
    # everything the series does not touch is byte-identical to upstream
    for path in (a.pristine / "vllm_ascend").rglob("*.py"):
        rel = path.relative_to(a.pristine).as_posix()
        if rel not in touched:
            assert (a.root / rel).read_bytes() == path.read_bytes(), rel


def test_wheel_is_verified_installable_and_faithful(assembly, tmp_path):
    pin = Pin.load()
    first = build_wheel(WheelTarget.host(), pin=pin, out_dir=tmp_path / "a", assembly=assembly)
    host = WheelTarget.host()
    tags = f"{host.py}-{host.py}-manylinux_2_34_{host.arch}"
    assert first.path.name == f"vllm_ascend-{pin.version}+{pin.local_version}-{tags}.whl"
    with zipfile.ZipFile(first.path) as z, zipfile.ZipFile(assembly.wheel) as up:
        meta = z.read(f"vllm_ascend-{pin.version}+{pin.local_version}.dist-info/METADATA").decode()
        assert f"\nVersion: {pin.version}+{pin.local_version}\n" in meta
        for name in up.namelist():
            if name.endswith(".so"):
                assert z.read(name) == up.read(name), f"{name} must be upstream's, unchanged"
        for path in assembly.package.rglob("*.py"):
            rel = path.relative_to(assembly.root).as_posix()
            assert z.read(rel) == path.read_bytes(), rel
        ep = z.read(f"vllm_ascend-{pin.version}+{pin.local_version}.dist-info/entry_points.txt").decode()
        assert "vllm_ascend:register" in ep


@pytest.fixture
def tiny_assembly(tmp_path, tiny_wheel, private_cache):
    """The tiny wheel assembled with an empty series: enough for build_wheel's own steps."""
    patches, overlay = tmp_path / "patches", tmp_path / "overlay"
    patches.mkdir()
    overlay.mkdir()
    (patches / "series").write_text("")
    return assemble(wheel=tiny_wheel, out_dir=tmp_path / "t", patch_dir=patches, overlay_dir=overlay)


def test_wheel_is_reproducible(tiny_assembly, tmp_path):
    first = build_wheel(WheelTarget.host(), out_dir=tmp_path / "a", assembly=tiny_assembly, verify_install=False)
    second = build_wheel(WheelTarget.host(), out_dir=tmp_path / "b", assembly=tiny_assembly, verify_install=False)
    assert first.sha256 == second.sha256 and first.path.read_bytes() == second.path.read_bytes()


def test_a_wheel_that_fails_verification_never_reaches_dist(tiny_assembly, tmp_path, monkeypatch, dead_pid):
    dist = tmp_path / "dist"
    good = build_wheel(WheelTarget.host(), out_dir=dist, assembly=tiny_assembly, verify_install=False)
    before = good.path.read_bytes()
    (dist / f".wheel-{dead_pid}-abcd1234").mkdir()  # left by a killed build
    (tiny_assembly.package / "platform.py").write_text("broken = True\n")

    def refuse(path, target, install):
        raise WheelError(f"{path.name}: refused")

    monkeypatch.setattr(wheel_mod, "verify_wheel", refuse)
    with pytest.raises(WheelError, match="refused"):
        build_wheel(WheelTarget.host(), out_dir=dist, assembly=tiny_assembly)
    assert good.path.read_bytes() == before, "the last verified wheel stays"
    assert os.listdir(dist) == [good.path.name], "no unverified wheel, no scratch left over"


def test_an_interrupted_wheel_write_leaves_nothing(tiny_assembly, tmp_path, monkeypatch):
    real_entry, written = wheel_mod._entry, []

    def entry(name, mode):
        written.append(name)
        if len(written) == 3:
            raise KeyboardInterrupt  # SIGINT while the zip is written
        return real_entry(name, mode)

    monkeypatch.setattr(wheel_mod, "_entry", entry)
    with pytest.raises(KeyboardInterrupt):
        build_wheel(WheelTarget.host(), out_dir=tmp_path / "dist", assembly=tiny_assembly)
    assert os.listdir(tmp_path / "dist") == []


REPLAY_TIMEOUT_S = 600


def _replacements_before_their_importers(commits: list[dict], assembly) -> list[str]:
    """A module replaced by an overlay file lands no earlier than the change to every upstream file of
    the series that imports it (upstream's code there was written against upstream's module)."""
    replaced = {e.repo_path for e in assembly.overlay if e.replaces}
    found = []
    for k, commit in enumerate(commits):
        for path in sorted(set(commit["files"]) & replaced):
            for later in commits[k + 1 :]:
                for importer in later["files"]:
                    upstream = assembly.pristine / importer
                    if upstream.is_file() and module_of(path) in imported_modules(upstream.read_text(), importer):
                        found.append(
                            f"{commit['subject']!r} replaces {path}, imported by upstream {importer}, "
                            f"which changes only later in {later['subject']!r}"
                        )
    return found


def test_every_commit_of_every_series_works_and_the_last_is_the_assembly(assembly, tmp_path, monkeypatch):
    written = write_diffs(assembly, tmp_path / "upstream")
    order = (tmp_path / "upstream" / "ORDER").read_text().split("\n\n")[0].splitlines()[1:]
    assert order == list(written) and written, "every feature's series, in the order ORDER names"
    files = {
        p.relative_to(assembly.pristine).as_posix(): p.read_bytes()
        for p in (assembly.pristine / "vllm_ascend").rglob("*.py")
    }
    repo = init_repo(tmp_path / "repo", files, "pristine v0.23.0")
    # One child process replays every series commit by commit (git am) and imports at each commit.
    # Forked from this one, it inherits vLLM as other tests imported it (no second import) and
    # leaves this process's modules alone.
    result = tmp_path / "replay.json"
    folders = [tmp_path / "upstream" / feature for feature in order]
    for key, value in GIT_IDENTITY.items():
        monkeypatch.setenv(key, value)
    child = multiprocessing.get_context("fork").Process(target=replay, args=(repo, result, folders, assembly.pristine))
    child.start()
    child.join(REPLAY_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"replaying the series took over {REPLAY_TIMEOUT_S} s")
    assert child.exitcode == 0, "the replay failed; its traceback is in the captured stderr"
    report = json.loads(result.read_text())
    commits = report["commits"]
    assert len(commits) == sum(len(paths) for paths in written.values())
    environment = set(report["final_problems"])  # NPU-only modules that cannot import on a CPU at all
    assert not [p for p in environment if p.endswith("no such name")], "the final tree's imports all resolve"
    for commit in commits:
        assert set(commit["problems"]) <= environment, (
            commit["subject"],
            sorted(set(commit["problems"]) - environment),
        )
    assert _replacements_before_their_importers(commits, assembly) == []
    touched = {f for commit in commits for f in commit["files"]}
    own = left_out(assembly)  # the patch set's own: the build patch that logs it, and patchset.py
    assert own == {"vllm_ascend/__init__.py", "vllm_ascend/patchset.py"}
    expected = {f for p in assembly.patches for f in p.files} | {e.repo_path for e in assembly.overlay}
    assert touched == expected - own
    for rel in sorted(touched):
        assert (repo / rel).read_bytes() == (assembly.root / rel).read_bytes(), rel
    for rel in own:  # as upstream has them
        assert not (repo / rel).exists() or (repo / rel).read_bytes() == (assembly.pristine / rel).read_bytes(), rel
    log = git(repo, "log", "--format=%s")
    assert "[PATCH" not in log and "build: Add vllm_ascend/config_table.py" in log
    assert "Log the patch set" not in log


UPSTREAM = {
    "vllm_ascend/__init__.py": b"",
    "vllm_ascend/core/__init__.py": b"",
    "vllm_ascend/core/predictor.py": b"class Manager:\n    def predict(self):\n        return 1\n",
    "vllm_ascend/core/scheduler.py": b"from vllm_ascend.core.predictor import Manager\n\nMANAGER = Manager()\n",
    "vllm_ascend/platform.py": b"SCHEDULER = 'vllm_ascend.core.scheduler.Scheduler'\n",
}
OVERLAY = {  # path: (feature, mode, text); the manifest lists them in this (unhelpful) order
    "core/cpp_model.py": (
        "cpp",
        "new",
        "def fit():\n    from vllm_ascend.core.predictor import Manager\n\n    return Manager\n",
    ),
    "core/predictor.py": ("cpp", "replaces", "class Manager:\n    def plan(self):\n        return 2\n"),
    "core/scheduler.py": ("cpp", "replaces", "from vllm_ascend.core.cpp_model import fit\n\nScheduler = fit()\n"),
    "dual_stream/a.py": ("dual-stream", "new", "from .b import B\n\nA = B\n"),
    "dual_stream/b.py": ("dual-stream", "new", "B = 1\n"),
}
REGISTER_A = """Description: Register the dual-stream module by name
Feature: dual-stream
Forwarded: no

--- a/vllm_ascend/platform.py
+++ b/vllm_ascend/platform.py
@@ -1 +1,2 @@
 SCHEDULER = 'vllm_ascend.core.scheduler.Scheduler'
+DUAL = 'vllm_ascend.dual_stream.a:A'
"""


def _grouping_assembly(tmp_path: Path, overlay: dict[str, tuple[str, str, str]]):
    wheel = write_wheel(tmp_path / "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl", UPSTREAM)
    patches, overlay_dir = tmp_path / "patches", tmp_path / "overlay"
    patches.mkdir()
    (patches / "0300-register-a.patch").write_text(REGISTER_A)
    (patches / "series").write_text("0300-register-a.patch\n")
    (patches / "overlay.manifest").write_text("".join(f"{p} {f} {m}\n" for p, (f, m, _) in overlay.items()))
    for path, (_, _, text) in overlay.items():
        (overlay_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (overlay_dir / path).write_text(text)
    return assemble(wheel=wheel, out_dir=tmp_path / "t", patch_dir=patches, overlay_dir=overlay_dir)


def test_every_mail_says_its_piece_whole_and_signs_for_no_one(assembly, tmp_path):
    """A body never stops at a colon (the list it announces goes with it), and no mail carries a
    Signed-off-by: only the person who submits can certify the DCO (git am --signoff)."""
    cut = [
        f"{feature}: {mail.subject}"
        for feature, mails in series_by_feature(assembly).items()
        for mail in mails
        if mail.body.rstrip().endswith(":")
    ]
    assert not cut, f"bodies that end mid-thought: {cut}"
    # A commit that rewrites an upstream module says so in its subject, also when a patch comes with it.
    scheduler = [m for m in series_by_feature(assembly)["cpp"] if "/core/scheduler_profiling_chunk.py" in m.diff]
    replaced = "Replace scheduler_profiling_chunk and patch_profiling_chunk"
    assert [m.subject.split(";")[0] for m in scheduler] == [replaced]
    written = write_diffs(assembly, tmp_path / "upstream")
    texts = [path.read_text() for paths in written.values() for path in paths]
    assert texts and not [t for t in texts if "Signed-off-by:" in t.split("\n---\n", 1)[0]]
    bodies = [t.split("\n\n", 1)[1].split("\n---\n", 1)[0] for t in texts]
    long = [line for body in bodies for line in body.splitlines() if len(line) > 72 and not line.startswith(" ")]
    assert not long, f"body lines over 72 characters (a formula or code, indented, may be): {long[:3]}"
    # ORDER says what a series needs of an earlier one (dual stream's cache keys are CPP's fingerprint).
    needs = {line.split(" needs ")[0]: line for line in (tmp_path / "upstream" / "ORDER").read_text().splitlines()}
    assert "-core-cpp_profile_store.patch" in needs["dual-stream"] and "hooks" not in needs["dual-stream"]
    # Named by the mails' files; ``from vllm_ascend import patchset`` needs patchset.py, not the build
    # patch that changes vllm_ascend/__init__.py.
    mails = {p.name for paths in written.values() for p in paths}
    named = set(re.findall(r"\d{4}-[\w.-]+\.patch", "".join(needs.values())))
    assert named and named <= mails and "log-patchset-at-registration" not in needs["cpp"]
    # The submitter may author the mails (make diffs AUTHOR=...); a malformed one is refused.
    authored = write_diffs(assembly, tmp_path / "authored", author="Ada Lovelace <ada@example.com>")
    froms = {line for paths in authored.values() for p in paths for line in p.read_text().splitlines()[1:2]}
    assert froms == {"From: Ada Lovelace <ada@example.com>"}
    with pytest.raises(SeriesError, match="AUTHOR='ada'"):
        write_diffs(assembly, tmp_path / "bad", author="ada")


def test_series_order_follows_imports_and_lands_mutual_needs_together(tmp_path, private_cache):
    series = series_by_feature(_grouping_assembly(tmp_path, OVERLAY))
    # The replaced predictor breaks upstream's scheduler (predict() is gone), the new scheduler
    # needs the new cpp_model, which needs the new predictor: one commit.
    assert [m.subject for m in series["cpp"]] == ["Replace predictor and scheduler; add cpp_model"]
    # b before a (a imports it), the registration by name after a.
    assert [m.subject for m in series["dual-stream"]] == [
        "Add vllm_ascend/dual_stream/b.py",
        "Add vllm_ascend/dual_stream/a.py",
        "Register the dual-stream module by name",
    ]


def test_a_change_needing_a_later_features_change_is_refused(tmp_path, private_cache):
    overlay = {**OVERLAY, "core/cpp_model.py": ("cpp", "new", "from vllm_ascend.dual_stream.b import B\n")}
    with pytest.raises(SeriesError, match=r"core/cpp_model.py \(cpp\) needs dual_stream/b.py \(dual-stream\), whose"):
        series_by_feature(_grouping_assembly(tmp_path, overlay))
