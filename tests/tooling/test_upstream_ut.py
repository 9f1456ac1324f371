"""Upstream's own CPU unit tests of the modules the series patches pass on the assembled tree
(``make upstream-ut``), and fail there without ``patches/source/``: the run checks something.
``make diffs`` closes the cpp series with the tests and docs patches, as mails ``git am`` applies."""

from __future__ import annotations

import re

import pytest
from git_repo import git, init_repo
from vllm_ascend_patchset import upstream_ut
from vllm_ascend_patchset.assemble import apply_patch, assemble
from vllm_ascend_patchset.diffs import write_diffs
from vllm_ascend_patchset.series import SeriesError

FULL = "runs upstream's unit tests on vLLM and torch in a subprocess"


def _summary(result) -> str:
    lines = [line for line in result.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1] if lines else result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.full_tier(FULL)
def test_no_upstream_test_fails_with_the_series_that_passes_without_it(tmp_path):
    found = upstream_ut.compare(tmp_path)
    assert upstream_ut.regressions(found["series"], found["released"]) == []
    outcomes = list(found["series"].values())
    assert outcomes.count("passed") >= 1000, "upstream's CPU tests ran"
    # The rewritten test of the replaced predictor ran and passed, test by test.
    ours = {t: o for t, o in found["series"].items() if t.startswith("tests.ut.core.test_profiling_chunk::")}
    assert len(ours) >= 9 and set(ours.values()) == {"passed"}, ours
    # One test that failed with the series and passed without it would be reported, by name.
    broken = {**found["series"], "tests.ut.test_platform.TestNPUPlatform::test_get_device_name": "failed"}
    assert upstream_ut.regressions(broken, found["released"]) == [
        "tests.ut.test_platform.TestNPUPlatform::test_get_device_name"
    ]


@pytest.mark.full_tier(FULL)
def test_without_the_test_patches_upstreams_tests_of_the_replaced_code_fail(tmp_path):
    empty = tmp_path / "no-patches"
    empty.mkdir()
    out = upstream_ut.prepare(tmp_path / "ut", patch_dir=empty)
    # Upstream's test of the replaced predictor no longer imports ...
    replaced = upstream_ut.run(out, ("tests/ut/core/test_profiling_chunk.py",))
    assert replaced.returncode != 0
    assert "cannot import name 'ProfilingChunkConfig'" in replaced.stdout, _summary(replaced)
    # ... and the balance-schedule test builds the old scheduler's state.
    balance = upstream_ut.run(out, ("tests/ut/patch/platform/test_patch_balance_schedule.py",))
    assert balance.returncode != 0
    failed = re.findall(r"^FAILED (\S+)", balance.stdout, re.MULTILINE)
    assert failed == [
        "tests/ut/patch/platform/test_patch_balance_schedule.py::"
        "test_prefill_node_keeps_running_request_when_allocation_fails[profiling_chunk]"
    ], _summary(balance)


def test_the_source_patches_touch_only_upstreams_tests_and_docs(tmp_path):
    patches = upstream_ut.load_source_patches()
    assert patches, "patches/source/series lists no patch"
    assert {f.split("/")[0] for p in patches for f in p.files} == {"tests", "docs"}
    # A package file in that folder is refused, naming it and where it belongs.
    (tmp_path / "series").write_text("0001-x.patch\n")
    (tmp_path / "0001-x.patch").write_text(
        "Description: x\nAuthor: a <a@a>\nFeature: cpp\nForwarded: no\n\n"
        "--- a/vllm_ascend/platform.py\n+++ b/vllm_ascend/platform.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    with pytest.raises(SeriesError, match=r"vllm_ascend/platform.py.*patches/series"):
        upstream_ut.load_source_patches(tmp_path)


def test_the_cpp_series_ends_with_the_tests_and_docs_mails_which_git_am_applies(tmp_path):
    patches = upstream_ut.load_source_patches()
    written = write_diffs(assemble(out_dir=tmp_path / "t"), tmp_path / "upstream", source_patches=patches)
    last = written["cpp"][-len(patches) :]
    assert [p.name.split("-", 1)[1] for p in last] == ["cpp-unit-tests.patch", "cpp-user-docs.patch"]
    files = sorted({f for p in patches for f in p.files})
    pristine = upstream_ut.pristine_source()
    repo = init_repo(tmp_path / "repo", {f: (pristine / f).read_bytes() for f in files}, "upstream's tests and docs")
    git(repo, "am", "-q", *map(str, last))
    subjects = git(repo, "log", "-2", "--format=%s").splitlines()
    assert subjects == [
        "cpp: Document dynamic chunked pipeline parallelism as the series builds it",
        "cpp: Test dynamic chunked pipeline parallelism against its new modules",
    ]
    expected = tmp_path / "expected"
    for f in files:
        (expected / f).parent.mkdir(parents=True, exist_ok=True)
        (expected / f).write_bytes((pristine / f).read_bytes())
    for patch in patches:
        apply_patch(patch, expected)
    for f in files:
        assert (repo / f).read_bytes() == (expected / f).read_bytes(), f
