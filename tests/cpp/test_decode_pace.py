"""A TPOT target (``target_tpot_ms``): the step budget keeps every step within its share while requests decode."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from cpp_samples import TRUE, measured_model
from vllm_ascend.core import cpp_policy
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_planner import decodes_wait_ms, plan_target
from vllm_ascend.core.cpp_policy import CppPolicy
from vllm_ascend.core.cpp_step_budget import StepBudget

LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072, min_chunk_tokens=64)
STAGES = 4


@pytest.fixture(scope="module")
def model():
    return measured_model(TRUE, noise=0.0, max_history_tokens=LIMITS.max_model_len)


def paced_budget(model, bound_ms: float | None) -> StepBudget:
    rule = ChunkRule(model, ChunkLimits(**{**LIMITS.__dict__, "decode_step_ms": bound_ms}), STAGES)
    budget = StepBudget(rule, rule.plan(model.time_ms(8192, 0)))
    budget.floor_every = STAGES
    return budget


def test_while_requests_decode_the_plan_in_force_is_within_the_bound_and_the_planned_one_otherwise(model):
    planned_ms = model.time_ms(8192, 0)
    bound_ms = planned_ms / 4
    budget = paced_budget(model, bound_ms)
    budget.start()
    budget.decoding(True)
    assert budget.target_ms == bound_ms and budget.paced
    budget.start()
    budget.decoding(False)
    assert budget.target_ms == planned_ms and not budget.paced
    free = paced_budget(model, None)
    free.start()
    free.decoding(True)
    assert free.target_ms == planned_ms and not free.paced  # no target: nothing owed to the decodes


def test_a_prefill_beside_decodes_is_cut_to_what_the_bound_leaves(model):
    bound_ms = model.time_ms(2048, 0)
    budget = paced_budget(model, bound_ms)
    budget.start()
    budget.decoding(True)
    budget.reserve_decodes([("d", 1, 4000)])
    chunk = budget.grant(0, 60_000, 8192, "long")
    budget.charge("long", chunk, 0)
    assert 64 < chunk < 2048
    assert budget.predicted_ms() <= bound_ms * (1 + 1e-9)


def test_the_bound_follows_the_measured_pace(model):
    budget = paced_budget(model, 10.0)
    budget.pace(0.9)  # steps measured 1/0.9 slower than predicted: 10 ms of predicted time is too much
    assert budget.decode_bound_ms == pytest.approx(9.0)
    budget.pace(0.902)  # under PACE_STEP: the bound (and its plan) stays as it is
    assert budget.decode_bound_ms == pytest.approx(9.0)
    budget.start()
    budget.decoding(True)
    assert budget.target_ms == pytest.approx(9.0)


def floors_given(model, bound_ms: float | None, steps: int) -> list[int]:
    """The first prefill's chunk step after step, with a decode at a history deep enough to fill any bound."""
    budget = paced_budget(model, bound_ms)
    chunks = []
    for _ in range(steps):
        budget.start()
        budget.decoding(True)
        budget.reserve_decodes([("d", 1, 10**9)])
        chunk = budget.grant(0, 60_000, 8192, "long")
        if chunk:
            budget.charge("long", chunk, 0)
        budget.settle({"d", "long"} if chunk else {"d"})
        chunks.append(chunk)
    return chunks


def test_when_decodes_fill_the_bound_a_prefill_still_advances_by_the_floor_once_a_pipeline_round(model):
    assert floors_given(model, 1.0, 12) == [64, 0, 0, 0] * 3
    assert floors_given(model, None, 4) == [64] * 4  # without a target, every step (as before)


def policy_with_target(model, bound_ms):
    rule_limits = ChunkLimits(**{**LIMITS.__dict__, "decode_step_ms": bound_ms})
    return CppPolicy(model, rule_limits, STAGES, asynchronous=False, calibration_window=32)


def finish_timed(policy, paced: bool, measured_over_predicted: float) -> None:
    budget = policy.budget
    budget.start()
    budget.decoding(paced)
    budget.reserve_decodes([("d", 1, 2000)])
    budget.charge("p", 512, 4000)
    output = SimpleNamespace()
    policy.scheduled(output, timed=True)
    policy.finished(output, budget.predicted_ms() * measured_over_predicted)


def test_timed_steps_within_the_bound_keep_it_in_measured_time_and_others_do_not_move_it(model):
    policy = policy_with_target(model, 20.0)
    policy.calibration.refit_every = 10**9  # the pace alone (its ratios are to whatever model predicts)
    for _ in range(cpp_policy.PACE_MIN_STEPS + 2):
        finish_timed(policy, paced=False, measured_over_predicted=2.0)  # steps with no decode: not the pace
    assert policy.budget.decode_bound_ms == pytest.approx(20.0)
    for _ in range(cpp_policy.PACE_MIN_STEPS):
        finish_timed(policy, paced=True, measured_over_predicted=1.1)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / 1.1)
    for _ in range(20):  # however slow the device, the pace moves the bound by at most MAX_PACE_FACTOR
        finish_timed(policy, paced=True, measured_over_predicted=10.0)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / cpp_policy.MAX_PACE_FACTOR)


def test_stalls_do_not_set_the_bound_for_the_steps_they_stay_in_the_window_until_they_are_the_device(model):
    """A step over MAX_PACE_FACTOR times its prediction (a host hiccup, an operator compiled for a new shape)
    is beyond what the pace can make up: while such steps are a minority they are left out."""
    policy = policy_with_target(model, 20.0)
    policy.calibration.refit_every = 10**9
    for ratio in (1.0, 10.0, 10.0, 1.0, 1.0, 1.0, 1.1):  # two 10x stalls among seven steps
        finish_timed(policy, paced=True, measured_over_predicted=ratio)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / 1.1)
    for _ in range(2):  # four of nine: still a minority
        finish_timed(policy, paced=True, measured_over_predicted=10.0)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / 1.1)
    finish_timed(policy, paced=True, measured_over_predicted=3.0)  # five of ten: the device is that slow
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / cpp_policy.MAX_PACE_FACTOR)


