"""The tier split reads what a test needs from its imports, through helpers, the tooling and the overlay."""

from __future__ import annotations

import argparse
import sys

import pytest
import shards
import tiers
from vllm_ascend_patchset.paths import TESTS_DIR


def _module(tmp_path, source: str, name: str = "test_probe.py"):
    path = tmp_path / name
    path.write_text(source)
    return path


@pytest.mark.parametrize(
    ("source", "needs"),
    [
        ("import numpy\nfrom hypothesis import given\n", None),
        ("import torch\n", "torch"),
        ("from vllm.config import VllmConfig\n", "vLLM"),
        ("from vllm_ascend.core.cpp_planner import plan_target\n", None),  # our CPP maths: numpy only
        ("from vllm_ascend.dual_stream.config import DualStreamConfig\n", "vLLM"),  # it logs through vLLM
        ("from vllm_ascend.ascend_config import AscendConfig\n", "the assembled tree"),  # upstream's module
        ("import vllm_ascend\n", "the assembled tree"),  # upstream's package __init__
        ("from vllm_ascend import config_table\n", None),
        ("from vllm_ascend_patchset.twin import policies\n", None),
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", None),  # optional
        ("def test_x():\n    import torch\n", None),  # the module imports; the test is sorted on its own
    ],
)
def test_a_module_needs_what_its_imports_reach(tmp_path, source, needs):
    found = tiers.file_needs(_module(tmp_path, source))
    assert (found if found is None else found.split(" (")[0]) == needs


def test_a_helper_that_says_so_needs_the_full_tier_and_so_does_whatever_imports_it(tmp_path):
    (tmp_path / "spawner.py").write_text('FULL_TIER = "starts vLLM in a subprocess"\nimport subprocess\n')
    assert "starts vLLM in a subprocess" in tiers.file_needs(_module(tmp_path, "import spawner\n"))


def test_a_test_function_is_sorted_on_the_imports_inside_it(tmp_path):
    path = _module(tmp_path, "def test_a():\n    import torch\n\ndef test_b():\n    import json\n")
    assert tiers.function_needs(path, "test_a") == "torch"
    assert tiers.function_needs(path, "test_b") is None


def test_the_tests_of_the_cpp_maths_are_fast_and_those_of_the_engine_are_not():
    assert tiers.file_needs(TESTS_DIR / "cpp" / "test_planner.py") is None
    assert tiers.file_needs(TESTS_DIR / "tooling" / "test_port.py") is None
    assert "helpers.py" in tiers.file_needs(TESTS_DIR / "cpp_engine" / "test_scheduler_profiling_chunk.py")
    assert "rank_processes.py" in tiers.directory_needs(TESTS_DIR / "dual_stream")


def test_in_the_fast_tier_vllm_and_torch_do_not_import_and_vllm_ascend_is_the_overlay():
    if tiers.overlay_package() is None:
        pytest.skip("runs in the fast tier (make test-fast), where the session is set up so")
    for name in ("vllm", "torch"):
        if name not in sys.modules:
            with pytest.raises(ImportError, match="the fast tier runs without vLLM and torch"):
                __import__(name)
    from vllm_ascend.core import cpp_planner

    assert "vllm_ascend_overlay" in cpp_planner.__file__


@pytest.mark.parametrize(("text", "expected"), [("0/2", (0, 2)), ("1/2", (1, 2)), ("0/1", (0, 1))])
def test_a_shard_is_k_of_n(text, expected):
    assert shards.shard_option(text) == expected


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "0/0"])
def test_a_shard_out_of_range_is_refused_saying_what_to_give(text):
    with pytest.raises(argparse.ArgumentTypeError, match="give K/N with 0 <= K < N"):
        shards.shard_option(text)
