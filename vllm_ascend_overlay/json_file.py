"""Small JSON files that must survive a crash or a hostile edit: written atomically, read with a bound.

The CPP profile cache (core/cpp_profile_store.py) and dual stream's measured probes
(dual_stream/measured_store.py) keep their files through these two functions, so both
get the same guarantees: a reader never sees half a file, and a file that is too large,
unreadable, not UTF-8, not JSON or nested too deep is one error of the caller's type. A
written file gets the mode open() would give it (the umask's), not a temporary file's
owner-only one: a cache folder shared by several users stays readable to those it allows.
A temporary file left by a writer killed between writing and renaming is removed by the
next write of the same file once it is ``STALE_TMP_S`` old (a write takes milliseconds).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["new_file_mode", "read_json", "write_json_atomically"]

STALE_TMP_S = 3600.0  # a temporary file this old beside its target has no writer left


def write_json_atomically(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON to a temporary file beside ``path``, then rename it into place; OSError if it cannot."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False)
    try:
        with handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.chmod(handle.name, new_file_mode())  # as open() would make it: a temporary file is the owner's only
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    now = time.time()
    for leftover in path.parent.glob(glob.escape(path.name) + "*.tmp"):  # (a writer killed mid-write)
        try:
            if now - leftover.stat().st_mtime > STALE_TMP_S:
                leftover.unlink()
        except OSError:
            pass  # gone meanwhile, or not ours to remove: the next write tries again


def new_file_mode() -> int:
    """The mode a new file gets from open(): 0o666 less the process's umask (read, not set, where Linux says it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def read_json(path: str | os.PathLike, max_bytes: int, error: type[Exception]) -> Any:
    """The JSON value in ``path``; None when there is no such file; ``error(reason)`` when it cannot be read."""
    path = Path(path)
    try:
        if not path.exists():
            return None
        if not path.is_file():
            raise error("not a regular file")
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise error(f"larger than {max_bytes >> 20} MiB")
        value = json.loads(raw)
        if value is None:  # a file of ``null`` is not "no file": it is reported, not silently overwritten
            raise error("holds JSON null, not an object")
        return value
    except error:
        raise
    except (OSError, ValueError, RecursionError) as failure:  # unreadable, not UTF-8, not JSON, nested too deep
        raise error(f"{type(failure).__name__}: {failure}") from None
