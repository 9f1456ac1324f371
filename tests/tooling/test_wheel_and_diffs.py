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
from vllm_ascend_patchset.diffs import left_out, series_by_feature, series_needs, write_diffs
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


def _replay(assembly, tmp_path: Path, monkeypatch, folders: list[Path], name: str) -> dict:
    """The report of ``replay_series`` over ``folders`` (git am, commit by commit) on a pristine repo."""
    files = {
        p.relative_to(assembly.pristine).as_posix(): p.read_bytes()
        for p in (assembly.pristine / "vllm_ascend").rglob("*.py")
    }
    repo = init_repo(tmp_path / f"repo-{name}", files, "pristine v0.23.0")
    # One child process replays the series commit by commit (git am) and imports at each commit.
    # Forked from this one, it inherits vLLM as other tests imported it (no second import) and
    # leaves this process's modules alone.
    result = tmp_path / f"replay-{name}.json"
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
    return {"repo": repo, **json.loads(result.read_text())}


def _order(upstream: Path) -> tuple[list[str], dict[str, set[str]]]:
    """ORDER's features in order, and what each needs of the earlier ones."""
    text = (upstream / "ORDER").read_text()
    order = text.split("\n\n")[0].splitlines()[1:]
    needs = {line.split(" needs ")[0]: line.split(" needs ")[1] for line in text.splitlines() if " needs " in line}
    return order, {f: {g for g in order if needs.get(f, "").startswith(g) or f" and {g} (" in needs.get(f, "")}
                   for f in order}  # fmt: skip


def test_a_series_works_on_the_series_order_says_it_needs_alone(assembly, tmp_path, monkeypatch):
    """Dual stream goes upstream without CPP: its series, on what ORDER names (the build's), applies
    with git am and imports at every commit, and leaves its files as the assembly has them."""
    written = write_diffs(assembly, tmp_path / "upstream")
    order, needs = _order(tmp_path / "upstream")
    assert needs["dual-stream"] == {"build"} and needs["hooks"] == {"build"} and needs["cpp"] == {"build", "hooks"}
    for feature in order:
        alone = [f for f in order if f in needs[feature] or f == feature]
        if alone == order[: order.index(feature) + 1]:
            continue  # every earlier series: the full replay's
        report = _replay(assembly, tmp_path, monkeypatch, [tmp_path / "upstream" / f for f in alone], feature)
        environment = set(report["final_problems"])
        assert not [p for p in environment if p.endswith("no such name")], (feature, sorted(environment)[:5])
        for commit in report["commits"]:
            assert set(commit["problems"]) <= environment, (
                commit["subject"],
                sorted(set(commit["problems"]) - environment),
            )
        touched = {f for commit in report["commits"] for f in commit["files"]}

        def files(feature_name: str) -> set[str]:
            return {f for p in written[feature_name] for f in re.findall(r"^\+\+\+ b/(\S+)", p.read_text(), re.M)}

        mine = files(feature)
        assert mine and mine <= touched
        # Its own files as the assembly has them (a file another series changes too is upstream's plus its hunks).
        for rel in sorted(mine - set().union(*(files(f) for f in order if f not in alone))):
            assert (report["repo"] / rel).read_bytes() == (assembly.root / rel).read_bytes(), rel


def test_every_commit_of_every_series_works_and_the_last_is_the_assembly(assembly, tmp_path, monkeypatch):
    written = write_diffs(assembly, tmp_path / "upstream")
    order = (tmp_path / "upstream" / "ORDER").read_text().split("\n\n")[0].splitlines()[1:]
    assert order == list(written) and written, "every feature's series, in the order ORDER names"
    report = _replay(assembly, tmp_path, monkeypatch, [tmp_path / "upstream" / f for f in order], "all")
    repo = report["repo"]
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


