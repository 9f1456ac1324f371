"""The wheel is valid, installs and is reproducible; each diff series applies with git am."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
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


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"git {' '.join(args)}:\n{res.stdout}{res.stderr}"
    return res.stdout


def test_each_series_applies_with_git_am_and_reproduces_the_assembly(assembly, tmp_path):
    written = write_diffs(assembly, tmp_path / "upstream")
    assert written, "the series must produce at least one feature"
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for path in (assembly.pristine / "vllm_ascend").rglob("*.py"):
        dest = repo / path.relative_to(assembly.pristine)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pristine v0.23.0")
    order = (tmp_path / "upstream" / "ORDER").read_text().splitlines()[1:]
    assert order == list(written)
    touched = set()
    for feature in order:
        _git(repo, "am", "-q", *[str(p) for p in written[feature]])
        touched |= set(_git(repo, "diff", "--name-only", f"HEAD~{len(written[feature])}", "HEAD").split())
    expected = {f for p in assembly.patches for f in p.files} | {e.repo_path for e in assembly.overlay}
    assert touched == expected
    for rel in sorted(touched):
        assert (repo / rel).read_bytes() == (assembly.root / rel).read_bytes(), rel
    log = _git(repo, "log", "--format=%s")
    assert "[PATCH" not in log and "build: Log the patch set at platform registration" in log
