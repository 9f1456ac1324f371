"""ChunkRule and StepBudget: the chunk for a time and the per-step budget, as properties in the scheduler's words.

Rules are drawn over measured tables of many shapes (quadratics of any mix, bent and
tiled surfaces) and over vLLM's settings.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpp_samples import BENT, NPU_LIKE, TRUE, Tiles, measured_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rule_cases import draw_position, requests, rules
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule, whole_tokens
from vllm_ascend.core.cpp_step_budget import PASS_OVER, PASS_OVER_LIMIT, StepBudget

PROPERTIES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=262_144)


def floor_forces_more(rule, history_tokens, plan):
    """The floor chunk alone is over the target: the rule grants it anyway (progress beats the target)."""
    return rule.model.time_ms(rule.limits.floor_tokens, history_tokens) > plan.target_ms


# ---------------------------------------------------------------- one request's chunk
@PROPERTIES
@given(requests(granule=True))
def test_chunks_stay_within_the_token_budget_and_the_context(request_case):
    rule, history_tokens, remaining_tokens, plan = request_case
    chunk_tokens = rule.wanted_chunk(history_tokens, remaining_tokens, plan)
    assert 0 < chunk_tokens <= min(remaining_tokens, rule.limits.base_chunk_tokens)
    assert history_tokens + chunk_tokens <= rule.limits.max_model_len


@PROPERTIES
@given(requests(granule=True))
def test_chunks_are_whole_multiples_of_the_granule_but_for_tails_floors_and_context(request_case):
    rule, history_tokens, remaining_tokens, plan = request_case
    chunk_tokens = rule.wanted_chunk(history_tokens, remaining_tokens, plan)
    granule = rule.limits.granule_tokens
    exceptions = {remaining_tokens, rule.limits.floor_tokens, rule.limits.max_model_len - history_tokens}
    assert chunk_tokens % granule == 0 or chunk_tokens in exceptions or chunk_tokens < granule


@PROPERTIES
@given(requests(smooth_factor=1.0), st.floats(0.25, 4.0))
def test_a_chunk_is_never_larger_than_the_efficient_one_unless_tail_or_floor(request_case, share):
    """Beyond C*(H) every token costs more: the rule never goes there (targets around C*'s own time)."""
    rule, history_tokens, remaining_tokens, plan = request_case
    efficient_tokens = plan.efficient.at(history_tokens)
    plan = rule.plan(rule.model.time_ms(share * efficient_tokens, history_tokens))
    chunk_tokens = rule.wanted_chunk(history_tokens, remaining_tokens, plan)
    assert chunk_tokens == remaining_tokens or chunk_tokens <= max(
        whole_tokens(efficient_tokens), rule.limits.floor_tokens
    )


@PROPERTIES
@given(requests(smooth_factor=1.0), st.floats(0.05, 1.0))
def test_smoothing_only_moves_chunks_towards_the_token_budget(request_case, smooth_factor):
    rule, history_tokens, remaining_tokens, plan = request_case
    sharp = rule.wanted_chunk(history_tokens, remaining_tokens, plan)
    smooth = rule.with_limits(smooth_factor=smooth_factor).wanted_chunk(history_tokens, remaining_tokens, plan)
    assert sharp <= smooth <= max(sharp, rule.limits.base_chunk_tokens)


@PROPERTIES
@given(requests(), st.floats(0.0, 3.0))
def test_chunk_within_is_the_largest_chunk_that_fits_a_budget(request_case, budget_share):
    rule, history_tokens, remaining_tokens, plan = request_case
    budget_ms = budget_share * plan.target_ms
    chunk_tokens = rule.chunk_within(history_tokens, budget_ms, remaining_tokens)
    limit = min(remaining_tokens, rule.limits.base_chunk_tokens, rule.limits.max_model_len - history_tokens)
    assert 0 <= chunk_tokens <= limit
    if chunk_tokens > 0:
        assert rule.model.request_ms(chunk_tokens, history_tokens) <= budget_ms * (1 + 1e-9) + 1e-12
    bigger = chunk_tokens + 1
    if bigger <= limit and budget_ms > 0:
        assert rule.model.request_ms(bigger, history_tokens) > budget_ms * (1 - 1e-9)


@PROPERTIES
@given(requests(granule=True), st.data())
def test_the_planners_chunks_are_the_step_budgets_chunks(request_case, data):
    """One rule, two forms: ``chunk_alone_many`` (the planner's) equals ``chunk_alone`` (the step's)."""
    rule, _, _, plan = request_case
    histories = np.array(data.draw(st.lists(st.integers(0, rule.limits.max_model_len), min_size=1, max_size=20)))
    fixed_ms = plan.fixed_ms * data.draw(st.sampled_from([1.0, 1.5]))
    many = rule.chunk_alone_many(histories.astype(np.float64), np.float64(plan.target_ms), fixed_ms, plan.efficient)
    assert many.tolist() == [float(rule.chunk_alone(int(h), plan, fixed_ms)) for h in histories]


def test_efficient_chunks_never_fall_with_history_and_follow_a_quadratic():
    """On a quadratic, C*(H) = sqrt((c0 + c2*H) / (c3 - c4/2)), at the resolution of the sizes searched."""
    model = measured_model(TRUE, noise=0.0)
    curve = ChunkRule(model, LIMITS, 4).efficient_chunks()
    assert list(curve.chunk_tokens) == sorted(curve.chunk_tokens)
    for history in (0, 20_000, 60_000):
        analytic = np.sqrt((TRUE.c0 + TRUE.c2 * history) / (TRUE.c3 - TRUE.c4 / 2))
        assert curve.at(history) == pytest.approx(analytic, rel=0.2)


def test_efficient_chunks_follow_a_bend_not_a_formula():
    """Flat, then climbing time per token: C* sits at the bend, where no quadratic would put it."""
    model = measured_model(BENT, noise=0.0, base_chunk_tokens=8192, max_history_tokens=0)
    curve = ChunkRule(model, ChunkLimits(8192, 8192), 4).efficient_chunks()
    assert 0.5 * BENT.knee_tokens <= curve.at(0) <= 1.5 * BENT.knee_tokens


def test_a_granule_puts_efficient_chunks_on_tile_boundaries():
    model = measured_model(Tiles(256), noise=0.0)
    curve = ChunkRule(model, ChunkLimits(8192, 262_144, granule_tokens=256), 4).efficient_chunks()
    assert all(c % 256 == 0 for c in curve.chunk_tokens)


@PROPERTIES
@given(st.data())
def test_every_chunk_of_a_whole_prefill_keeps_to_the_rule(data):
    """A prompt alone in its batches, step after step: chunks within the target, then its tail."""
    rule, _, _, plan = data.draw(requests(smooth_factor=1.0, tail_tolerance=0.0))
    prompt_tokens = data.draw(st.integers(1, min(rule.limits.max_model_len, 200_000)))
    history_tokens, chunks = 0, []
    while history_tokens < prompt_tokens and len(chunks) < 2000:
        chunk_tokens = StepBudget(rule, plan).grant(history_tokens, prompt_tokens - history_tokens, 10**9)
        assert chunk_tokens > 0
        if not floor_forces_more(rule, history_tokens, plan):
            assert rule.model.time_ms(chunk_tokens, history_tokens) <= plan.target_ms * (1 + 1e-9)
        chunks.append(chunk_tokens)
        history_tokens += chunk_tokens
    assert sum(chunks) == history_tokens


# ---------------------------------------------------------------- one step's budget
@st.composite
def steps(draw, **rule_options):
    """A rule, a plan, running decodes (new_tokens, history) and prefills (history, remaining, allowed)."""
    rule, _, _, plan = draw(requests(**rule_options))
    max_model_len = rule.limits.max_model_len
    decodes = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(0, max_model_len - 1)), max_size=12))
    prefills = []
    for _ in range(draw(st.integers(1, 5))):
        history_tokens, remaining_tokens = draw_position(draw, max_model_len)
        allowed_tokens = draw(st.integers(0, 2 * rule.limits.base_chunk_tokens))
        prefills.append((history_tokens, remaining_tokens, allowed_tokens))
    return rule, plan, decodes, prefills


