"""Fixtures of the tooling tests: a tiny wheel, a private cache, a pid that no longer runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_wheel import TINY_PACKAGE, write_wheel


@pytest.fixture
def tiny_wheel(tmp_path: Path) -> Path:
    return write_wheel(tmp_path / "wheels" / "vllm_ascend-0.23.0-cp311-cp311-manylinux_2_34_x86_64.whl", TINY_PACKAGE)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty PATCHSET_CACHE with downloads allowed."""
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHSET_OFFLINE", raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def dead_pid() -> int:
    """The pid of a process that has exited (what a killed build leaves in its scratch names)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid
