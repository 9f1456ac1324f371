"""Outputs that appear complete or not at all, and scratch space that an interruption cannot leak.

Every output (the assembled tree, the unpacked pristine tree, a download, a wheel) is made
in a scratch folder ``<prefix><pid>-<random>`` next to its final place and published by one
``rename(2)``. A reader sees the old output or the new one, never a mix. A scratch folder
left by a process that no longer runs (SIGKILL, power loss, or SIGINT between the publish
and the removal of the old tree) is removed by the next run of any step that uses the
same folder.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def scratch_dir(parent: Path, prefix: str) -> Path:
    """A new empty folder ``parent/<prefix><pid>-<random>``; the pid tells a later run whether it is stale.

    It gets the mode a new folder gets from the umask, not mkdtemp's owner-only one: it is published."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    mask = os.umask(0o022)
    os.umask(mask)
    path.chmod(0o777 & ~mask)
    return path


def publish_folder(new: Path, dest: Path) -> None:
    """Make ``dest`` the real folder ``new`` (a sibling, made by ``scratch_dir``): the old one is moved
    aside, ``new`` renamed into place, the old one removed. ``dest`` is absent for an instant, never
    half-filled; an old one left by an interruption carries the scratch's pid (``remove_stale``).
    For outputs that are copied or archived as they are (a symlink would travel without its tree)."""
    if new.parent != dest.parent:
        raise ValueError(f"{new} must be a sibling of {dest}")
    old = None
    if dest.is_symlink():  # as publish_dir leaves it
        old = dest.parent / os.readlink(dest)
        dest.unlink()
    elif dest.exists():
        old = new.with_name(new.name + ".old")
        os.rename(dest, old)
    os.rename(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except (OverflowError, ValueError):
        return False
    return True


def remove_stale(parent: Path, prefix: str) -> list[str]:
    """Remove ``parent/<prefix>*`` left by processes that are gone; return their names.

    An entry whose name does not carry a pid (left by an older version of this tool) is
    stale too. A folder that a symlink in ``parent`` publishes is kept: it is live output.
    """
    if not parent.is_dir():
        return []
    entries = list(parent.iterdir())
    published = {Path(os.readlink(e)).name for e in entries if e.is_symlink() and not e.name.startswith(prefix)}
    removed = []
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.name in published:
            continue
        m = re.match(r"(\d+)-", entry.name[len(prefix) :])
        if m and _running(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def publish_dir(new: Path, dest: Path) -> None:
    """Make ``dest`` show the folder ``new`` (a sibling, made by ``scratch_dir``) in one step.

    ``dest`` becomes a symlink to ``new``, replaced by ``rename(2)``, so it always names a
    complete tree. The tree it named before is removed afterwards; if that removal is
    interrupted, ``remove_stale`` finishes it on the next run. A real folder at ``dest``
    (as older versions of this tool left it) is first moved aside; only that one-time move
    leaves ``dest`` absent for an instant, never half-filled.
    """
    if new.parent != dest.parent:
        raise ValueError(f"{new} must be a sibling of {dest}")
    link = new.with_name(new.name + ".link")  # carries new's pid: stale-removable if we stop here
    os.symlink(new.name, link)
    old = dest.parent / os.readlink(dest) if dest.is_symlink() else None
    if dest.exists() and not dest.is_symlink():
        old = new.with_name(new.name + ".old")
        os.rename(dest, old)
    os.replace(link, dest)
    if old is not None and old.name != new.name:
        shutil.rmtree(old, ignore_errors=True)