def run_step(rule, plan, decodes, prefills):
    """What the scheduler does in one step: reserve decodes, then grant and charge each prefill in order."""
    budget = StepBudget(rule, plan)
    budget.reserve_decodes((f"decode-{index}", n, h) for index, (n, h) in enumerate(decodes))
    granted = []
    for index, (history_tokens, remaining_tokens, allowed_tokens) in enumerate(prefills):
        used_before_ms = budget.used_ms
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, allowed_tokens)
        if chunk_tokens > 0:
            budget.charge(f"prefill-{index}", chunk_tokens, history_tokens)
        granted.append((chunk_tokens, used_before_ms, budget.used_ms))
    for index, (new_tokens, history_tokens) in enumerate(decodes):
        budget.charge(f"decode-{index}", new_tokens, history_tokens)
    return budget, granted


@PROPERTIES
@given(steps())
def test_a_grant_never_exceeds_what_vllm_allows_nor_the_context(step):
    rule, plan, decodes, prefills = step
    _, granted = run_step(rule, plan, decodes, prefills)
    for (chunk_tokens, _, _), (history_tokens, remaining_tokens, allowed_tokens) in zip(granted, prefills, strict=True):
        assert 0 <= chunk_tokens <= min(allowed_tokens, remaining_tokens, rule.limits.base_chunk_tokens)
        assert history_tokens + chunk_tokens <= rule.limits.max_model_len


