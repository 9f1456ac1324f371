"""The vllm_ascend trees the tools read: the pristine pinned one, the assembled one, and one module of either.

- Pristine: the pinned upstream wheel unpacked into the cache (``pristine_tree``), keyed
  by the wheel's hash and checked against its RECORD at every use. vLLM's fixed
  chunking and upstream's CPP run from it (twin, e2e); the build starts from it.
- Assembled: ``build/<py>-<arch>`` (``paths.assembled_root``), made by ``make assemble``.
- ``load_module_from_tree``: one module of a tree, without importing its package (whose
  ``__init__`` needs the NPU).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
import zipfile
from pathlib import Path
from types import ModuleType

from .atomic import publish_dir, remove_stale, scratch_dir
from .paths import PACKAGE, assembled_root, cache_dir
from .pin import Pin, fetch_wheel, sha256_of
from .record import matches, read_record
from .wheel_target import WheelTarget

ASSEMBLED, PRISTINE = "assembled", "pristine"  # the kinds of tree ``tree_root`` finds


PRISTINE_MARKER = ".complete"  # written last into an unpacked tree; its ctime dates the unpacking
PRISTINE_SCRATCH = "pristine-"


def pristine_tree(wheel: Path) -> Path:
    """The wheel unpacked into the cache, keyed by its hash, checked against the wheel at every use.

    A tree that differs from the wheel's RECORD (a file edited, added, removed) is unpacked
    again, with a warning that says what differed, so an edit in the cache never reaches a
    build.
    """
    parent = cache_dir() / "pristine"
    remove_stale(parent, PRISTINE_SCRATCH)
    dest = parent / sha256_of(wheel)[:16]
    if (dest / PRISTINE_MARKER).exists():
        problems = pristine_problems(dest, wheel)
        if not problems:
            return dest
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        print(f"warning: {dest} differs from {wheel.name} ({shown}); unpacking it again", file=sys.stderr)
    tmp = scratch_dir(parent, PRISTINE_SCRATCH)
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        (tmp / PRISTINE_MARKER).write_text(wheel.name + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, dest)
    return dest


def pristine_problems(tree: Path, wheel: Path) -> list[str]:
    """How an unpacked tree differs from the wheel's RECORD; empty if it does not.

    Cheap enough for every assemble: the file list is compared in full, but only files
    whose inode changed after the unpacking (ctime later than the marker's; no tool can
    set a ctime back) are read and hashed. When those all match, the marker is renewed so
    they are not hashed again. (File-system clocks advance in steps of a few ms: a change
    within the same step as the unpacking goes unseen.)
    """
    with zipfile.ZipFile(wheel) as z:
        record_name, rows = read_record(z)
        record_bytes = z.read(record_name)
    marker = tree / PRISTINE_MARKER
    unpacked_ns = marker.stat().st_ctime_ns
    problems: list[str] = []
    seen: set[str] = set()
    rehashed = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(tree).as_posix()
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) or rel == PRISTINE_MARKER:
                continue
            seen.add(rel)
            if rel not in rows:
                problems.append(f"{rel} is not in the wheel")
            elif not stat.S_ISREG(info.st_mode):
                problems.append(f"{rel} is not a regular file")
            elif info.st_ctime_ns > unpacked_ns:
                rehashed += 1
                data = path.read_bytes()
                same = data == record_bytes if rel == record_name else matches(data, *rows[rel])
                if not same:
                    problems.append(f"{rel} was changed")
    problems += [f"{rel} is missing" for rel in sorted(set(rows) - seen)]
    if rehashed and not problems:
        renewed = marker.with_name(f"{PRISTINE_MARKER}.{os.getpid()}")
        renewed.write_text(marker.read_text())
        os.replace(renewed, marker)
    return problems


def pristine_root(target: WheelTarget | None = None) -> Path:
    """The folder holding the pinned release's unpatched ``vllm_ascend/`` (this machine's wheel by default)."""
    return pristine_tree(fetch_wheel(Pin.load(), target or WheelTarget.host()))


def tree_root(kind: str) -> Path:
    """The folder holding the ``kind`` tree's ``vllm_ascend/``; an error saying what to run when it is missing."""
    if kind not in (ASSEMBLED, PRISTINE):
        raise ValueError(f"tree kind {kind!r}: expected {ASSEMBLED!r} or {PRISTINE!r}")
    root = pristine_root() if kind == PRISTINE else assembled_root()
    if not (root / PACKAGE / "__init__.py").exists():
        fix = "run 'make assemble'" if kind == ASSEMBLED else "run 'make assemble' (it unpacks the pinned wheel)"
        raise RuntimeError(f"no {PACKAGE} under {root}: {fix}")
    return root


def load_module_from_tree(tree: Path, name: str, *, reuse: bool = True) -> ModuleType:
    """Module ``name`` from the vllm_ascend tree ``tree``, without importing its (NPU-only) package siblings.

    With ``reuse`` a module already in ``sys.modules`` is returned as it is; without, the
    file is loaded again and replaces it.
    """
    if reuse and name in sys.modules:
        return sys.modules[name]
    path = Path(tree) / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
