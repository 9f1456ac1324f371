"""Step timing through vLLM's real pipeline-parallel transport: three gloo processes, uneven stages.

A timed step must report, on the last rank, the slowest stage's own compute (the
quantity start-up profiling records), carried forward with the intermediate tensors;
an untimed step must add nothing to what is sent and no device synchronisation.
"""

from __future__ import annotations

import pytest
from cpp_engine.pp_timing_worker import STEPS
from rank_processes import run_ranks

WORLD = 3
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def pp_runs(tmp_path_factory):
    return run_ranks("cpp_engine.pp_timing_worker", WORLD, tmp_path_factory.mktemp("cpp_pp_timing"), TIMEOUT_S)


def test_timed_steps_report_the_slowest_stage(pp_runs):
    last = pp_runs[-1]["steps"]
    reported = [step["execution_time_ms"] for step in last]
    expected = [max(costs) if marked else None for marked, costs in STEPS]
    assert reported == [pytest.approx(e) if e is not None else None for e in expected]


def test_the_model_never_sees_the_carried_time(pp_runs):
    for result in pp_runs[1:]:
        assert all(step["model_input_keys"] == ["hidden_states"] for step in result["steps"])


def test_untimed_steps_send_nothing_extra_and_never_synchronise(pp_runs):
    for rank, result in enumerate(pp_runs):
        for (marked, _), step in zip(STEPS, result["steps"], strict=True):
            assert step["syncs"] == (2 if marked else 0)
            if rank < WORLD - 1:
                extra = {"cpp_slowest_stage_ms"} if marked else set()
                assert set(step["sent_keys"]) == {"hidden_states"} | extra
