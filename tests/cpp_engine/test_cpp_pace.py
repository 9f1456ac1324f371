"""``target_tpot_ms`` on a real vLLM 0.23.0 scheduler: decodes keep the pace the user asked for."""

from __future__ import annotations

import sys
from unittest import mock

import helpers
import pytest
from test_scheduler_profiling_chunk import (
    STAGE_1,
    FakeExecutor,
    ProfilingChunkScheduler,
    batch_pairs,
    cached_scheduler,
    cpp_scheduler,
    request,
    timing_from,
)
from vllm_ascend.core import cpp_policy

STAGES = 2  # the test schedulers' pipeline


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A profile saved once for this module's schedulers (``cached_scheduler`` adopts it)."""
    tmp_path = tmp_path_factory.mktemp("cpp-pace")
    executor = FakeExecutor()
    return tmp_path, executor, cpp_scheduler(tmp_path, executor)


def test_every_step_while_requests_decode_keeps_within_the_targets_share_and_all_finish(tmp_path, profiled):
    target_ms = 4 * STAGES * 4.0  # a round of P steps of about 16 ms each
    scheduler = cached_scheduler(tmp_path, profiled, target_tpot_ms=target_ms)
    model = scheduler.cpp_rule.model
    arrivals = [(0, request(f"chat-{i}", 40 + 10 * i, 40, start=5000 + 100 * i)) for i in range(3)]
    arrivals += [(4, request("long", 6000, 2, start=9000))]
    history_of: dict[str, int] = {}
    timing = timing_from(STAGE_1)
    bound_ms = target_ms / STAGES
    paced, over = [], []

    def on_step(scheduler, scheduler_output):
        pairs = batch_pairs(scheduler_output, history_of)
        prefill = {rid: chunk for rid, (chunk, _) in pairs.items() if chunk > 1}
        if prefill and len(pairs) > len(prefill):  # a prefill beside decodes
            paced.append(scheduler_output)
            if model.batch_time_ms(pairs.values()) > scheduler.cpp_policy.budget.decode_bound_ms * (1 + 1e-9):
                over.append(prefill)
        return timing(scheduler, scheduler_output)

    generated: dict[str, int] = {}
    helpers.run_to_completion(scheduler, arrivals, on_step=on_step, generated=generated)
    assert generated == {r.request_id: r.max_tokens for _, r in arrivals}
    assert len(paced) >= 4, "the long prompt ran beside decodes"
    assert scheduler.cpp_rule.limits.decode_step_ms == bound_ms
    # Over the bound only where the prefill took its floor (min_chunk) or its whole short tail.
    assert all(chunk <= 64 or chunk == 6000 % 64 for step in over for chunk in step.values()), over


def test_a_target_below_a_decode_only_round_warns_once_naming_the_floor_and_runs_at_it(tmp_path, profiled):
    module = sys.modules[ProfilingChunkScheduler.__module__]
    with mock.patch.object(module, "logger") as log, mock.patch.object(cpp_policy, "logger") as policy_log:
        scheduler = cached_scheduler(tmp_path, profiled, target_tpot_ms=0.01)
    floor_ms = scheduler.cpp_rule.model.time_ms(1, 0)
    ((message, *values),) = [call.args for call in policy_log.warning.call_args_list]
    line = message % tuple(values)
    assert "target_tpot_ms=0.01 is below what decodes alone reach" in line
    assert f"{STAGES * floor_ms:.2f} ms" in line and "min_chunk tokens once a round" in line
    assert scheduler.cpp_rule.limits.decode_step_ms == floor_ms
    assert not log.warning.called
    ((info, *info_values),) = [call.args for call in log.info.call_args_list]
    assert f"steps of at most {floor_ms:.2f} ms (target_tpot_ms)" in info % tuple(info_values)
    arrivals = [(0, request("chat", 50, 20, start=5000)), (2, request("long", 3000, 2, start=9000))]
    generated: dict[str, int] = {}
    helpers.run_to_completion(scheduler, arrivals, generated=generated)
    assert generated == {"chat": 20, "long": 2}  # at the floor, the prompt still advances


def test_without_a_target_nothing_is_bounded_for_the_decodes(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled)
    assert scheduler.cpp_rule.limits.decode_step_ms is None
    assert scheduler.cpp_policy.budget.decode_bound_ms is None
