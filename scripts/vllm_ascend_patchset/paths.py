"""Where the patch set's things are: the checkout, its folders, the cache and the assembled trees.

Every module of the tooling, the benchmarks and the tests take these from here; nothing
else works out where the repository is. This module imports nothing of the tooling but
``wheel_target``, so any module can import it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .wheel_target import WheelTarget

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SCRIPTS_DIR = ROOT / "scripts"  # holds this package; a subprocess that runs the tooling puts it on PYTHONPATH
BENCH_DIR = SCRIPTS_DIR / "bench"
TESTS_DIR = ROOT / "tests"
DATA_DIR = TESTS_DIR / "data"  # measured latency surfaces and public trace heads
CPU_SURFACE = DATA_DIR / "cpu_surface.csv"  # the committed CPU surface: the twin's default
PIN_FILE = ROOT / "pin.json"
PATCH_DIR = ROOT / "patches"
OVERLAY_DIR = ROOT / "vllm_ascend_overlay"  # our modules, at their path inside vllm_ascend/
BUILD_DIR = ROOT / "build"
DIST_DIR = ROOT / "dist"
DEFAULT_CACHE = ROOT / ".cache"
PACKAGE = "vllm_ascend"  # the package's folder in every tree (pristine, assembled, an upstream checkout)
TARGET_ENV = "PATCHSET_TARGET"  # names the assembled tree to use instead of this machine's


def cache_dir() -> Path:
    """Downloads and the unpacked pristine trees: ``$PATCHSET_CACHE``, by default ``.cache/``."""
    return Path(os.environ.get("PATCHSET_CACHE", DEFAULT_CACHE))


def assembled_root(target: WheelTarget | None = None) -> Path:
    """``build/<py>-<arch>``, which holds the assembled ``vllm_ascend/``: the tree the tests import and the wheel packs.

    Without ``target``: ``$PATCHSET_TARGET`` if set, else this machine's.
    """
    name = target.name if target is not None else os.environ.get(TARGET_ENV) or WheelTarget.host().name
    return BUILD_DIR / name
