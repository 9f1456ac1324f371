"""The wheel is valid, installs and is reproducible; each diff series applies with git am."""

from __future__ import annotations

import zipfile

import pytest
from git_repo import git, init_repo
from vllm_ascend_patchset.assemble import assemble
from vllm_ascend_patchset.diffs import write_diffs
from vllm_ascend_patchset.pin import Pin, Target
from vllm_ascend_patchset.wheel import build_wheel


@pytest.fixture(scope="module")
def assembly(tmp_path_factory):
    return assemble(out_dir=tmp_path_factory.mktemp("assembled") / "t")


def test_wheel_is_verified_installable_and_reproducible(assembly, tmp_path):
    pin = Pin.load()
    first = build_wheel(Target.host(), pin=pin, out_dir=tmp_path / "a", assembly=assembly)
    second = build_wheel(Target.host(), pin=pin, out_dir=tmp_path / "b", assembly=assembly, verify_install=False)
    assert first.sha256 == second.sha256
    host = Target.host()
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


def test_each_series_applies_with_git_am_and_reproduces_the_assembly(assembly, tmp_path):
    written = write_diffs(assembly, tmp_path / "upstream")
    assert written, "the series must produce at least one feature"
    files = {
        p.relative_to(assembly.pristine).as_posix(): p.read_bytes()
        for p in (assembly.pristine / "vllm_ascend").rglob("*.py")
    }
    repo = init_repo(tmp_path / "repo", files, "pristine v0.23.0")
    order = (tmp_path / "upstream" / "ORDER").read_text().splitlines()[1:]
    assert order == list(written)
    touched = set()
    for feature in order:
        git(repo, "am", "-q", *[str(p) for p in written[feature]])
        touched |= set(git(repo, "diff", "--name-only", f"HEAD~{len(written[feature])}", "HEAD").split())
    expected = {f for p in assembly.patches for f in p.files} | {e.repo_path for e in assembly.overlay}
    assert touched == expected
    for rel in sorted(touched):
        assert (repo / rel).read_bytes() == (assembly.root / rel).read_bytes(), rel
    log = git(repo, "log", "--format=%s")
    assert "[PATCH" not in log and "build: Log the patch set at platform registration" in log
