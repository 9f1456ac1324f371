"""The wheel is valid, installs and is reproducible; each diff series applies with git am."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from vllm_ascend_patchset import wheel as wheel_mod
from vllm_ascend_patchset.assemble import assemble
from vllm_ascend_patchset.diffs import write_diffs
from vllm_ascend_patchset.pin import Pin, Target
from vllm_ascend_patchset.wheel import WheelError, build_wheel


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


@pytest.fixture
def tiny_assembly(tmp_path, tiny_wheel, private_cache):
    """The tiny wheel assembled with an empty series: enough for build_wheel's own steps."""
    patches, overlay = tmp_path / "patches", tmp_path / "overlay"
    patches.mkdir()
    overlay.mkdir()
    (patches / "series").write_text("")
    return assemble(wheel=tiny_wheel, out_dir=tmp_path / "t", patch_dir=patches, overlay_dir=overlay)


def test_a_wheel_that_fails_verification_never_reaches_dist(tiny_assembly, tmp_path, monkeypatch, dead_pid):
    dist = tmp_path / "dist"
    good = build_wheel(Target.host(), out_dir=dist, assembly=tiny_assembly, verify_install=False)
    before = good.path.read_bytes()
    (dist / f".wheel-{dead_pid}-abcd1234").mkdir()  # left by a killed build
    (tiny_assembly.package / "platform.py").write_text("broken = True\n")

    def refuse(path, target, install):
        raise WheelError(f"{path.name}: refused")

    monkeypatch.setattr(wheel_mod, "verify_wheel", refuse)
    with pytest.raises(WheelError, match="refused"):
        build_wheel(Target.host(), out_dir=dist, assembly=tiny_assembly)
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
        build_wheel(Target.host(), out_dir=tmp_path / "dist", assembly=tiny_assembly)
    assert os.listdir(tmp_path / "dist") == []


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
