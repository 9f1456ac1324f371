"""Upstream's source outside the package (its unit tests and docs), patched, and its unit tests
run against the assembled tree as upstream's CPU runner runs them.

A series a maintainer merges must leave upstream's unit tests passing and its docs true.
The pinned sdist holds both (``tests/ut/``, with its ``conftest.py`` that stands in for
``torch_npu`` on a machine without an NPU, and ``docs/``); the wheel does not. So:

- ``pristine_source()``: the sdist's ``tests/`` and ``docs/`` unpacked into the cache,
  keyed by its hash;
- ``prepare(out)``: a copy of them with the patches of ``patches/source/`` applied (zero
  fuzz, as any patch; they rewrite the tests and docs of what the series replaces), beside
  a root that holds the assembled ``vllm_ascend/`` and the pinned wheel's ``dist-info``
  (its entry points register the platform plugin, as an installed wheel's do);
- ``run(out)``: pytest over upstream's CPU tests in a subprocess, with a JUnit report. The
  one module the tests need and the test environment lacks (``torchvision``, imported by
  vLLM's multimodal models when upstream's patches load) is stood in for by ``ut_stubs.py``;
- ``regressions(...)``: the tests that fail with the series and passed on upstream as
  released (``prepare(..., baseline=True)``), run the same way: some of upstream's CPU
  tests fail on this machine whatever the series does (no HCCL, no Mooncake).

``make upstream-ut`` runs it; ``tests/tooling/test_upstream_ut.py`` runs it in ``make test``.
The mails of ``make diffs`` carry ``patches/source/`` last in each feature's series.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from xml.etree import ElementTree

from .assemble import apply_patch
from .atomic import publish_dir, remove_stale, scratch_dir
from .paths import PACKAGE, PATCH_DIR, SCRIPTS_DIR, assembled_root, cache_dir
from .pin import Pin, fetch, fetch_wheel
from .series import Patch, SeriesError, load_patches
from .trees import pristine_tree
from .wheel_target import WheelTarget

SOURCE_PATCH_DIR = PATCH_DIR / "source"
SOURCE_FOLDERS = ("tests", "docs")  # what of the sdist the patches may change
# Upstream's CPU tests, all of them: tests/ut/<module>/ runs on the CPU runner, its a2/, a3*/ and
# 310p folders on NPUs, which this machine has not. Some fail here without the series too (no
# HCCL, no Mooncake): the series is judged by what fails with it and passed without it.
UT_PATHS = ("tests/ut",)
NPU_FOLDERS = ("*/a2/*", "*/a2_2/*", "*/a3_2/*", "*/a3_4/*", "*/310p/*", "*/_310p/*")
_SCRATCH = "sdist-source-"
_MARKER = ".complete"


def load_source_patches(patch_dir: Path = SOURCE_PATCH_DIR) -> list[Patch]:
    """The patches to upstream's tests and docs, in their ``series`` order (none without the folder)."""
    patches = load_patches(patch_dir) if (patch_dir / "series").is_file() else []
    for patch in patches:
        outside = [f for f in patch.files if f.split("/", 1)[0] not in SOURCE_FOLDERS]
        if outside:
            raise SeriesError(
                f"{patch.path}: changes {', '.join(outside)}; a patch of {patch_dir.name}/ changes only upstream's "
                f"{' and '.join(f + '/' for f in SOURCE_FOLDERS)} (the package's files go in patches/series)"
            )
    return patches