@PROPERTIES
@given(steps(smooth_factor=1.0, tail_tolerance=0.0))
def test_prefills_keep_the_batch_within_the_target_unless_the_floor_forces_the_first_one(step):
    rule, plan, decodes, prefills = step
    _, granted = run_step(rule, plan, decodes, prefills)
    first = True
    for chunk_tokens, used_before_ms, used_after_ms in granted:
        if chunk_tokens == 0:
            continue
        if used_after_ms > plan.target_ms * (1 + 1e-9):
            assert first and chunk_tokens <= rule.limits.floor_tokens, (chunk_tokens, used_before_ms, used_after_ms)
        first = False


@PROPERTIES
@given(steps())
def test_the_steps_first_prefill_advances_by_at_least_the_floor_even_behind_decodes(step):
    rule, plan, decodes, prefills = step
    _, granted = run_step(rule, plan, decodes, prefills)
    history_tokens, remaining_tokens, allowed_tokens = prefills[0]
    context_tokens = whole_tokens(rule.limits.max_model_len - history_tokens)
    least = min(rule.limits.floor_tokens, remaining_tokens, allowed_tokens, rule.limits.cap_tokens, context_tokens)
    assert granted[0][0] >= least


@PROPERTIES
@given(steps())
def test_reserved_decodes_are_never_cut_and_the_step_time_is_the_models(step):
    """Every decode is in the batch whole; the budget's time is the model's time of exactly that batch."""
    rule, plan, decodes, prefills = step
    budget, granted = run_step(rule, plan, decodes, prefills)
    decodes_ms = sum(rule.model.request_ms(new_tokens, history_tokens) for new_tokens, history_tokens in decodes)
    assert granted[0][1] == pytest.approx(rule.model.fixed_ms + decodes_ms, rel=1e-9)  # booked before any prefill
    pairs = budget.pairs()
    assert list(pairs[: len(decodes)]) == decodes
    assert budget.predicted_ms() == pytest.approx(rule.model.batch_time_ms(pairs), rel=1e-9)
    assert budget.used_ms == pytest.approx(budget.predicted_ms(), rel=1e-9)


@PROPERTIES
@given(steps(), st.data())
def test_charge_then_refund_returns_the_step_time_to_where_it_was(step, data):
    """A request preempted within the step leaves nothing of its cost behind (a decode: nor of its reservation)."""
    rule, plan, decodes, prefills = step
    budget = StepBudget(rule, plan)
    for index, (new_tokens, history_tokens) in enumerate(decodes):
        before_ms = budget.used_ms
        budget.reserve_decodes([(f"decode-{index}", new_tokens, history_tokens)])
        charged_tokens = data.draw(st.sampled_from([new_tokens, new_tokens + 1]))  # a spec token more or not
        budget.charge(f"decode-{index}", charged_tokens, history_tokens)
        if data.draw(st.booleans()):
            budget.refund(f"decode-{index}")
            assert budget.used_ms == pytest.approx(before_ms, rel=1e-9, abs=1e-9 * before_ms)
    for index, (history_tokens, remaining_tokens, allowed_tokens) in enumerate(prefills):
        before_ms = budget.used_ms
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, allowed_tokens)
        budget.charge(f"prefill-{index}", chunk_tokens, history_tokens)
        if data.draw(st.booleans()):
            budget.refund(f"prefill-{index}")
            assert budget.used_ms == pytest.approx(before_ms, rel=1e-9, abs=1e-9 * before_ms)
    assert budget.used_ms == pytest.approx(rule.model.batch_time_ms(budget.pairs()), rel=1e-9)
    assert budget.charged_tokens == sum(chunk for chunk, _ in budget.pairs())