def test_a_corrected_model_keeps_the_pace_its_correction_does_not_explain(model, monkeypatch):
    """The paced steps' errors move by what the adopted model predicts otherwise: no reset to the user's
    bound while the model is still short of the device, no double count once it is not."""
    policy = policy_with_target(model, 20.0)
    policy.calibration.refit_every = 10**9
    for _ in range(cpp_policy.PACE_MIN_STEPS):
        finish_timed(policy, paced=True, measured_over_predicted=1.6)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / 1.6)
    slower = dataclasses.replace(model, step_ms=tuple(tuple(1.25 * t for t in row) for row in model.step_ms))
    slower = dataclasses.replace(slower, fixed_ms=1.25 * model.fixed_ms)
    monkeypatch.setattr(policy.calibration, "record", lambda pairs, measured_ms: slower)
    finish_timed(policy, paced=False, measured_over_predicted=1.0)  # a refit adopts a model 1.25x slower
    assert policy.rule.model is slower
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / (1.6 / 1.25), rel=1e-3)


# ---------------------------------------------------------------- no target: what the decodes pay
def test_a_decode_that_outlasts_the_prefills_waits_their_work_and_one_that_ends_first_waits_less():
    targets = np.array([10.0, 20.0, 40.0])
    work_ms = np.array([400.0, 320.0, 360.0])  # the prefills take 40, 16 and 9 batches
    fixed_ms = 5.0
    long_wait = decodes_wait_ms(targets, work_ms, fixed_ms, np.array([np.inf]), 4)
    assert long_wait == pytest.approx((work_ms / targets) * (targets - fixed_ms))
    short_wait = decodes_wait_ms(targets, work_ms, fixed_ms, np.array([2.0]), 4)  # 2 tokens: 8 steps at most
    assert short_wait == pytest.approx(8 * (targets - fixed_ms))
    assert np.argmin(short_wait) == 0  # it would have the shortest batches


def test_decodes_about_to_end_get_shorter_batches_than_ones_that_outlast_the_prompt(model):
    rule = ChunkRule(model, LIMITS, STAGES)
    held = [(0, 32_768)]
    fixed_ms = model.fixed_ms + 2.0
    outlast = plan_target(rule, held, fixed_ms=fixed_ms, decoding=8, decode_left=[10_000] * 8, steps_per_token=4)
    ending = plan_target(rule, held, fixed_ms=fixed_ms, decoding=8, decode_left=[2] * 8, steps_per_token=4)
    assert ending.target_ms < outlast.target_ms


def test_the_bound_leaves_room_for_the_steps_the_model_predicts_short_not_only_for_its_mean_error(model):
    """Decodes wait for every step as it runs: two steps in sixteen 20% slower than predicted set the bound."""
    policy = policy_with_target(model, 20.0)
    for ratio in [1.0] * 14 + [1.2] * 2:
        finish_timed(policy, paced=True, measured_over_predicted=ratio)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0 / 1.2)


def test_a_step_in_flight_when_a_correction_came_is_read_against_the_new_model(model, monkeypatch):
    """Under PP steps are in flight when a refit is adopted: one predicted by the old model and back after it
    is moved by what the new one predicts otherwise, so the correction is not counted twice."""
    policy = policy_with_target(model, 20.0)
    policy.calibration.refit_every = 10**9
    slower = dataclasses.replace(model, step_ms=tuple(tuple(1.6 * t for t in row) for row in model.step_ms))
    slower = dataclasses.replace(slower, fixed_ms=1.6 * model.fixed_ms)
    budget, outputs = policy.budget, []
    for _ in range(cpp_policy.PACE_MIN_STEPS + 2):  # a device 1.6x its profile: steps in flight, all paced
        budget.start()
        budget.decoding(True)
        budget.reserve_decodes([("d", 1, 2000)])
        budget.charge("p", 512, 4000)
        outputs.append((SimpleNamespace(), budget.predicted_ms() * 1.6))
        policy.scheduled(outputs[-1][0], timed=True)
    monkeypatch.setattr(policy.calibration, "record", lambda pairs, measured_ms: slower)  # the next back adopts it
    policy.finished(*outputs[0])
    monkeypatch.setattr(policy.calibration, "record", lambda pairs, measured_ms: None)
    for output, measured_ms in outputs[1:]:  # predicted by the profile, back under the corrected model
        policy.finished(output, measured_ms)
    assert policy.rule.model is slower
    assert policy.budget.decode_bound_ms == pytest.approx(20.0, rel=1e-3)


def test_a_device_faster_than_predicted_leaves_the_bound_as_the_user_set_it(model):
    """The measured pace only tightens the bound: steps at 0.8 of their predicted time leave it where it was."""
    policy = policy_with_target(model, 20.0)
    for _ in range(cpp_policy.PACE_MIN_STEPS):
        finish_timed(policy, paced=True, measured_over_predicted=0.8)
    assert policy.budget.decode_bound_ms == pytest.approx(20.0)
    for _ in range(cpp_policy.PACE_MIN_STEPS):
        finish_timed(policy, paced=True, measured_over_predicted=1.25)
    assert policy.budget.decode_bound_ms == pytest.approx(16.0)
