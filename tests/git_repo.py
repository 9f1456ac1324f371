"""A throw-away git repository for the tooling tests: fixed identity, no user config."""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def git(cwd: Path, *args: str) -> str:
    env = {**GIT_IDENTITY, "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"git {' '.join(args)}:\n{res.stdout}{res.stderr}"
    return res.stdout


def init_repo(path: Path, files: dict[str, bytes], message: str) -> Path:
    """A repository at ``path`` whose first commit holds ``files`` (repo-relative path -> bytes)."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for rel, data in files.items():
        dest = path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    git(path, "add", "-A")
    git(path, "commit", "-qm", message)
    return path