def pristine_source(pin: Pin | None = None) -> Path:
    """The folder holding the pinned sdist's ``tests/`` and ``docs/``, unpacked once into the cache."""
    pin = pin or Pin.load()
    ((name, sha256),) = pin.sdist.items()
    parent = cache_dir() / "pristine"
    dest = parent / f"{sha256[:16]}-source"
    if (dest / _MARKER).exists():
        return dest
    sdist = fetch(name, sha256, pin.project)
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale(parent, _SCRATCH)
    tmp = scratch_dir(parent, _SCRATCH)
    try:
        with tarfile.open(sdist) as archive:
            top = name.removesuffix(".tar.gz") + "/"
            wanted = tuple(f"{top}{folder}/" for folder in SOURCE_FOLDERS)
            members = [m for m in archive.getmembers() if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
            missing = [f for f in SOURCE_FOLDERS if not any(m.name.startswith(f"{top}{f}/") for m in members)]
            if missing:
                absent = ", ".join(missing)
                raise RuntimeError(f"{sdist}: no {absent} folder under {top}; the pinned sdist is not upstream's")
            for member in members:
                member.name = member.name.removeprefix(top)
            archive.extractall(tmp, members=members, filter="data")
        (tmp / _MARKER).write_text(name + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, dest)
    return dest


def prepare(
    out: Path, target: WheelTarget | None = None, patch_dir: Path = SOURCE_PATCH_DIR, *, baseline: bool = False
) -> Path:
    """``out/tests`` and ``out/docs`` (upstream's, patched) and ``out/site`` (assembled package +
    the wheel's dist-info); returns ``out``. Needs ``make assemble``. ``baseline``: upstream as
    released instead, its package and its tests and docs unpatched (what the series is compared with)."""
    pin = Pin.load()
    wheel_tree = pristine_tree(fetch_wheel(pin, target or WheelTarget.host()))
    package = (wheel_tree if baseline else assembled_root(target)) / PACKAGE
    if not (package / "__init__.py").is_file():
        raise RuntimeError(f"no {PACKAGE} under {package.parent}: run 'make assemble'")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    source = pristine_source(pin)
    for folder in SOURCE_FOLDERS:
        shutil.copytree(source / folder, out / folder)
    for patch in [] if baseline else load_source_patches(patch_dir):
        apply_patch(patch, out)
    # pytest's own root and (empty) configuration: upstream has none, and the checkout's must not apply
    (out / "pytest.ini").write_text("[pytest]\n")
    site = out / "site"
    site.mkdir()
    (site / PACKAGE).symlink_to(package.resolve(), target_is_directory=True)
    for info in wheel_tree.glob("*.dist-info"):
        shutil.copytree(info, site / info.name)
    return out


def run(
    out: Path,
    paths: Sequence[str] = UT_PATHS,
    extra: Sequence[str] = (),
    *,
    report: Path | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess:
    """pytest over ``paths`` (upstream's, e.g. ``tests/ut/core``) of a ``prepare``d folder, as
    upstream's CPU runner runs them; ``report``: a JUnit XML file of every test's outcome."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(out / "site"), str(out), str(SCRIPTS_DIR)])
    env.pop("VLLM_PLUGINS", None)  # the platform plugin must load, as in serving
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "vllm_ascend_patchset.ut_stubs", "-p", "no:cacheprovider"]
    cmd += ["-c", str(out / "pytest.ini"), "--rootdir", str(out), "--continue-on-collection-errors"]
    cmd += [f"--ignore-glob={glob}" for glob in NPU_FOLDERS]
    if report is not None:
        cmd.append(f"--junitxml={report}")
    return subprocess.run([*cmd, *extra, *paths], cwd=out, env=env, capture_output=capture, text=True)


def outcomes(report: Path) -> dict[str, str]:
    """Test id -> ``passed``, ``failed``, ``error`` or ``skipped``, from a JUnit XML report (a module
    that does not import is one ``error``)."""
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        found[f"{case.get('classname', '')}::{case.get('name', '')}"] = {"failure": "failed"}.get(outcome, outcome)
    return found


def regressions(series: dict[str, str], baseline: dict[str, str]) -> list[str]:
    """Tests that fail or do not import with the series and did not without it (a test the series
    adds counts when it fails; one it replaces, by its absence, does not)."""
    broken = ("failed", "error")
    return sorted(t for t, outcome in series.items() if outcome in broken and baseline.get(t) not in broken)


def compare(out: Path, target: WheelTarget | None = None) -> dict[str, dict[str, str]]:
    """Every CPU test's outcome on upstream as released (``released``) and with the series
    (``series``), each run in its own folder under ``out`` with its JUnit report."""
    found = {}
    for name, baseline in (("released", True), ("series", False)):
        tree = prepare(out / name, target, baseline=baseline)
        run(tree, report=tree / "report.xml")
        found[name] = outcomes(tree / "report.xml")
    return found