@PROPERTIES
@given(steps(), st.data())
def test_settling_keeps_exactly_the_scheduled_requests(step, data):
    """Decodes reserved but never scheduled (preempted before their turn) leave the step's time at settle."""
    rule, plan, decodes, prefills = step
    budget, _ = run_step(rule, plan, decodes, prefills)
    everything = dict(budget.charged)
    scheduled = {r: everything[r][0] for r in everything if data.draw(st.booleans(), label=r)}
    budget.settle(scheduled)
    assert set(budget.charged) == set(scheduled)
    assert budget.charged_tokens == sum(scheduled.values())
    assert budget.used_ms == pytest.approx(rule.model.batch_time_ms(budget.pairs()), rel=1e-9, abs=1e-12)
    assert budget.predicted_ms() == pytest.approx(budget.used_ms, rel=1e-9, abs=1e-12)


def test_a_refunded_first_prefill_lets_the_next_one_be_first():
    model = measured_model(NPU_LIKE, noise=0.0, max_history_tokens=900_000)
    rule = ChunkRule(model, ChunkLimits(base_chunk_tokens=8192, max_model_len=10**6, min_chunk_tokens=512), 4)
    budget = StepBudget(rule, rule.plan(model.time_ms(1, 900_000) * 1.001))
    budget.reserve_decodes([("decode", 1, 900_000)])  # the decode alone fills the target
    budget.charge("decode", 1, 900_000)
    assert budget.grant(0, 100_000, 8192) == 512  # the first prefill: the floor
    budget.charge("first", 512, 0)
    assert budget.grant(0, 100_000, 8192) == 0  # the second: nothing left
    budget.refund("first")
    assert budget.grant(0, 100_000, 8192) == 512  # preempted first: the next prefill is now the first


def test_a_plans_token_budget_bounds_the_prefill_tokens_of_every_batch():
    """While requests decode the plan carries the tuned fixed chunk as a token budget, as that
    chunk's batches have: prefills share it, a refund gives tokens back, decodes do not count."""
    from dataclasses import replace

    model = measured_model(TRUE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 4)
    plan = replace(rule.plan(model.time_ms(8192, 0)), batch_tokens=1000)
    budget = StepBudget(rule, plan)
    budget.reserve_decodes([("decode", 1, 5000)])
    budget.charge("decode", 1, 5000)
    first = budget.grant(0, 50_000, 8192)
    assert first == 1000  # the whole budget, though the target has room for more
    budget.charge("first", 600, 0)  # vLLM scheduled less (e.g. its own budget)
    assert budget.grant(0, 40_000, 8192) == 400  # (each prompt shorter than the ones before it: see below)
    budget.charge("second", 400, 0)
    assert budget.grant(0, 30_000, 8192) == 0
    budget.charge("first", 300, 0)  # charged again with fewer tokens
    assert budget.grant(0, 20_000, 8192) == 300
    budget.refund("second")
    assert budget.grant(0, 10_000, 8192) == 700
    assert rule.wanted_chunk(0, 50_000, plan) > 1000  # (the rule alone would take more)


@PROPERTIES
@given(steps())
def test_a_prefill_the_step_does_not_finish_joins_only_ahead_of_longer_ones(step):
    """Shortest remaining first: a prefill that gets tokens but does not finish in the step has
    fewer tokens left than every unfinished prefill granted before it; finishing ones may always join."""
    rule, plan, decodes, prefills = step
    _, granted = run_step(rule, plan, decodes, prefills)
    unfinished = []
    for (chunk_tokens, _, _), (_, remaining_tokens, _) in zip(granted, prefills, strict=True):
        if 0 < chunk_tokens < remaining_tokens:
            assert all(remaining_tokens < earlier for earlier in unfinished), (remaining_tokens, unfinished)
            unfinished.append(remaining_tokens)


