"""Assembly applies the series with zero fuzz, refuses accidents and never leaves half a tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from vllm_ascend_patchset.assemble import PatchError, assemble
from vllm_ascend_patchset.series import OVERLAY_DIR, PATCH_DIR, SeriesError

HEADER = "Description: test patch\nFeature: build\nForwarded: no\n\n"


def _patch_dir(tmp_path: Path, body: str, name: str = "0001-test.patch") -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "series").write_text(name + "\n")
    (d / name).write_text(HEADER + body)
    (d / "overlay.manifest").write_text("")
    return d


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


def test_broken_patch_names_patch_file_and_hunk_and_leaves_nothing(tmp_path):
    out = tmp_path / "out" / "cp311-x86_64"
    empty_overlay = tmp_path / "overlay"
    empty_overlay.mkdir()
    with pytest.raises(PatchError) as err:
        assemble(patch_dir=_patch_dir(tmp_path, BROKEN), overlay_dir=empty_overlay, out_dir=out)
    msg = str(err.value)
    assert "0001-test.patch" in msg and "vllm_ascend/__init__.py" in msg and "hunk #2" in msg
    assert not out.exists()
    assert list(out.parent.iterdir()) == [], "the temporary tree must be removed"


def test_failed_assembly_keeps_the_previous_tree(tmp_path):
    out = tmp_path / "out" / "t"
    good = assemble(out_dir=out)
    marker = good.package / "patchset.py"
    before = marker.read_bytes()
    empty_overlay = tmp_path / "overlay"
    empty_overlay.mkdir()
    with pytest.raises(PatchError):
        assemble(patch_dir=_patch_dir(tmp_path, BROKEN), overlay_dir=empty_overlay, out_dir=out)
    assert marker.read_bytes() == before


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


def test_assembled_tree_is_pristine_plus_series_plus_overlay(tmp_path):
    a = assemble(out_dir=tmp_path / "t")
    for entry in a.overlay:
        assert (a.package / entry.relpath).read_bytes() == entry.source.read_bytes()
    touched = {f for p in a.patches for f in p.files} | {e.repo_path for e in a.overlay}
    # everything the series does not touch is byte-identical to upstream
    for path in (a.pristine / "vllm_ascend").rglob("*.py"):
        rel = path.relative_to(a.pristine).as_posix()
        if rel not in touched:
            assert (a.root / rel).read_bytes() == path.read_bytes(), rel
