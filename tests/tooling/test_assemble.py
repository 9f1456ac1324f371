"""Assembly applies the series with zero fuzz, refuses accidents, never leaves half a tree and never
builds from a pristine tree that differs from the pinned wheel."""

from __future__ import annotations

import ast
import collections
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from tooling.tiny_wheel import TINY_PACKAGE, write_wheel
from vllm_ascend_patchset import assemble as assemble_mod
from vllm_ascend_patchset import atomic, trees
from vllm_ascend_patchset.assemble import PatchError, assemble
from vllm_ascend_patchset.paths import OVERLAY_DIR, PATCH_DIR, assembled_root
from vllm_ascend_patchset.series import SeriesError, load_patches
from vllm_ascend_patchset.trees import PRISTINE_MARKER, pristine_root, pristine_tree

HEADER = "Description: test patch\nFeature: build\nForwarded: no\n\n"


def _patch_dir(tmp_path: Path, body: str, name: str = "0001-test.patch") -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "series").write_text(name + "\n")
    (d / name).write_text(HEADER + body)
    (d / "overlay.manifest").write_text("")
    return d


TINY_PATCH = """--- a/vllm_ascend/core/scheduler.py
+++ b/vllm_ascend/core/scheduler.py
@@ -1 +1 @@
-CHUNK_TOKENS = 8192
+CHUNK_TOKENS = 4096
"""


def _dirs(tmp_path: Path, overlay_text: str) -> dict[str, Path]:
    """assemble()'s patch_dir and overlay_dir: one patch, and one new module whose text tells builds apart."""
    patches = tmp_path / "patches"
    if not patches.exists():
        _patch_dir(tmp_path, TINY_PATCH)
    (patches / "overlay.manifest").write_text("extra.py build new\n")
    overlay = tmp_path / "tiny-overlay"
    overlay.mkdir(exist_ok=True)
    (overlay / "extra.py").write_text(overlay_text)
    return {"patch_dir": patches, "overlay_dir": overlay}


def _files(tree: Path) -> dict[str, bytes]:
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


BROKEN = """--- a/vllm_ascend/__init__.py
+++ b/vllm_ascend/__init__.py
@@ -37,6 +37,7 @@
 
 def register():
     \"\"\"Register the NPU platform.\"\"\"
+    pass
 
     return "vllm_ascend.platform.NPUPlatform"
 
@@ -72,4 +73,5 @@
 def register_model():
     from .models import this_line_is_not_upstream
 
+    pass
     register_model()
"""