def test_two_long_prompts_run_one_after_the_other_and_a_short_one_joins_them():
    """A batch with room for two chunks: the second long prompt gets none of it while the first
    goes on (it would halve the first one's pace), a shorter one does; a waiting one kept out is
    passed over, up to PASS_OVER_LIMIT per step, after which admission stops."""
    model = measured_model(TRUE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 2)
    budget = StepBudget(rule, rule.plan(3 * model.time_ms(1000, 0)))
    budget.start()
    assert budget.grant(0, 50_000, 1000) == 1000  # vLLM allows 1000: the target has room for more
    budget.charge("first", 1000, 0)
    assert budget.grant(0, 60_000, 8192) == 0  # longer: waits for the first
    assert budget.grant(0, 50_000, 8192) == 0  # as long: waits too (first come, first served)
    second = budget.grant(0, 20_000, 1000)
    assert second == 1000  # shorter: joins
    budget.charge("second", second, 0)
    assert budget.grant(0, 30_000, 8192) == 0  # longer than the second
    assert budget.grant(0, 100, 8192) == 100  # finishes in this batch: joins
    budget.charge("short", 100, 0)
    assert [budget.admit(0, 40_000, 8192) for _ in range(PASS_OVER_LIMIT + 1)] == [PASS_OVER] * PASS_OVER_LIMIT + [0]
    budget.start()
    assert budget.grant(0, 60_000, 1000) == 1000  # a new step: the first prefill sets the order again
    assert budget.admit(0, 70_000, 8192) == PASS_OVER


def run_allotted_step(rule, plan, decodes, prefills, waited_s, started):
    """As ``run_step``, with the prefills allotted at step start (as the scheduler does), then visited in order."""
    budget = StepBudget(rule, plan)
    budget.reserve_decodes((f"decode-{index}", n, h) for index, (n, h) in enumerate(decodes))
    budget.allot(
        [(f"prefill-{i}", h, r, waited_s[i], started[i]) for i, (h, r, _) in enumerate(prefills)],
    )
    granted = []
    for index, (history_tokens, remaining_tokens, allowed_tokens) in enumerate(prefills):
        chunk_tokens = budget.grant(history_tokens, remaining_tokens, allowed_tokens, f"prefill-{index}")
        if chunk_tokens > 0:
            budget.charge(f"prefill-{index}", chunk_tokens, history_tokens)
        granted.append(chunk_tokens)
    return budget, granted


@PROPERTIES
@given(steps(), st.data())
def test_an_allotted_step_leaves_at_most_one_prefill_unfinished_and_fits_the_target(step, data):
    """Allotted in response-ratio order, whatever order vLLM visits them in: every prefill that
    gets tokens finishes in the batch but one, and the batch keeps to the target as granting does."""
    rule, plan, decodes, prefills = step
    waited_s = [data.draw(st.floats(0.0, 1e4), label=f"waited-{i}") for i in range(len(prefills))]
    started = [data.draw(st.booleans(), label=f"started-{i}") for i in range(len(prefills))]
    budget, granted = run_allotted_step(rule, plan, decodes, prefills, waited_s, started)
    allotted = [budget.allotted.get(f"prefill-{i}", 0) for i in range(len(prefills))] if len(prefills) > 1 else granted
    assert sum(0 < a < remaining for a, (_, remaining, _) in zip(allotted, prefills, strict=True)) <= 1
    for chunk_tokens, limit, (_, remaining_tokens, allowed_tokens) in zip(granted, allotted, prefills, strict=True):
        assert 0 <= chunk_tokens <= min(allowed_tokens, remaining_tokens, limit, rule.limits.base_chunk_tokens)
    if budget.prefills and budget.charged_ms > 0:  # a batch of more than the first prefill's floor keeps to T
        first_floor_ms = max(
            rule.model.request_ms(min(c, rule.limits.floor_tokens), h)
            for c, (h, _, _) in zip(granted, prefills, strict=True)
        )
        reserved_ms = rule.model.fixed_ms + sum(rule.model.request_ms(n, h) for n, h in decodes)
        tail_ms = plan.target_ms * (1.0 + rule.limits.tail_tolerance)
        assert budget.used_ms <= max(tail_ms, reserved_ms + first_floor_ms) * (1 + 1e-9) + 1e-9


