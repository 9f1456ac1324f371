"""Test session set-up: import vllm_ascend from the assembled tree, stub NPU modules.

``make test`` assembles ``build/<target>/vllm_ascend`` first; the tests import exactly
that tree (the one the wheel packs), never an installed upstream vllm_ascend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the tooling package
from vllm_ascend_patchset.paths import ROOT, TESTS_DIR, assembled_root  # noqa: E402

sys.path.insert(0, str(TESTS_DIR))

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")  # pure vLLM unless a test asks for the plugin

ASSEMBLED = assembled_root()
__all__ = ["ASSEMBLED", "ROOT"]  # what tests read from here
if not (ASSEMBLED / "vllm_ascend" / "__init__.py").exists():
    raise RuntimeError(f"{ASSEMBLED}/vllm_ascend is not assembled; run 'make test' (or 'make assemble') first")
sys.path.insert(0, str(ASSEMBLED))

import npu_stubs  # noqa: E402
from hypothesis import settings  # noqa: E402

npu_stubs.install()

# Property tests explore the same examples on every run, so CI cannot flake on a new one.
settings.register_profile("patchset", derandomize=True)
settings.load_profile("patchset")


# Fixtures of the tooling tests (tests/tooling).


@pytest.fixture
def tiny_wheel(tmp_path: Path) -> Path:
    """A few-file stand-in for the pinned upstream wheel: the build's failure paths test in milliseconds."""
    from tooling.tiny_wheel import TINY_PACKAGE, write_wheel

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