def _upstream_init_only(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A wheel of upstream's vllm_ascend/__init__.py alone (the hunks' target), an output path, an empty overlay."""
    upstream_init = (pristine_root() / "vllm_ascend" / "__init__.py").read_bytes()
    wheel = write_wheel(
        tmp_path / "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl",
        {"vllm_ascend/__init__.py": upstream_init},
    )
    empty_overlay = tmp_path / "overlay"
    empty_overlay.mkdir()
    return wheel, tmp_path / "out" / "cp311-x86_64", empty_overlay


def test_broken_patch_names_patch_file_and_hunk_and_leaves_nothing(tmp_path, private_cache):
    wheel, out, empty_overlay = _upstream_init_only(tmp_path)
    with pytest.raises(PatchError) as err:
        assemble(wheel=wheel, patch_dir=_patch_dir(tmp_path, BROKEN), overlay_dir=empty_overlay, out_dir=out)
    msg = str(err.value)
    assert "0001-test.patch" in msg and "vllm_ascend/__init__.py" in msg and "hunk #2" in msg
    assert not out.exists()
    assert list(out.parent.iterdir()) == [], "the temporary tree must be removed"


def test_failed_assembly_keeps_the_previous_tree(tmp_path, tiny_wheel, private_cache):
    out = tmp_path / "out" / "t"
    before = _files(assemble(wheel=tiny_wheel, out_dir=out, **_dirs(tmp_path, "X = 1\n")).package)
    (tmp_path / "patches" / "0001-test.patch").write_text(HEADER + TINY_PATCH.replace("8192", "1234"))
    with pytest.raises(PatchError, match="0001-test.patch does not apply"):
        assemble(wheel=tiny_wheel, out_dir=out, **_dirs(tmp_path, "X = 2\n"))
    assert _files(out / "vllm_ascend") == before


def test_undeclared_overlay_collision_is_refused(tmp_path):
    overlay = tmp_path / "overlay"
    shutil.copytree(OVERLAY_DIR, overlay)
    (overlay / "ascend_config.py").write_text("# would shadow upstream\n")
    patches = tmp_path / "patches"
    shutil.copytree(PATCH_DIR, patches)
    with open(patches / "overlay.manifest", "a") as f:
        f.write("ascend_config.py build new\n")
    with pytest.raises(SeriesError, match=r"would overwrite upstream vllm_ascend/ascend_config.py; declare it "):
        assemble(patch_dir=patches, overlay_dir=overlay, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_overlay_file_missing_from_manifest_is_refused(tmp_path):
    overlay = tmp_path / "overlay"
    shutil.copytree(OVERLAY_DIR, overlay)
    (overlay / "stray.py").write_text("x = 1\n")
    with pytest.raises(SeriesError, match=r"overlay file\(s\) not declared: stray.py"):
        assemble(patch_dir=PATCH_DIR, overlay_dir=overlay, out_dir=tmp_path / "out")


def test_missing_header_field_names_the_patch(tmp_path):
    d = _patch_dir(tmp_path, BROKEN)
    (d / "0001-test.patch").write_text("Description: x\n\n" + BROKEN)
    with pytest.raises(SeriesError, match=r"0001-test.patch: header lacks Feature, Forwarded"):
        assemble(patch_dir=d, out_dir=tmp_path / "out")


def _interrupt_half_way_through_rmtree(monkeypatch):
    """The first rmtree deletes half of its tree's files, then SIGINT arrives."""
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
        for p in files[: len(files) // 2]:
            p.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", rmtree)


def _interrupt_at(module, name):
    def at(monkeypatch):
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(module, name, interrupted)

    return at


@pytest.mark.parametrize(
    "interrupt",
    [
        _interrupt_half_way_through_rmtree,
        _interrupt_at(assemble_mod.shutil, "copyfile"),  # copytree copies through it too
        _interrupt_at(assemble_mod, "apply_patch"),
        _interrupt_at(atomic.os, "replace"),
        _interrupt_at(atomic.os, "symlink"),
    ],
    ids=["removing-old-tree", "copying", "patching", "publishing", "linking"],
)
def test_interrupted_assembly_leaves_the_old_tree_or_the_new_one_whole(
    tmp_path, tiny_wheel, private_cache, monkeypatch, interrupt
):
    out = tmp_path / "out" / "t"
    old = _files(assemble(wheel=tiny_wheel, out_dir=out, **_dirs(tmp_path, "OLD = 1\n")).package)
    assert len(old) == len(TINY_PACKAGE) + 1 and old["core/scheduler.py"] == b"CHUNK_TOKENS = 4096\n"
    new_dirs = _dirs(tmp_path, "NEW = 2\n")
    interrupt(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        assemble(wheel=tiny_wheel, out_dir=out, **new_dirs)
    monkeypatch.undo()
    seen = _files(out / "vllm_ascend")
    assert seen in (old, {**old, "extra.py": b"NEW = 2\n"}), sorted(seen)


def test_leftovers_of_a_killed_run_are_removed_by_the_next(tmp_path, tiny_wheel, private_cache, dead_pid):
    out = tmp_path / "out" / "t"
    stale = [
        out.parent / f".t-{dead_pid}-abcd1234",  # an assembly that was killed
        out.parent / ".t-k2j4h5g6",  # the same, named by an older version of this tool
        private_cache / "pristine" / f"pristine-{dead_pid}-abcd1234",
        private_cache / "pristine" / "pristine-x7y8z9w0",
    ]
    live = private_cache / "pristine" / f"pristine-{os.getpid()}-inuse000"  # another build running now
    for folder in [*stale, live]:
        (folder / "vllm_ascend").mkdir(parents=True)
        (folder / "vllm_ascend" / "__init__.py").write_text("")
    assemble(wheel=tiny_wheel, out_dir=out, **_dirs(tmp_path, "X = 1\n"))
    assert [p for p in stale if p.exists()] == []
    assert live.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([os.readlink(out), "t"])


def _unpacked(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist()}


def _after_clock_tick(path: Path) -> None:
    """Wait until the file system's clock has passed ``path``'s ctime (timestamps advance in steps of a few ms)."""
    probe = path.with_name(".tick")
    while True:
        probe.touch()
        ticked = probe.stat().st_ctime_ns > path.stat().st_ctime_ns
        probe.unlink()
        if ticked:
            return


def _same_size_edit_keeping_mtime(tree: Path) -> str:
    path = tree / "vllm_ascend/core/scheduler.py"
    before = path.stat()
    path.write_bytes(path.read_bytes().replace(b"8192", b"9999"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return "vllm_ascend/core/scheduler.py was changed"


def _stray_file(tree: Path) -> str:
    (tree / "vllm_ascend/core/stray.py").write_text("import os\n")
    return "vllm_ascend/core/stray.py is not in the wheel"


def _removed_file(tree: Path) -> str:
    (tree / "vllm_ascend/platform.py").unlink()
    return "vllm_ascend/platform.py is missing"


def _symlinked_file(tree: Path) -> str:
    path = tree / "vllm_ascend/platform.py"
    path.unlink()
    path.symlink_to("__init__.py")
    return "vllm_ascend/platform.py is not a regular file"


def _edited_record(tree: Path) -> str:
    record = next(tree.glob("*.dist-info/RECORD"))
    record.write_text(record.read_text().replace("sha256=", "sha256=0", 1))
    return f"{record.relative_to(tree).as_posix()} was changed"


def _truncated_binary(tree: Path) -> str:
    path = tree / "vllm_ascend/_C.so"
    path.write_bytes(path.read_bytes()[:10])
    return "vllm_ascend/_C.so was changed"


@pytest.mark.parametrize(
    "tamper",
    [_same_size_edit_keeping_mtime, _stray_file, _removed_file, _symlinked_file, _edited_record, _truncated_binary],
)
def test_a_changed_pristine_tree_is_unpacked_again_and_never_assembled(
    tmp_path, tiny_wheel, private_cache, tamper, capsys
):
    tree = pristine_tree(tiny_wheel)
    _after_clock_tick(tree / PRISTINE_MARKER)
    problem = tamper(tree)
    a = assemble(wheel=tiny_wheel, out_dir=tmp_path / "out" / "t", **_dirs(tmp_path, "X = 1\n"))
    assert f"({problem}); unpacking it again" in capsys.readouterr().err
    assert _files(a.pristine) == {**_unpacked(tiny_wheel), PRISTINE_MARKER: f"{tiny_wheel.name}\n".encode()}
    package = {
        k.removeprefix("vllm_ascend/"): v for k, v in _unpacked(tiny_wheel).items() if k.startswith("vllm_ascend/")
    }
    package["core/scheduler.py"] = b"CHUNK_TOKENS = 4096\n"
    assert _files(a.package) == {**package, "extra.py": b"X = 1\n"}


def test_an_unchanged_pristine_tree_is_reused_and_a_rewritten_file_hashed_once(tiny_wheel, private_cache, monkeypatch):
    tree = pristine_tree(tiny_wheel)
    inode = (tree / "vllm_ascend/platform.py").stat().st_ino
    _after_clock_tick(tree / PRISTINE_MARKER)
    path = tree / "vllm_ascend/core/scheduler.py"
    path.write_bytes(path.read_bytes())  # same bytes, new ctime (as after copying the cache)
    hashed = []
    real = trees.matches
    monkeypatch.setattr(trees, "matches", lambda data, *row: hashed.append(row) or real(data, *row))
    assert pristine_tree(tiny_wheel) == tree
    assert len(hashed) == 1, "only the file touched after unpacking is read"
    assert pristine_tree(tiny_wheel) == tree
    assert len(hashed) == 1, "once it matched, the marker is renewed and it is not read again"
    assert (tree / "vllm_ascend/platform.py").stat().st_ino == inode, "not unpacked again"


def _uses(tree: Path) -> collections.Counter:
    """How often each identifier occurs in the tree's Python files."""
    counts: collections.Counter = collections.Counter()
    for path in (tree / "vllm_ascend").rglob("*.py"):
        counts.update(re.findall(r"\b[A-Za-z_]\w*\b", path.read_text(errors="replace")))
    return counts


@pytest.mark.full_tier("reads the assembled tree")
def test_no_patch_leaves_upstream_code_it_made_unused():
    """A top-level class or function of a patched file that upstream used somewhere must not be left
    behind unused (only its definition mentions it) in the shipped tree: remove it in the patch."""
    root, pristine = assembled_root(), pristine_root()  # the tree the tests import, and upstream's
    before, after = _uses(pristine), _uses(root)
    patched: dict[str, list[str]] = {}
    for patch in load_patches():
        for rel in patch.files:
            patched.setdefault(rel, []).append(patch.name)
    orphans = [
        f"{rel}: {node.name} (left unused by {', '.join(names)})"
        for rel, names in sorted(patched.items())
        for node in ast.parse((root / rel).read_text()).body
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and before[node.name] > 1 and after[node.name] <= 1
    ]
    assert orphans == []


def test_without_gnu_patch_the_error_says_what_to_install_and_leaves_nothing(tmp_path, private_cache, monkeypatch):
    wheel, out, empty_overlay = _upstream_init_only(tmp_path)
    monkeypatch.setattr(assemble_mod.shutil, "which", lambda name: None)  # a host without GNU patch
    with pytest.raises(RuntimeError, match="GNU patch is not installed.*apt install patch"):
        assemble(wheel=wheel, patch_dir=_patch_dir(tmp_path, BROKEN), overlay_dir=empty_overlay, out_dir=out)
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_path_in_the_way_is_an_error_naming_it_not_a_traceback(tmp_path, monkeypatch, capsys):
    """``dist`` (or build/) a file, or a folder that cannot be written: one line naming it and the fix, exit 2."""
    from vllm_ascend_patchset import cli

    def in_the_way(args):
        raise FileExistsError(17, "File exists", str(tmp_path / "dist"))

    monkeypatch.setattr(cli, "cmd_diffs", in_the_way)
    assert cli.main(["diffs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: [Errno 17] File exists: ") and str(tmp_path / "dist") in err
    assert "move what is in the way" in err and "Traceback" not in err


@pytest.mark.parametrize("target", ["diffs", "check-pin VERSION=0.23.0", "wheel", "assemble"])
def test_make_targets_pass_the_wheel_target_on(target):
    """PY= and ARCH= choose the pinned wheel (the error for a host without one says to pass them)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    dry = subprocess.run(["make", "-n", *target.split(), "PY=cp310", "ARCH=aarch64"], cwd=root, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert "--py cp310 --arch aarch64" in dry.stdout
