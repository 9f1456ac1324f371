"""Files of a checkout the port writes: only inside it, never through a symbolic link, never half-written.

A committed symlink at a path the port writes (or at one of that path's folders) would
send our text to whatever it points at, outside the work tree: git shows nothing and
that file's content is lost. A folder where a file goes, or a file where a folder goes,
would stop the port half-way. ``path_problems`` finds all of these before anything is
written; ``write_text`` checks again and then writes a temporary file in the same
folder, renamed over the old one with the old one's mode, so a file is never seen half
written and a hard link elsewhere keeps its text.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

FIX = "replace it in a commit, or port into a checkout without it"


class CheckoutPathError(RuntimeError):
    """A path the port would write is a link, the wrong kind of entry, or outside the checkout."""


def _problem(root: Path, relpath: str) -> str | None:
    """What keeps the port from writing ``root/relpath`` as a regular file, or None."""
    parts = PurePosixPath(relpath).parts
    if not parts or PurePosixPath(relpath).is_absolute() or ".." in parts:
        return f"{relpath!r} is not a path inside the checkout: fix that path in the patch or the overlay manifest"
    here = root
    for n, part in enumerate(parts, 1):
        here = here / part
        shown = "/".join(parts[:n])
        try:
            mode = os.lstat(here).st_mode
        except (FileNotFoundError, NotADirectoryError):  # a checkout that is a file: refused by the caller
            return None  # the rest is made by the port
        except OSError as error:
            return f"{shown} cannot be examined ({error.strerror}): make it readable, or port into another checkout"
        last = n == len(parts)
        if stat.S_ISLNK(mode):
            what = "" if last else f" (a folder of {relpath})"
            return (
                f"{shown} is a symbolic link (to {os.readlink(here)}){what}; the port never writes through a "
                f"link: {FIX}"
            )
        if not last and not stat.S_ISDIR(mode):
            return f"{shown} is a file where the port needs a folder (for {relpath}): {FIX}"
        if last and stat.S_ISDIR(mode):
            return f"{shown} is a folder where the port writes a file: {FIX}"
        if last and not stat.S_ISREG(mode):
            return f"{shown} is not a regular file: {FIX}"
    return None


def path_problems(root: Path, relpaths: Iterable[str]) -> list[str]:
    """One line per path of ``relpaths`` (relative to the checkout ``root``) the port must not write."""
    found = (_problem(root, relpath) for relpath in dict.fromkeys(relpaths))
    return [problem for problem in found if problem is not None]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(root: Path, relpath: str, text: str) -> None:
    """``text`` as the file ``root/relpath``, made with its folders; CheckoutPathError if the path is unsafe."""
    problem = _problem(root, relpath)
    if problem is not None:
        raise CheckoutPathError(problem)
    dest = root / relpath
    folder = root
    for part in PurePosixPath(relpath).parts[:-1]:
        folder = folder / part
        if not folder.exists():
            folder.mkdir()
    try:
        mode = stat.S_IMODE(os.lstat(dest).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    handle, scratch = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".port")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(scratch, mode)
        os.replace(scratch, dest)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