def test_a_short_prompt_waiting_behind_a_long_one_is_sized_first():
    """vLLM visits the older long prompt first; allotted, the short one behind it takes the tokens it
    finishes with and the long one what is left, not the other way round (nothing, or a crumb a step,
    for the short one)."""
    model = measured_model(TRUE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 2)
    plan = rule.plan(model.time_ms(2000, 20_000))
    wanted = rule.wanted_chunk(20_000, 30_000, plan)
    visited = StepBudget(rule, plan)  # granted as visited: the long one fills the batch
    assert visited.grant(20_000, 30_000, 8192) == wanted
    visited.charge("long", wanted, 20_000)
    assert visited.grant(0, 400, 8192) < 400
    budget = StepBudget(rule, plan)
    budget.allot([("long", 20_000, 30_000, 5.0, False), ("short", 0, 400, 0.1, False)])
    long_chunk = budget.grant(20_000, 30_000, 8192, "long")
    budget.charge("long", long_chunk, 20_000)
    assert budget.grant(0, 400, 8192, "short") == 400
    budget.charge("short", 400, 0)
    assert 0 < long_chunk < wanted
    assert budget.used_ms <= plan.target_ms * (1 + 1e-9)


def test_a_started_prefill_runs_on_before_a_new_short_one():
    """Highest response ratio next does not preempt: a long prompt that has started keeps its chunk,
    and a short one that comes meanwhile gets tokens only where it finishes in what is left (else it
    would decode beside every chunk of the long one), then waits for the long one's end."""
    model = measured_model(TRUE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 2)
    plan = rule.plan(model.time_ms(2000, 20_000))
    wanted = rule.wanted_chunk(20_000, 30_000, plan)
    budget = StepBudget(rule, plan)
    budget.allot([("short", 0, 400, 0.1, False), ("long", 20_000, 30_000, 0.0, True)])
    assert budget.allotted == {"long": wanted, "short": 0}
    assert budget.admit(0, 400, 8192, "short") == PASS_OVER  # keeps its place ahead of later arrivals
    fits = StepBudget(rule, plan)  # a shorter started one leaves room: the new one finishes beside it
    fits.allot([("short", 0, 40, 0.1, False), ("started", 1000, 500, 0.0, True)])
    assert fits.allotted == {"started": 500, "short": 40}


def test_a_long_prompt_that_waited_as_long_as_its_work_goes_before_a_new_short_one():
    """The response ratio: (waited + work) / work. A long prompt waited long goes first; a short one
    that has just come waits for the next step, then wins as it waits (no long prompt starves)."""
    model = measured_model(TRUE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 2)
    plan = rule.plan(model.time_ms(1000, 0))
    tokens_per_s = 1000.0 * LIMITS.cap_tokens / model.time_ms(LIMITS.cap_tokens, 0)
    work_s = 20_000 / tokens_per_s
    budget = StepBudget(rule, plan)
    budget.allot([("short", 0, 2000, 0.0, False), ("long", 0, 20_000, 2 * work_s, False)])
    assert budget.allotted["long"] > 0 and budget.allotted["short"] == 0
    assert budget.admit(0, 2000, 8192, "short") == PASS_OVER  # passed over, keeps its place
    budget.start()  # both still waiting (the long one's 1000 tokens a prefix-cache hit)
    budget.allot([("short", 0, 2000, 0.5 * work_s, False), ("long", 1000, 19_000, 2.5 * work_s, False)])
    assert budget.allotted["short"] > 0


@settings(max_examples=30, deadline=None)
@given(rules(granule=True))
def test_a_rule_of_any_table_answers_in_range_and_finite(rule):
    histories = np.linspace(0, rule.limits.max_model_len, 7)
    curve = rule.efficient_chunks()
    assert all(rule.limits.floor_tokens <= c <= rule.limits.cap_tokens for c in curve.chunk_tokens)
    assert np.all(np.isfinite(rule.model.time_ms_many(np.full(7, 64.0), histories)))


def test_many_speculative_decodes_are_reserved_at_the_models_own_costs():
    """From 16 decodes the reservation prices them in one vectorised call, speculative tokens included: each
    decode's cost is what ``request_ms`` gives it, so the step's predicted time is the scalar sum's."""
    model = measured_model(NPU_LIKE, noise=0.0, max_history_tokens=200_000)
    rule = ChunkRule(model, LIMITS, 4)
    decodes = [(1 + index % 4, 1000 + 997 * index) for index in range(40)]  # 1-4 tokens each
    budget = StepBudget(rule, rule.plan(model.time_ms(4096, 0)))
    budget.reserve_decodes((f"d{index}", n, h) for index, (n, h) in enumerate(decodes))
    costs = budget.reserved.costs
    assert costs.tolist() == pytest.approx([model.request_ms(n, h) for n, h in decodes], rel=1e-12)
    assert budget.reserved.tokens == sum(n for n, _ in decodes) and not budget.reserved.unit