def _grouping_assembly(tmp_path: Path, overlay: dict[str, tuple[str, str, str]], upstream=UPSTREAM, patches=None):
    wheel = write_wheel(tmp_path / "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl", upstream)
    patch_texts = patches if patches is not None else {"0300-register-a.patch": REGISTER_A}
    patches, overlay_dir = tmp_path / "patches", tmp_path / "overlay"
    patches.mkdir()
    for name, text in patch_texts.items():
        (patches / name).write_text(text)
    (patches / "series").write_text("".join(f"{name}\n" for name in patch_texts))
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
    # ORDER says what a series needs of an earlier one (dual stream's cache keys are the deployment's
    # fingerprint, a build module, not CPP's).
    needs = {line.split(" needs ")[0]: line for line in (tmp_path / "upstream" / "ORDER").read_text().splitlines()}
    assert "-deployment.patch" in needs["dual-stream"] and "cpp" not in needs["dual-stream"].split(" needs ")[1]
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


def test_an_interrupted_diffs_run_leaves_the_last_series_whole(assembly, tmp_path, monkeypatch):
    """The series is written beside the last one and shown in one rename: stopped half-way (Ctrl-C while the
    mails are written), the last complete series is still there, and no scratch folder stays once rerun."""
    from vllm_ascend_patchset import diffs

    out = tmp_path / "upstream"
    first = write_diffs(assembly, out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    calls = []

    def interrupted(mail, n, total):
        calls.append(n)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return diffs.render(mail, n, total)

    monkeypatch.setattr(diffs, "render", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_diffs(assembly, out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == before
    assert first and (out / "ORDER").is_file()
    monkeypatch.undo()
    live = tmp_path / f".upstream-main.tmp-{os.getpid()}-abcd"  # another series' run, still going
    live.mkdir()
    before_mask = os.umask(0o022)
    try:
        write_diffs(assembly, out)
    finally:
        os.umask(before_mask)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["upstream", live.name])
    assert out.is_dir() and not out.is_symlink()  # copied or archived as it is
    assert out.stat().st_mode & 0o777 == 0o755 and (out / "ORDER").stat().st_mode & 0o777 == 0o644


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


# (The blank context lines are a space each.)
CPP_CONFIG = "\n".join(
    [
        "Description: Read the CPP section of the configuration",
        "Feature: cpp",
        "Forwarded: no",
        "",
        "--- a/vllm_ascend/config.py",
        "+++ b/vllm_ascend/config.py",
        "@@ -1,6 +1,7 @@",
        " class Config:",
        "     def __init__(self):",
        "         self.x = 1",
        "+        self.cpp = 2",
        " ",
        " ",
        " def get():",
        "",
    ]
)


def test_another_features_patch_is_needed_only_for_the_names_it_adds_or_redefines(tmp_path, private_cache):
    """Dual stream reads the configuration through a function CPP's patch leaves alone: no need of CPP.
    A module that imports the class the patch changes needs it."""
    upstream = {
        **UPSTREAM,
        "vllm_ascend/config.py": b"class Config:\n    def __init__(self):\n        self.x = 1\n\n\n"
        b"def get():\n    return 1\n",
    }
    patches = {"0200-cpp-config.patch": CPP_CONFIG, "0300-register-a.patch": REGISTER_A}
    reader = {"dual_stream/c.py": ("dual-stream", "new", "from vllm_ascend.config import get\n\nC = get()\n")}
    earlier = series_needs(_grouping_assembly(tmp_path / "a", {**OVERLAY, **reader}, upstream, patches))
    assert "cpp" not in earlier.get("dual-stream", {})
    subclass = {"dual_stream/c.py": ("dual-stream", "new", "from vllm_ascend.config import Config\n\nC = Config\n")}
    earlier = series_needs(_grouping_assembly(tmp_path / "b", {**OVERLAY, **subclass}, upstream, patches))
    assert earlier["dual-stream"]["cpp"]


def test_a_change_needing_a_later_features_change_is_refused(tmp_path, private_cache):
    overlay = {**OVERLAY, "core/cpp_model.py": ("cpp", "new", "from vllm_ascend.dual_stream.b import B\n")}
    with pytest.raises(SeriesError, match=r"core/cpp_model.py \(cpp\) needs dual_stream/b.py \(dual-stream\), whose"):
        series_by_feature(_grouping_assembly(tmp_path, overlay))
