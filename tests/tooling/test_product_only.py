"""The package carries the product only: no test-support code in the assembled tree.

The wheel packs exactly the assembled tree's Python files (test_wheel_and_diffs.py), so
what is not in ``build/<target>/vllm_ascend`` is not shipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

import conftest
import pytest
from vllm_ascend_patchset.paths import SCRIPTS_DIR, TESTS_DIR
from vllm_ascend_patchset.series import load_overlay

pytestmark = pytest.mark.full_tier("reads the assembled tree")
PACKAGE = conftest.ASSEMBLED / "vllm_ascend"
# The CPU stand-ins of the dual-stream backend interface (the tests' and the bench's emulated
# link), the bench's attention and batch stand-ins, and the old test-only switch.
TEST_ONLY_NAMES = (
    "CpuBackend",
    "SequentialBackend",
    "GlooAsyncBackend",
    "DeferredAllReduceBackend",
    "EmulatedLink",
    "PagedSdpaAttention",
    "FakeAscendMetadata",
    "dsbench",
    "dual_stream_strict",
    "CpuAttentionSplitter",
    "DsCpuWorker",
)
BENCH = SCRIPTS_DIR / "vllm_ascend_patchset" / "dsbench"


def _classes(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}


def test_no_test_only_name_anywhere_in_the_assembled_package():
    hits = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in TEST_ONLY_NAMES
        if name in path.read_text(errors="replace")
    ]
    assert hits == []


def test_no_class_of_the_tests_is_defined_by_the_overlay():
    test_classes = set().union(*(_classes(p) for d in (TESTS_DIR, BENCH) for p in d.rglob("*.py")))
    shipped = {e.relpath: _classes(PACKAGE / e.relpath) for e in load_overlay() if e.relpath.endswith(".py")}
    assert {path: names & test_classes for path, names in shipped.items() if names & test_classes} == {}
    assert {"SequentialBackend", "GlooAsyncBackend"} <= test_classes, "the check sees the CPU backends of the tests"
    assert {"EmulatedLinkBackend", "PagedSdpaAttention"} <= test_classes, "and the bench's"
