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
- ``run(out)``: pytest over ``UT_PATHS``, the tests of every upstream module the series
  patches or replaces, in a subprocess. The one module the tests need and the test
  environment lacks (``torchvision``, imported by vLLM's multimodal models when upstream's
  patches load) is stood in for by ``ut_stubs.py``.

``make upstream-ut`` runs it; ``tests/tooling/test_upstream_ut.py`` runs it in ``make test``.
The mails of ``make diffs`` carry ``patches/source/`` last in each feature's series.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .assemble import apply_patch
from .atomic import publish_dir, remove_stale, scratch_dir
from .paths import PACKAGE, PATCH_DIR, SCRIPTS_DIR, assembled_root, cache_dir
from .pin import Pin, fetch, fetch_wheel
from .series import Patch, SeriesError, load_patches
from .trees import pristine_tree
from .wheel_target import WheelTarget

SOURCE_PATCH_DIR = PATCH_DIR / "source"
SOURCE_FOLDERS = ("tests", "docs")  # what of the sdist the patches may change
# Upstream's CPU tests of the modules the series patches (ascend_config.py, platform.py,
# patch_balance_schedule.py, worker/) or replaces (core/): tests/ut/<module>/ runs on CPU, its
# a2/, a3*/ and 310p/ folders on NPUs, which this machine has not.
UT_PATHS = (
    "tests/ut/test_ascend_config.py",
    "tests/ut/test_platform.py",
    "tests/ut/core",
    "tests/ut/patch/platform",
    "tests/ut/worker/test_encoder_acl_graph.py",
    "tests/ut/worker/test_utils.py",
)
NPU_FOLDERS = ("*/a2/*", "*/a2_2/*", "*/a3_2/*", "*/a3_4/*", "*/310p/*")
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


def prepare(out: Path, target: WheelTarget | None = None, patch_dir: Path = SOURCE_PATCH_DIR) -> Path:
    """``out/tests`` and ``out/docs`` (upstream's, patched) and ``out/site`` (assembled package +
    the wheel's dist-info); returns ``out``. Needs ``make assemble``."""
    pin = Pin.load()
    package = assembled_root(target) / PACKAGE
    if not (package / "__init__.py").is_file():
        raise RuntimeError(f"no {PACKAGE} under {package.parent}: run 'make assemble'")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for folder in SOURCE_FOLDERS:
        shutil.copytree(pristine_source(pin) / folder, out / folder)
    for patch in load_source_patches(patch_dir):
        apply_patch(patch, out)
    site = out / "site"
    site.mkdir()
    (site / PACKAGE).symlink_to(package.resolve(), target_is_directory=True)
    wheel_tree = pristine_tree(fetch_wheel(pin, target or WheelTarget.host()))
    for info in wheel_tree.glob("*.dist-info"):
        shutil.copytree(info, site / info.name)
    return out


def run(out: Path, paths: tuple[str, ...] = UT_PATHS, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """pytest over ``paths`` of a ``prepare``d folder, as upstream's CPU runner runs them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(out / "site"), str(out), str(SCRIPTS_DIR)])
    env.pop("VLLM_PLUGINS", None)  # the platform plugin must load, as in serving
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "vllm_ascend_patchset.ut_stubs", "-p", "no:cacheprovider"]
    cmd += [f"--ignore-glob={glob}" for glob in NPU_FOLDERS]
    return subprocess.run([*cmd, *extra, *paths], cwd=out, env=env, capture_output=True, text=True)
