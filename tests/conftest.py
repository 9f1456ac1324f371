"""Test session set-up, in two tiers (``tiers.py`` sorts the tests).

- ``make test`` (``pytest tests``): every test. ``make test`` assembles
  ``build/<target>/vllm_ascend`` first; the tests import exactly that tree (the one the
  wheel packs), never an installed upstream vllm_ascend; NPU-only modules are stubbed.
- ``make test-fast`` (``pytest tests --fast``): the tests that need neither vLLM, torch
  nor the assembled tree, in seconds. ``vllm_ascend`` is the overlay folder itself, and
  vLLM and torch cannot be imported.
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

import shards  # noqa: E402
import tiers  # noqa: E402
from hypothesis import settings  # noqa: E402

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")  # pure vLLM unless a test asks for the plugin

ASSEMBLED = assembled_root()  # the full tier's tree (the fast tier has none)
__all__ = ["ASSEMBLED", "ROOT"]  # what tests read from here

# Property tests explore the same examples on every run, so CI cannot flake on a new one.
settings.register_profile("patchset", derandomize=True)
settings.load_profile("patchset")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast", action="store_true", help="only the tests that need neither vLLM, torch nor the assembled tree"
    )
    parser.addoption(
        "--shard",
        type=shards.shard_option,
        default=None,
        metavar="K/N",
        help="every N-th selected test from the K-th (0-based): one of N processes sharing the work (tests/shards.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "full_tier(reason): needs vLLM, torch or the assembled tree where its imports do not show it"
    )
    global ASSEMBLED
    if config.getoption("--fast"):
        tiers.enter_fast_tier()
        ASSEMBLED = assembled_root()  # a tree that does not exist: what reads it fails here, not on a fresh clone
        return
    if not (ASSEMBLED / "vllm_ascend" / "__init__.py").exists():
        raise pytest.UsageError(
            f"{ASSEMBLED}/vllm_ascend is not assembled; run 'make test' (or 'make assemble') first, "
            "or 'make test-fast' for the tests that need no build"
        )
    sys.path.insert(0, str(ASSEMBLED))
    import npu_stubs

    npu_stubs.install()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier does not even import a test file (or folder) that needs vLLM, torch or the build."""
    if not config.getoption("--fast"):
        return None
    if collection_path.is_dir():
        need = tiers.directory_needs(collection_path)
    elif collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        need = tiers.file_needs(collection_path)
    else:
        return None
    if need:
        if any(collection_path == arg or arg in collection_path.parents for arg in _arg_paths(config)):
            config.stash.setdefault(_LEFT_OUT, []).append(f"{collection_path.relative_to(ROOT)}: needs {need}")
        return True
    return None


def _arg_paths(config: pytest.Config) -> list[Path]:
    """The files and folders the command line names (without ``::test`` parts)."""
    return [Path(arg.split("::")[0]).resolve() for arg in config.args]


_LEFT_OUT = pytest.StashKey[list]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, deselected = [], []
    for item in items:
        (deselected if config.getoption("--fast") and _needs_the_full_tier(item) else kept).append(item)
    shard = config.getoption("--shard")
    if shard is not None:
        index, count = shard
        deselected += [item for n, item in enumerate(kept) if n % count != index]
        kept = kept[index::count]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _needs_the_full_tier(item: pytest.Item) -> bool:
    scope = item.cls.__name__ if item.cls else getattr(item, "originalname", item.name)
    return item.get_closest_marker("full_tier") is not None or tiers.function_needs(item.path, scope) is not None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    left_out = config.stash.get(_LEFT_OUT, [])
    if config.getoption("--fast") and left_out:
        terminalreporter.write_line(f"fast tier: {len(left_out)} test files and folders left to 'make test'")
        if config.getoption("verbose") > 0:
            for line in left_out:
                terminalreporter.write_line(f"  {line}")


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
def pristine() -> Path:
    """The pinned release's ``vllm_ascend/``, unpacked once a session: what the port tests port onto."""
    from scripted_upstream import pristine_package

    return pristine_package()


@pytest.fixture(scope="session")
def dead_pid() -> int:
    """The pid of a process that has exited (what a killed build leaves in its scratch names)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid
