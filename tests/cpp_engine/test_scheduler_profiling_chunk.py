"""ProfilingChunkScheduler on a real vLLM 0.23.0 scheduler, profiled through a fake executor.

The fake executor answers ``collective_rpc("profile_prefill_latency", (C, H))`` from a
known latency surface per pipeline stage, so what the scheduler does can be checked
against what the surface says.
"""

from __future__ import annotations

import collections
import json
import random
import sys
from dataclasses import dataclass, field
from unittest import mock

import helpers
import pytest
from vllm_ascend import deployment
from vllm_ascend.core import cpp_held, cpp_policy, cpp_profile_store, cpp_profiling
from vllm_ascend.core.cpp_step_budget import StepBudget

ProfilingChunkScheduler = helpers.profiling_chunk_scheduler_class()
AsyncProfilingChunkScheduler = sys.modules[ProfilingChunkScheduler.__module__].AsyncProfilingChunkScheduler

BASE_CHUNK = 512
BLOCK_SIZE = 16
TAIL_TOLERANCE = 0.15


@dataclass
class Surface:
    """t(C, H) = c0 + c1*C + c2*H + c3*C^2 + c4*C*H ms: one pipeline stage."""

    c0: float = 2.0
    c1: float = 0.02
    c2: float = 1e-4
    c3: float = 1e-5
    c4: float = 1.5e-5

    def ms(self, chunk_tokens: float, history_tokens: float) -> float:
        return (
            self.c0
            + self.c1 * chunk_tokens
            + self.c2 * history_tokens
            + self.c3 * chunk_tokens**2
            + self.c4 * chunk_tokens * history_tokens
        )

    def batch_ms(self, pairs) -> float:
        return self.c0 + sum(self.ms(c, h) - self.c0 for c, h in pairs)


STAGE_0 = Surface()
STAGE_1 = Surface(c0=2.2, c1=0.022, c2=1.1e-4, c3=1.1e-5, c4=1.65e-5)  # the slower stage sets the pace


@dataclass
class FakeExecutor:
    stages: tuple = (STAGE_0, STAGE_1)
    fail_after: int | None = None
    calls: list = field(default_factory=list)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert method == "profile_prefill_latency"
        self.calls.append(args)
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            raise RuntimeError("worker 1 failed: NPU out of memory")
        chunk_tokens, history_tokens = args
        return [stage.ms(chunk_tokens, history_tokens) for stage in self.stages for _tp_rank in range(2)]


def cpp_scheduler(
    tmp_path,
    executor=None,
    *,
    cache_dir=None,
    model_dir=None,
    num_blocks=1024,
    async_scheduling=False,
    pipeline_parallel_size=2,
    base=BASE_CHUNK,
    max_model_len=8192,
    **cpp,
):
    """A profiled CPP scheduler; the model folder is part of the profile's fingerprint."""
    if model_dir is None:
        model_dir = cache_dir.parent / "model" if cache_dir is not None else tmp_path / "model"
    settings = {
        "enabled": True,
        "cache_dir": str(cache_dir or tmp_path / "cache"),
        "min_chunk": 64,
        "profile_points": 16,
        "profile_repeats": 2,
        "profile_history_points": 6,
        "tail_tolerance": TAIL_TOLERANCE,
        **cpp,
    }
    scheduler = helpers.make_scheduler(
        AsyncProfilingChunkScheduler if async_scheduling else ProfilingChunkScheduler,
        model_dir=model_dir,
        num_blocks=num_blocks,
        max_num_batched_tokens=base,
        max_num_seqs=16,
        max_model_len=max_model_len,
        block_size=BLOCK_SIZE,
        pipeline_parallel_size=pipeline_parallel_size,
        additional_config={"profiling_chunk_config": settings},
    )
    scheduler.run_profiling_chunk_init(executor if executor is not None else FakeExecutor())
    return scheduler


def request(rid, prompt_tokens, max_tokens, *, start=1):
    return helpers.make_request(rid, list(range(start, start + prompt_tokens)), max_tokens=max_tokens)


def timing_from(surface):
    """on_step for run_to_completion: a timed step measures the surface's time of the planned batch."""

    def on_step(scheduler, scheduler_output):
        plan = scheduler.planned_batch(scheduler_output)
        if plan is not None:  # the scheduler's prediction is the model's time of the batch
            assert plan.predicted_ms == pytest.approx(scheduler.cpp_rule.model.batch_time_ms(plan.pairs), rel=1e-9)
        if scheduler_output.cpp_time_step:
            return {"execution_time_ms": surface.batch_ms(plan.pairs)}
        return {}

    return on_step


def prefill_chunks(outputs, request_id):
    return [out.num_scheduled_tokens[request_id] for out in outputs if request_id in out.num_scheduled_tokens]


def batch_pairs(scheduler_output, history_of):
    """(chunk_tokens, history_tokens) of every request of a SchedulerOutput, from the output alone."""
    pairs = {}
    for new in scheduler_output.scheduled_new_reqs:
        pairs[new.req_id] = (scheduler_output.num_scheduled_tokens[new.req_id], new.num_computed_tokens)
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        pairs[req_id] = (scheduler_output.num_scheduled_tokens[req_id], computed)
    history_of.update({rid: h for rid, (_, h) in pairs.items()})
    return pairs


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cpp")
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor)
    return tmp_path, executor, scheduler


def cached_scheduler(tmp_path, profiled, **kwargs):
    """A scheduler that adopts the profile the module fixture saved (no profiling runs)."""
    return cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", **kwargs)


def test_profile_uses_the_slowest_stage_and_measures_history(profiled):
    _, executor, scheduler = profiled
    rule = scheduler.cpp_rule
    assert rule is not None and scheduler.uses_schedule_hooks
    histories = sorted({h for _, h in executor.calls})
    assert len(histories) == 7 and histories[0] == 0 and histories[-1] > 4 * BASE_CHUNK
    assert executor.calls[0] == executor.calls[1] == (BASE_CHUNK, 0)  # warm-up runs, dropped
    for chunk_tokens, history_tokens in [(64, 7000), (256, 3000), (512, 0)]:
        assert rule.model.time_ms(chunk_tokens, history_tokens) == pytest.approx(
            STAGE_1.ms(chunk_tokens, history_tokens), rel=0.03
        )
    assert scheduler.cpp_source.startswith("profiled")


def test_chunks_follow_the_rule_and_shrink_with_history(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled)
    plans = []
    outputs = helpers.run_to_completion(
        scheduler, [(0, request("long", 6000, 1))], on_step=lambda s, o: plans.append(s.cpp_plan) or {}
    )
    chunks = prefill_chunks(outputs, "long")
    assert sum(chunks) == 6000
    assert len({id(plan) for plan in plans}) == 1  # one prompt: planned once, when it arrived
    rule, plan = scheduler.cpp_rule, plans[0]
    history_tokens = 0
    for chunk in chunks:
        assert chunk == rule.wanted_chunk(history_tokens, 6000 - history_tokens, plan)
        if chunk not in (6000 - history_tokens, BASE_CHUNK):  # but the tail and vLLM's cap: the target ...
            efficient = int(plan.efficient.at(history_tokens))  # ... or the chunk that costs least per token
            assert rule.model.time_ms(chunk, history_tokens) == pytest.approx(plan.target_ms, rel=0.02) or (
                chunk == efficient and rule.model.time_ms(chunk, history_tokens) <= plan.target_ms
            )
        history_tokens += chunk
    body = chunks[:-1]  # without the tail
    peak = body.index(max(body))  # the efficient chunk grows with history until the target binds ...
    assert body[:peak] == sorted(body[:peak])
    assert body[peak:] == sorted(body[peak:], reverse=True)  # ... then chunks shrink as history grows
    assert body[-1] < max(body) / 2, chunks


def test_a_deeper_pipeline_plans_shorter_batches(tmp_path, profiled):
    """The fill and drain cost (P - 1) x the largest batch: more stages, smaller chunks."""
    targets_ms = {}
    for stages in (2, 4):
        scheduler = cached_scheduler(tmp_path / f"p{stages}", profiled, pipeline_parallel_size=stages)
        scheduler.add_request(request("long", 6000, 1))
        scheduler.schedule()
        targets_ms[stages] = scheduler.cpp_target_ms
    assert targets_ms[4] < targets_ms[2]


def test_the_target_is_planned_only_when_the_prefills_change(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled)
    arrivals = [(0, request("a", 3000, 4)), (6, request("b", 2000, 4, start=5000))]
    with mock.patch.object(cpp_policy, "plan_target", side_effect=cpp_policy.plan_target) as plan:
        outputs = helpers.run_to_completion(scheduler, arrivals)
    steps_with_prefill = [out for out in outputs if any(n > 1 for n in out.num_scheduled_tokens.values())]
    assert len(steps_with_prefill) > 8
    assert 2 <= plan.call_count <= 5  # arrivals and admissions, not every step


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_batches_stay_within_target_decodes_run_every_step_and_all_finish(tmp_path, profiled, async_scheduling):
    scheduler = cached_scheduler(tmp_path, profiled, async_scheduling=async_scheduling)
    model = scheduler.cpp_rule.model
    shared = list(range(1, 2049))
    arrivals = [(0, request(f"chat-{i}", 40 + 10 * i, 60, start=5000 + 100 * i)) for i in range(4)]
    arrivals += [
        (3, helpers.make_request("long-a", shared + list(range(3000, 5000)), max_tokens=3)),
        (5, request("long-b", 3000, 2, start=9000)),
        (40, helpers.make_request("prefix-hit", shared + list(range(7000, 7600)), max_tokens=4)),
    ]
    expected = {r.request_id: r.max_tokens for _, r in arrivals}
    generated: dict[str, int] = {}
    history_of: dict[str, int] = {}
    timing = timing_from(STAGE_1)
    checked = []

    def on_step(scheduler, scheduler_output):
        pairs = batch_pairs(scheduler_output, history_of)
        prefill = any(chunk > 1 for chunk, _ in pairs.values())
        if prefill and len(pairs) > 1:  # a prefill alone may take its floor or tail
            assert model.batch_time_ms(pairs.values()) <= scheduler.cpp_target_ms * (1 + TAIL_TOLERANCE) + 1e-9
            checked.append(scheduler_output)
        return timing(scheduler, scheduler_output)

    outputs = helpers.run_to_completion(scheduler, arrivals, on_step=on_step, generated=generated)
    assert generated == expected
    assert len(checked) >= 4
    long_steps = [out for out in outputs if out.num_scheduled_tokens.get("long-a", 0) > 1]
    assert len(long_steps) >= 4
    for out in long_steps:
        assert scheduler_running_chats(out), "no decode ran next to a prefill chunk"


def scheduler_running_chats(scheduler_output):
    return [rid for rid, n in scheduler_output.num_scheduled_tokens.items() if rid.startswith("chat-") and n == 1]


def test_prefix_cache_hit_is_charged_its_true_history(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled)
    rule = scheduler.cpp_rule
    shared = list(range(1, 4097))
    helpers.run_to_completion(scheduler, [(0, helpers.make_request("first", shared + [9], max_tokens=1))])
    hit = helpers.make_request("hit", shared + list(range(5000, 5500)), max_tokens=1)
    scheduler.add_request(hit)
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    history_tokens = new.num_computed_tokens
    assert history_tokens == 4096  # the shared blocks came from the prefix cache
    chunk = out.num_scheduled_tokens["hit"]
    plan = scheduler.cpp_plan
    assert chunk == rule.wanted_chunk(history_tokens, 500, plan) < 500
    charged_tokens, charged_history, charged_ms = scheduler.cpp_policy.budget.charged["hit"]
    assert (charged_tokens, charged_history) == (chunk, 4096)  # its true history, not H = 0
    assert charged_ms == rule.model.request_ms(chunk, 4096) > rule.model.request_ms(chunk, 0)
    assert rule.model.time_ms(chunk, history_tokens) <= plan.target_ms * (1 + TAIL_TOLERANCE)


def test_a_waiting_prompt_is_planned_from_its_prefix_cache_hit(tmp_path, profiled):
    """A plan made while a prompt waits sees where admission will start it: after its cache hit."""
    scheduler = cached_scheduler(tmp_path, profiled)
    shared = list(range(1, 4097))
    helpers.run_to_completion(scheduler, [(0, helpers.make_request("first", shared + [9], max_tokens=1))])
    scheduler.add_request(helpers.make_request("hit", shared + list(range(5000, 5500)), max_tokens=1))
    scheduler.add_request(request("cold", 700, 1, start=20_000))
    with mock.patch.object(cpp_policy, "plan_target", side_effect=cpp_policy.plan_target) as plan:
        scheduler.schedule()
    held = plan.call_args_list[0].args[1]
    assert held[:2] == [(4096, 500), (0, 700)]
    assert scheduler.cpp_policy.traffic.load().jobs[-2:] == ((4096, 500), (0, 700))  # sizes without the hit


def test_a_shorter_waiting_request_is_sized_first(tmp_path, profiled, monkeypatch):
    """With little time left, the shortest waiting request takes what fits, ahead of an older longer one,
    which is passed over: it keeps its place ahead of later arrivals and comes next."""
    scheduler = cached_scheduler(tmp_path, profiled, tail_tolerance=0.0)
    rule = scheduler.cpp_rule
    left_ms = rule.model.request_ms(40, 0)  # exactly what w2 needs
    allot = StepBudget.allot

    def little_time_left(self, *args):
        self.used_ms = self.target_ms - left_ms  # another prefill already took the rest
        self.prefills.add("elsewhere")
        allot(self, *args)

    monkeypatch.setattr(StepBudget, "allot", little_time_left)
    scheduler.add_request(request("w1", 300, 1, start=8000))
    scheduler.add_request(request("w2", 40, 1, start=9000))
    assert scheduler.schedule().num_scheduled_tokens == {"w2": 40}
    monkeypatch.undo()
    scheduler.add_request(request("w3", 20, 1, start=10_000))
    assert list(scheduler.schedule().num_scheduled_tokens) == ["w1", "w3"]  # w1 first, in its place


def test_the_twin_starts_ours_from_the_samples_an_engine_saved(tmp_path, profiled):
    """The e2e twin's ours: an engine's saved samples, filed under this engine's fingerprint, are
    adopted as a cached profile (the engine's model and decisions) without a profiling run."""
    from vllm_ascend_patchset.twin.worker import seed_profile_cache

    engine = profiled[2]
    saved = cpp_profile_store.cache_file(str(profiled[0] / "cache"), deployment.fingerprint_for(engine.vllm_config))
    settings = {"enabled": True, "cache_dir": str(tmp_path / "seeded"), "min_chunk": 64}
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler,
        model_dir=tmp_path / "another-model",  # another fingerprint than the engine that profiled
        num_blocks=1024,
        max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16,
        max_model_len=8192,
        block_size=BLOCK_SIZE,
        pipeline_parallel_size=2,
        additional_config={"profiling_chunk_config": settings},
    )
    seed_profile_cache(saved, scheduler.vllm_config, settings["cache_dir"])
    executor = FakeExecutor(fail_after=0)
    scheduler.run_profiling_chunk_init(executor)
    assert executor.calls == [] and scheduler.cpp_rule is not None
    assert scheduler.cpp_source.startswith(f"cache {tmp_path / 'seeded'}")
    for chunk_tokens, history_tokens in [(64, 7000), (512, 0)]:
        assert scheduler.cpp_rule.model.time_ms(chunk_tokens, history_tokens) == pytest.approx(
            engine.cpp_rule.model.time_ms(chunk_tokens, history_tokens)
        )


def test_a_short_prompt_arriving_beside_a_long_one_is_sized_first_and_a_starved_one_catches_up(tmp_path, profiled):
    """The step is allotted by response ratio on the scheduler's clock (``cpp_clock``, the clock of
    arrival times): a short prompt that comes with a long one takes its whole prompt in its first
    step, ahead of the long one vLLM visits first; a long one that has waited long comes first; a
    long one that has started runs on, its chunk not cut for a short one that comes meanwhile."""
    now = [100.0]

    def arrive(scheduler, name, tokens, arrival_time):
        prompt = request(name, tokens, 1, start=len(name) * 10_000)
        prompt.arrival_time = arrival_time
        scheduler.add_request(prompt)

    def scheduler_with(*prompts):
        scheduler = cached_scheduler(tmp_path, profiled)
        scheduler.cpp_clock = lambda: now[0]
        for prompt in prompts:
            arrive(scheduler, *prompt)
        return scheduler

    scheduler = scheduler_with(("long", 6000, 100.0), ("short", 40, 100.0))
    step = scheduler.schedule().num_scheduled_tokens
    assert step["short"] == 40 and step["long"] > 0 and sum(step.values()) <= BASE_CHUNK
    budget = scheduler.cpp_policy.budget
    assert budget.predicted_ms() <= budget.target_ms * (1 + TAIL_TOLERANCE)

    now[0] = 1e6  # the long one waited a million seconds
    step = scheduler_with(("old", 6000, 0.0), ("late", 300, 1e6)).schedule().num_scheduled_tokens
    assert step.get("old", 0) > 0 and step.get("late", 0) < 300

    now[0] = 100.0
    alone = scheduler_with(("long", 6000, 100.0))
    chunks = [alone.schedule().num_scheduled_tokens["long"] for _ in range(2)]
    scheduler = scheduler_with(("long", 6000, 100.0))
    assert scheduler.schedule().num_scheduled_tokens["long"] == chunks[0]
    arrive(scheduler, "short", 300, 100.0)
    step = scheduler.schedule().num_scheduled_tokens
    assert step["long"] == chunks[1] and step.get("short", 0) in (0, 300)  # all of it beside, or none


def test_decodes_that_fill_the_budget_do_not_starve_the_first_prefill(tmp_path, profiled, monkeypatch):
    """With decodes reserved past the target, the step's first prefill still advances by the floor."""
    scheduler = cached_scheduler(tmp_path, profiled)
    allot = StepBudget.allot

    def step_full_of_decodes(self, *args):
        self.reserve_decodes([("decodes", 1, 10**9)])  # one decode at an absurd history: the budget is gone
        allot(self, *args)

    monkeypatch.setattr(StepBudget, "allot", step_full_of_decodes)
    scheduler.add_request(request("w1", 3000, 1, start=8000))
    scheduler.add_request(request("w2", 3000, 1, start=9000))
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"w1": 64}  # w1 advances by min_chunk, w2 keeps its place


def test_decode_only_steps_are_not_sized_and_a_skipped_prefill_stays_held(tmp_path, profiled, monkeypatch):
    """No prefill held and none waiting: the step is vLLM's own. A prefill that got nothing is sized next step."""
    scheduler = cached_scheduler(tmp_path, profiled)

    def step():
        out = scheduler.schedule()
        plan = scheduler.planned_batch(out)
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))
        return out, plan

    scheduler.add_request(request("chat", 40, 50, start=5000))
    step()  # the chat's prompt
    for _ in range(3):
        out, plan = step()
        assert out.num_scheduled_tokens == {"chat": 1}
        assert plan is None and not out.cpp_time_step
    identity = sys.modules[ProfilingChunkScheduler.__module__].ScheduleHooks  # nothing reserved nor charged:
    assert scheduler.charge_scheduled_tokens.__func__ is identity.charge_scheduled_tokens  # the identity hooks
    assert scheduler.cap_running_tokens.__func__ is identity.cap_running_tokens

    scheduler.add_request(request("long", 3000, 1))
    out, plan = step()
    assert plan is not None and {"chat", "long"} == set(plan.charged) == set(out.num_scheduled_tokens)

    original = ProfilingChunkScheduler.schedule_step_starts

    def step_with_no_time_left(self, token_budget):
        token_budget = original(self, token_budget)
        self.cpp_policy.budget.used_ms = self.cpp_policy.budget.target_ms  # another prefill already took it all
        self.cpp_policy.budget.prefills.add("elsewhere")
        return token_budget

    monkeypatch.setattr(ProfilingChunkScheduler, "schedule_step_starts", step_with_no_time_left)
    assert "long" not in step()[0].num_scheduled_tokens
    monkeypatch.setattr(ProfilingChunkScheduler, "schedule_step_starts", original)

    long, chat = scheduler.requests["long"], scheduler.requests["chat"]
    history_tokens = long.num_computed_tokens
    expected = StepBudget(scheduler.cpp_rule, scheduler.cpp_plan)
    expected.reserve_decodes([("chat", 1, chat.num_computed_tokens)])
    out, plan = step()  # nothing waiting: the held prefill alone makes the step a sized one
    assert plan is not None and set(plan.charged) == {"chat", "long"}
    assert out.num_scheduled_tokens["long"] == expected.grant(history_tokens, 3000 - history_tokens, BASE_CHUNK)


def test_a_token_budget_above_the_context_profiles_and_plans_up_to_the_context(tmp_path):
    """vLLM accepts max_num_batched_tokens above max_model_len (several requests share a step), but no one
    request's chunk is longer than the context: the profile never asks a worker for one (a worker's block
    table is as wide as the context), and the plan's chunks stop there too."""

    class ContextWide(FakeExecutor):
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            chunk_tokens, history_tokens = args
            if chunk_tokens + history_tokens > 1024:  # as a worker's block-table row overflows
                raise ValueError(f"a run of {chunk_tokens + history_tokens} tokens past the context of 1024")
            return super().collective_rpc(method, timeout, args, kwargs)

    executor = ContextWide()
    scheduler = cpp_scheduler(tmp_path, executor, base=2048, max_model_len=1024)
    assert scheduler.cpp_policy is not None, scheduler.cpp_verdict
    assert executor.calls and max(c + h for c, h in executor.calls) <= 1024
    assert max(scheduler.cpp_rule.model.chunk_tokens) == 1024
    assert scheduler.cpp_rule.limits.cap_tokens == 1024


def test_a_kv_cache_smaller_than_the_context_bounds_every_profile_run_within_its_usable_blocks(tmp_path):
    """Where the KV cache, not the context, bounds a sequence, no profile run needs more blocks than a request
    can hold: block 0 is vLLM's null block, so a worker's profile batch takes ids 1..n of the pool."""
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, num_blocks=200)  # 3200 tokens of KV < the 8192 context
    assert scheduler.cpp_policy is not None, scheduler.cpp_verdict
    blocks = scheduler.kv_cache_config.num_blocks
    needed = max(-(-(c + h) // BLOCK_SIZE) for c, h in executor.calls)
    assert needed <= blocks - 1 and needed >= blocks - 1 - BASE_CHUNK // BLOCK_SIZE  # deep, and within the pool


def test_second_start_with_same_fingerprint_makes_no_profiling_call(tmp_path, profiled):
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, cache_dir=profiled[0] / "cache")
    assert executor.calls == []
    assert scheduler.cpp_source.startswith("cache ")
    assert scheduler.cpp_rule.model == profiled[2].cpp_rule.model


def test_corrupt_cache_file_is_profiled_again(tmp_path, profiled):
    cache_dir = tmp_path / "cache"
    cache_file = cpp_profile_store.cache_file(
        profiled[0] / "cache", deployment.fingerprint_for(profiled[2].vllm_config)
    )
    assert cache_file.exists()
    cache_dir.mkdir()
    (cache_dir / cache_file.name).write_text(
        f'{{"schema_version": {cpp_profile_store.PROFILE_SCHEMA_VERSION}, "samples": [[1, 0, '
    )
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, cache_dir=cache_dir, model_dir=profiled[0] / "model")
    assert len(executor.calls) > 16 and scheduler.cpp_source.startswith("profiled")
    saved = json.loads((cache_dir / cache_file.name).read_text())
    assert len(saved["samples"]) == len(executor.calls) - cpp_profiling.WARMUP_RUNS


@pytest.mark.parametrize("coefficient", [1e9, 1e308], ids=["1e9", "1e308"])
def test_a_model_written_into_the_cache_file_never_reaches_the_schedule(tmp_path, profiled, coefficient):
    """Only the samples are read: a cache file given a model of its own schedules as its samples do, step for step."""
    source = cpp_profile_store.cache_file(profiled[0] / "cache", deployment.fingerprint_for(profiled[2].vllm_config))
    data = json.loads(source.read_text())
    data["coefficients"] = {f"c{i}_ms": coefficient for i in range(5)}
    data["model"] = {"step_ms": [[coefficient]], "fixed_ms": coefficient}
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / source.name).write_text(json.dumps(data))
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, cache_dir=cache_dir, model_dir=profiled[0] / "model")
    reference = cached_scheduler(tmp_path / "reference", profiled)
    assert not executor.calls and scheduler.cpp_rule.model == reference.cpp_rule.model
    runs = [helpers.run_to_completion(s, [(0, request("long", 6000, 2))]) for s in (scheduler, reference)]
    assert prefill_chunks(runs[0], "long") == prefill_chunks(runs[1], "long")
    assert len(prefill_chunks(runs[0], "long")) < 6000 // 64


def test_worker_failure_leaves_fixed_chunks_and_every_request_finishes(tmp_path):
    executor = FakeExecutor(fail_after=5)
    with mock.patch.object(sys.modules[ProfilingChunkScheduler.__module__], "logger") as log:
        scheduler = cpp_scheduler(tmp_path, executor)
    assert log.warning.call_count == 1
    assert (
        "RuntimeError: worker 1 failed: NPU out of memory"
        in log.warning.call_args.args[0] % log.warning.call_args.args[1:]
    )
    assert scheduler.cpp_rule is None and not scheduler.uses_schedule_hooks
    generated: dict[str, int] = {}
    arrivals = [(0, request("long", 2000, 2)), (1, request("short", 100, 3, start=3000))]
    outputs = helpers.run_to_completion(scheduler, arrivals, generated=generated)
    assert generated == {"long": 2, "short": 3}
    long_chunks = [out.num_scheduled_tokens["long"] for out in outputs if out.num_scheduled_tokens.get("long", 0) > 1]
    assert long_chunks[:3] == [BASE_CHUNK] * 3  # fixed chunks at the token budget
    assert not any(out.cpp_time_step for out in outputs)


def test_a_flat_profile_is_a_valid_one_whose_chunks_are_the_largest(tmp_path):
    """Every chunk costs the same: not broken data, a device on which larger chunks are free. Upstream's fit
    refused no shape but needed a quadratic; ours follows the measurement."""
    flat = Surface(c0=5.0, c1=0.0, c2=0.0, c3=0.0, c4=0.0)
    scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(flat,)))
    assert scheduler.cpp_rule is not None
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1200, 1))])
    assert [out.num_scheduled_tokens["r"] for out in outputs[:3]] == [BASE_CHUNK, BASE_CHUNK, 1200 - 2 * BASE_CHUNK]


def test_a_broken_profile_runs_the_best_fixed_chunk_it_supports_through_the_hooks(tmp_path):
    """Data no grid can be made of (every run with history but a decode's gave no measurement): one warning,
    the best fixed chunk on what was measured, nothing cached."""

    class Broken(Surface):
        def ms(self, chunk_tokens, history_tokens):
            broken = history_tokens > 0 and chunk_tokens > 1
            return super().ms(chunk_tokens, history_tokens) * (float("nan") if broken else 1.0)

    module = sys.modules[ProfilingChunkScheduler.__module__]
    with mock.patch.object(module, "logger") as log:
        scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(Broken(),)), pipeline_parallel_size=8)
    assert scheduler.cpp_rule is None and scheduler.uses_schedule_hooks
    fixed = scheduler.cpp_fixed_chunk_tokens
    assert fixed is not None and fixed < BASE_CHUNK  # eight stages: the token budget would be the worst chunk
    ((message, *values),) = [call.args for call in log.warning.call_args_list]
    line = message % tuple(values)
    assert "no usable profile" in line and f"fixed chunks of {fixed} tokens" in line
    assert not list((tmp_path / "cache").glob("*.json"))
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 2000, 1))])
    assert prefill_chunks(outputs, "r")[:3] == [fixed] * 3


def test_a_size_faster_than_a_smaller_one_in_every_run_is_kept_and_cached(tmp_path):
    """384-token chunks that take 0.3x in every run: the device's, not broken data. The scheduler runs a model
    that keeps them, and caches it."""

    class Fast384(Surface):
        def ms(self, chunk_tokens, history_tokens):
            return super().ms(chunk_tokens, history_tokens) * (0.3 if chunk_tokens == 384 else 1.0)

    scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(Fast384(),)), pipeline_parallel_size=8)
    model = scheduler.cpp_rule.model
    assert {c for c, _ in model.odd_points} >= {384} and model.time_ms(384, 0) < model.time_ms(256, 0)
    assert list((tmp_path / "cache").glob("*.json"))


def test_a_concave_profile_gives_positive_times_and_chunks_that_never_grow(tmp_path):
    """Upstream's unguarded fit took the negative curvature: chunks grew with history, times went negative."""
    concave = Surface(c0=5.0, c1=0.05, c2=0.0, c3=-4e-5, c4=0.0)
    scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(concave,)))
    rule = scheduler.cpp_rule
    for target_ms in (concave.ms(64, 0), concave.ms(BASE_CHUNK, 0)):
        plan = rule.plan(target_ms)
        chunks = [rule.wanted_chunk(history, 10**6, plan) for history in range(0, 8000, 250)]
        assert all(later <= earlier for earlier, later in zip(chunks, chunks[1:], strict=False))
    assert all(rule.model.time_ms(c, h) > 0 for c in (1, 64, BASE_CHUNK) for h in (0, 4000))
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 3000, 1))])
    assert sum(prefill_chunks(outputs, "r")) == 3000


def test_start_up_logs_the_model_and_its_source(tmp_path, profiled):
    module = sys.modules[ProfilingChunkScheduler.__module__]
    with mock.patch.object(module, "logger") as log:
        scheduler = cached_scheduler(tmp_path, profiled)
    ((message, *values),) = [call.args for call in log.info.call_args_list]
    line = message % tuple(values)
    assert scheduler.cpp_rule.model.describe() in line
    assert f"from cache {profiled[0] / 'cache'}" in line


def test_a_few_fast_batches_do_not_move_the_model(tmp_path, profiled):
    """Upstream let any three history-free batches (a health check) overwrite the target."""
    scheduler = cached_scheduler(tmp_path, profiled)
    model = scheduler.cpp_rule.model
    arrivals = [(i, request(f"ping-{i}", 8, 1, start=100 * i + 1)) for i in range(5)]

    def fast(scheduler, scheduler_output):
        if scheduler_output.cpp_time_step:
            return {"execution_time_ms": 0.2 * STAGE_1.batch_ms(scheduler.planned_batch(scheduler_output).pairs)}
        return {}

    helpers.run_to_completion(scheduler, arrivals, on_step=fast)
    assert scheduler.cpp_rule.model == model


def test_timing_is_sampled_once_calibrated(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled, max_fit_chunk=8, timing_every=4)
    arrivals = [(i, request(f"r{i}", 1500, 20, start=1 + 2000 * i)) for i in range(6)]
    with mock.patch.object(scheduler.cpp_calibration, "record", return_value=None) as record:
        outputs = helpers.run_to_completion(scheduler, arrivals, on_step=timing_from(STAGE_1))
    prefill_steps = [out for out in outputs if any(n > 1 for n in out.num_scheduled_tokens.values())]
    decode_only = [out for out in outputs if out.num_scheduled_tokens and out not in prefill_steps]
    assert decode_only and not any(out.cpp_time_step for out in decode_only)
    timed = [out.cpp_time_step for out in prefill_steps]
    assert timed[:8] == [True] * 8
    assert sum(timed[8:]) == len([i for i in range(9, len(timed) + 1) if i % 4 == 0])
    assert record.call_count == sum(timed)
    pairs, measured_ms = record.call_args.args
    assert measured_ms == pytest.approx(STAGE_1.batch_ms(pairs))


def test_timing_off_when_need_timing_is_false(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled, need_timing=False)
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1500, 2))])
    assert not any(out.cpp_time_step for out in outputs)


def test_pipelined_steps_chunk_one_prompt_ahead_and_skip_decodes_in_flight(tmp_path, profiled):
    """With PP the engine schedules the next step before the previous one's output is back."""
    scheduler = cached_scheduler(tmp_path, profiled, num_blocks=2048)
    chats = [f"chat-{i}" for i in range(10)]
    for i, rid in enumerate(chats):
        scheduler.add_request(request(rid, 2500, 500, start=10_000 * (i + 1)))
    while any(scheduler.requests[rid].num_output_tokens == 0 for rid in chats):
        out = scheduler.schedule()
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))  # until every chat decodes
    scheduler.add_request(request("long", 5000, 1))
    first = scheduler.schedule()  # decodes + the first chunk
    second = scheduler.schedule()  # the decodes are in flight: only the prompt's next chunk
    assert set(first.num_scheduled_tokens) == {*chats, "long"}
    assert list(second.num_scheduled_tokens) == ["long"]
    history_tokens = first.num_scheduled_tokens["long"]
    rule, plan = scheduler.cpp_rule, scheduler.cpp_plan
    assert second.num_scheduled_tokens["long"] == rule.wanted_chunk(history_tokens, 5000 - history_tokens, plan)
    # The decodes took their share of the first batch (the second is not the longer for them).
    assert first.num_scheduled_tokens["long"] <= second.num_scheduled_tokens["long"]
    assert scheduler.planned_batch(first).predicted_ms <= plan.target_ms * (1 + 1e-9)
    assert scheduler.planned_batch(first).predicted_ms > scheduler.planned_batch(second).predicted_ms
    assert scheduler.planned_batch(second).pairs == ((second.num_scheduled_tokens["long"], history_tokens),)
    for output in (first, second):
        scheduler.update_from_output(output, helpers.model_output(scheduler, output))
    assert scheduler.planned_batch(first) is None and scheduler.planned_batch(second) is None


def test_each_timed_batch_logs_predicted_and_measured_time(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled)
    module = sys.modules["vllm_ascend.core.cpp_policy"]  # the policy logs what the model predicted
    with mock.patch.object(module, "logger") as log:
        outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1500, 2))], on_step=timing_from(STAGE_1))
    lines = [call.args[0] % tuple(call.args[1:]) for call in log.debug.call_args_list if "measured" in call.args[0]]
    timed = [out for out in outputs if out.cpp_time_step]
    assert len(lines) == len(timed) >= 3
    chunk = outputs[0].num_scheduled_tokens["r"]
    predicted, measured = scheduler.cpp_rule.model.time_ms(chunk, 0), STAGE_1.ms(chunk, 0)
    assert f"predicted {predicted:.2f} ms, measured {measured:.2f} ms" in lines[0]


def test_async_scheduling_reserves_decodes_scheduled_ahead_of_their_output(tmp_path, profiled):
    scheduler = cached_scheduler(tmp_path, profiled, num_blocks=2048, async_scheduling=True)
    rule = scheduler.cpp_rule
    chats = [f"chat-{i}" for i in range(10)]
    for i, rid in enumerate(chats):
        scheduler.add_request(request(rid, 2500, 500, start=10_000 * (i + 1)))
    while any(scheduler.requests[rid].num_output_tokens == 0 for rid in chats):
        out = scheduler.schedule()
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))
    scheduler.add_request(request("long", 5000, 1))
    first = scheduler.schedule()
    second = scheduler.schedule()  # with output placeholders the chats decode again right away
    history_of: dict[str, int] = {}
    target_ms = scheduler.cpp_target_ms
    for out in (first, second):
        assert set(out.num_scheduled_tokens) == {*chats, "long"}
        pairs = batch_pairs(out, history_of)
        assert rule.model.batch_time_ms(pairs.values()) <= target_ms * (1 + TAIL_TOLERANCE)
        # Every chat's decode is charged in both batches, the second ahead of the first's output.
        charged = scheduler.planned_batch(out).charged
        assert {*chats} <= set(charged) and all(charged[rid][0] == 1 for rid in chats)
    assert second.num_scheduled_tokens["long"] > 0


def test_priority_preemption_refunds_what_the_preempted_request_was_charged(tmp_path, profiled):
    cache_dir = str(profiled[0] / "cache")
    settings = {"enabled": True, "cache_dir": cache_dir, "min_chunk": 64, "tail_tolerance": TAIL_TOLERANCE}
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler,
        model_dir=profiled[0] / "model",
        num_blocks=100,  # tight: priority preemption within a step happens
        max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16,
        max_model_len=8192,
        policy="priority",
        pipeline_parallel_size=2,
        additional_config={"profiling_chunk_config": settings},
    )
    scheduler.run_profiling_chunk_init(FakeExecutor())
    assert scheduler.cpp_source.startswith("cache ")
    model = scheduler.cpp_rule.model
    arrivals = [
        (i, helpers.make_request(f"p{i}", list(range(1 + 1000 * i, 1 + 1000 * i + 300)), max_tokens=200,
                                 priority=i % 3, arrival_time=i))
        for i in range(8)
    ]  # fmt: skip
    generated: dict[str, int] = {}
    history_of: dict[str, int] = {}
    timing = timing_from(STAGE_1)

    def on_step(scheduler, scheduler_output):
        pairs = batch_pairs(scheduler_output, history_of)
        if len(pairs) > 1 and any(chunk > 1 for chunk, _ in pairs.values()):
            assert model.batch_time_ms(pairs.values()) <= scheduler.cpp_target_ms * (1 + TAIL_TOLERANCE) + 1e-9
        return timing(scheduler, scheduler_output)

    with mock.patch.object(
        ProfilingChunkScheduler, "refund_scheduled_tokens", autospec=True,
        side_effect=ProfilingChunkScheduler.refund_scheduled_tokens,
    ) as refund:  # fmt: skip
        helpers.run_to_completion(scheduler, arrivals, on_step=on_step, generated=generated)
    assert refund.call_count > 0
    assert generated == {f"p{i}": 200 for i in range(8)}


@pytest.mark.parametrize(
    "target, where",
    [
        ("vllm_ascend.core.cpp_step_budget.StepBudget.grant", "sizing a"),
        ("vllm_ascend.core.cpp_policy.plan_target", "the step start"),
        ("vllm_ascend.core.cpp_step_budget.StepBudget.charge", "charging a scheduled request"),
        ("vllm_ascend.core.cpp_step_budget.StepBudget.settle", "the step's bookkeeping"),
        ("vllm_ascend.core.cpp_calibration.OnlineCalibration.record", "online calibration"),
        ("vllm_ascend.core.cpp_traffic.Traffic.arrived", "counting an arrival"),
        ("vllm_ascend.core.cpp_traffic.Traffic.held", "the step start"),
    ],
)
def test_a_fault_in_cpp_never_reaches_the_engine_loop(tmp_path, profiled, target, where):
    """Any exception in our code mid-serving: one warning, CPP off for the process, every request finishes."""
    scheduler = cached_scheduler(tmp_path, profiled)
    module = sys.modules[ProfilingChunkScheduler.__module__]
    calls = {"n": 0}
    original = mock.patch(target).get_original()[0]

    def faulty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ZeroDivisionError("a fault nobody foresaw")
        return original(*args, **kwargs)

    generated: dict[str, int] = {}
    arrivals = [
        (0, request("long", 3000, 3)),
        (1, request("chat", 60, 20, start=5000)),
        (4, request("b", 900, 2, start=7000)),
    ]
    with mock.patch(target, side_effect=faulty, autospec=True), mock.patch.object(module, "logger") as log:
        helpers.run_to_completion(scheduler, arrivals, generated=generated, on_step=timing_from(STAGE_1))
    assert generated == {"long": 3, "chat": 20, "b": 2}
    warnings = [call.args[0] % tuple(call.args[1:]) for call in log.warning.call_args_list]
    # (the planner runs the step budget too, so a fault there may surface while planning at the step start)
    assert len(warnings) == 1 and "ZeroDivisionError" in warnings[0]
    assert where in warnings[0] or "the step start" in warnings[0]
    assert not scheduler.uses_schedule_hooks and scheduler.cpp_rule is None


@pytest.mark.parametrize("num_blocks, seed", [(400, 2), (300, 0), (300, 2), (300, 4), (300, 8), (270, 2), (270, 6)])
def test_a_nearly_full_kv_cache_never_stalls_the_prefills(tmp_path, profiled, num_blocks, seed):
    """With the KV cache nearly full, the request the allotment prefers (a preempted prompt with a
    long prefix-cache hit) may not get its blocks, while the running prefill it held back could
    have advanced: the next step is sized as vLLM visits, and every request finishes, as under
    upstream's loop, with CPP still on. Without that, each of these ran empty steps forever."""
    scheduler = cached_scheduler(tmp_path, profiled, num_blocks=num_blocks)
    rng = random.Random(seed)
    arrivals, wanted = [], {}
    for i in range(12):
        step, prompt_tokens = rng.randrange(0, 30), rng.choice([200, 900, 2500, 4000])
        wanted[f"r{i}"] = rng.choice([4, 40, 120])
        arrivals.append((step, request(f"r{i}", prompt_tokens, wanted[f"r{i}"], start=1000 * i + 1)))
    generated: dict[str, int] = {}
    unsized = []

    def on_step(scheduler, _output):
        unsized.append(scheduler._cpp_cuts.unsized)
        return {}

    helpers.run_to_completion(scheduler, arrivals, generated=generated, max_steps=2000, on_step=on_step)
    assert generated == wanted and scheduler.cpp_policy is not None
    assert not any(unsized), "no KV blocks for a grant is no cut of vLLM's loop: CPP keeps sizing"


def test_a_burst_of_short_prompts_next_to_decodes_is_packed_into_full_batches(tmp_path, profiled):
    """Many short prompts waiting while requests decode: batches carry many of them, as a fixed
    chunk would, not about one prompt's worth each (the plan sees the queue behind its head)."""
    steps_to_first_tokens = {}
    for name, scheduler in (
        ("cpp", cached_scheduler(tmp_path, profiled)),
        ("fixed", helpers.make_scheduler(None, model_dir=tmp_path / "fixed", num_blocks=1024,
                                         max_num_batched_tokens=BASE_CHUNK, max_num_seqs=16, max_model_len=8192,
                                         block_size=BLOCK_SIZE, pipeline_parallel_size=2)),
    ):  # fmt: skip
        arrivals = [(0, request(f"chat-{i}", 40, 400, start=100 + 50 * i)) for i in range(4)]
        arrivals += [(3, request(f"burst-{i}", 60, 2, start=10_000 + 100 * i)) for i in range(40)]
        scheduled, first_token_step = {}, {}
        outputs = helpers.run_to_completion(scheduler, arrivals, max_steps=3000)
        for step, out in enumerate(outputs):
            for rid, tokens in out.num_scheduled_tokens.items():
                scheduled[rid] = scheduled.get(rid, 0) + tokens
                if rid.startswith("burst-") and scheduled[rid] >= 60:
                    first_token_step.setdefault(rid, step)  # the step that finished its prompt
        assert len(first_token_step) == 40
        steps_to_first_tokens[name] = sum(first_token_step.values()) / len(first_token_step)
    # One prompt's worth per batch would take about 40 steps on average; a fixed chunk of 512 packs ~8.
    assert steps_to_first_tokens["cpp"] <= 2.0 * steps_to_first_tokens["fixed"], steps_to_first_tokens


def test_the_target_is_planned_again_when_a_request_starts_decoding(tmp_path, profiled):
    """A short prompt admitted and prefilled within one pipeline round of the last plan decodes next to
    the long one: the plan that bounds the batches for decodes (rule 4) is made, though the prefills
    held are the same as the last plan's."""
    scheduler = cached_scheduler(tmp_path, profiled)
    arrivals = [(0, request("long", 6000, 2)), (1, request("short", 8, 16, start=9000))]
    with mock.patch.object(cpp_policy, "plan_target", side_effect=cpp_policy.plan_target) as plan:
        outputs = helpers.run_to_completion(scheduler, arrivals)
    short_prefill = next(i for i, out in enumerate(outputs) if out.num_scheduled_tokens.get("short", 0) > 1)
    long_chunks_after = [out for out in outputs[short_prefill + 1 :] if out.num_scheduled_tokens.get("long", 0) > 1]
    assert long_chunks_after, "the long prompt is still prefilling while the short one decodes"
    held_alone = [c for c in plan.call_args_list if len(c.args[1]) == 1 and c.kwargs.get("decoding", 0) >= 1]
    assert held_alone, [(len(c.args[1]), c.kwargs.get("decoding")) for c in plan.call_args_list]


def test_a_long_prompt_waits_for_the_one_ahead_and_a_short_one_behind_it_is_served(tmp_path, profiled):
    """vLLM's per-request cap (long_prefill_token_threshold) leaves room in every batch. A longer
    prompt gets none of it while the first goes on (sharing would halve the first one's pace); the
    loop passes over it, so a short prompt behind it is served at once, and it keeps its place
    ahead of a later, longer one."""
    scheduler = cached_scheduler(tmp_path, profiled)
    scheduler.scheduler_config.long_prefill_token_threshold = 128
    arrivals = [
        (0, request("first", 2000, 2)),
        (0, request("second", 2500, 2, start=3000)),
        (0, request("short", 40, 2, start=6000)),
        (1, request("later", 3000, 2, start=9000)),
    ]
    outputs = helpers.run_to_completion(scheduler, arrivals)

    def prefill_steps(request_id):
        return [step for step, out in enumerate(outputs) if out.num_scheduled_tokens.get(request_id, 0) > 1]

    assert outputs[0].num_scheduled_tokens == {"first": 128, "short": 40}
    assert min(prefill_steps("second")) >= max(prefill_steps("first"))
    assert min(prefill_steps("later")) >= max(prefill_steps("second"))


def test_a_request_vllm_set_aside_is_sized_when_it_is_admitted(tmp_path, profiled):
    """vLLM keeps a request it cannot schedule yet (remote KV, LoRA limits, or one we passed over)
    in its skipped queue: with no prefill running and none in the main queue, its admission is
    still a sized step."""
    scheduler = cached_scheduler(tmp_path, profiled)
    scheduler.add_request(request("aside", 3000, 1))
    scheduler.skipped_waiting.prepend_request(scheduler.waiting.pop_request())
    out = scheduler.schedule()
    plan = scheduler.planned_batch(out)
    assert plan is not None and set(plan.charged) == {"aside"}
    expected = StepBudget(scheduler.cpp_rule, scheduler.cpp_plan).grant(0, 3000, BASE_CHUNK)
    assert out.num_scheduled_tokens == {"aside": expected}


def test_the_fixed_fallback_bounds_the_prefills_and_every_decode_rides_on_top(tmp_path):
    """vLLM schedules every decode each step (max_num_batched_tokens >= max_num_seqs); the fallback's fixed
    chunk bounds the prefills' tokens, not the step's: 200 decodes and a prompt's fixed chunk all advance
    every step (before, the 256 tokens of the step went to decodes, and the prompt waited for them to end)."""

    class Broken(Surface):
        def ms(self, chunk_tokens, history_tokens):
            broken = history_tokens > 0 and chunk_tokens > 1
            return super().ms(chunk_tokens, history_tokens) * (float("nan") if broken else 1.0)

    settings = {"enabled": True, "cache_dir": str(tmp_path / "cache"), "profile_points": 16}
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler, model_dir=tmp_path / "model", num_blocks=4096, max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=320, max_model_len=8192, block_size=BLOCK_SIZE, pipeline_parallel_size=8,
        additional_config={"profiling_chunk_config": settings},
    )  # fmt: skip
    scheduler.run_profiling_chunk_init(FakeExecutor(stages=(Broken(),)))
    fixed = scheduler.cpp_fixed_chunk_tokens
    assert fixed is not None and fixed + 200 <= BASE_CHUNK < fixed + 300
    arrivals = [(0, request(f"d{i}", 4, 50, start=10 * i + 1)) for i in range(200)]
    outputs = helpers.run_to_completion(scheduler, [*arrivals, (40, request("long", 2000, 2, start=50000))])
    with_prompt = [out for out in outputs if "long" in out.num_scheduled_tokens][:3]
    assert [out.num_scheduled_tokens["long"] for out in with_prompt] == [fixed] * 3
    for out in with_prompt:  # every decode (all still running: 50 tokens each) in the step beside the chunk
        assert sum(rid.startswith("d") for rid in out.num_scheduled_tokens) == 200
    # As vLLM's batch queue runs it at PP = 8: a decode whose last token is still in the pipeline has none to
    # schedule, and its share of the budget is not the prompt's (the chunks were up to 456 tokens).
    for i in range(200):
        scheduler.add_request(request(f"e{i}", 4, 400, start=100_000 + 10 * i))
    in_flight, chunks = collections.deque(), []
    for step in range(80):
        if step == 40:
            scheduler.add_request(request("pp", 4000, 400, start=90000))
        out = scheduler.schedule()
        in_flight.append(out)
        chunks.append(out.num_scheduled_tokens.get("pp", 0))
        if len(in_flight) == 8:
            oldest = in_flight.popleft()
            scheduler.update_from_output(oldest, helpers.model_output(scheduler, oldest))
    assert max(chunks) == fixed and chunks.count(fixed) >= 3


@pytest.mark.parametrize(
    ("known_at_start_up", "target_tpot_ms"),
    [(True, None), (False, None), (True, 40.0)],
    ids=["known", "unknown", "paced"],
)
def test_where_the_loop_cuts_prefills_to_whole_blocks_a_long_prompt_still_advances(
    tmp_path, known_at_start_up, target_tpot_ms
):
    """A hybrid model with prefix caching (mamba_cache_mode "align"): vLLM's loop rounds every prefill chunk
    short of the prompt's last block down to whole blocks, a chunk under one block to nothing. Known at
    start-up, CPP's chunks are whole blocks; if not, a step that advanced no prefill leaves the next one's
    sizes to vLLM. Either way the prompt finishes beside the decodes (it stalled for good before). Under a
    TPOT target a step may leave the prompt less than a block: that is no grant, and no step is vLLM's (each
    such step once went to vLLM, 8-19x over the decodes' bound)."""
    block = 256
    settings = {"enabled": True, "cache_dir": str(tmp_path / "cache"), "profile_points": 16}
    if target_tpot_ms:
        settings["target_tpot_ms"] = target_tpot_ms
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler, model_dir=tmp_path / "model", num_blocks=400, max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16, max_model_len=8192, block_size=block, pipeline_parallel_size=4,
        additional_config={"profiling_chunk_config": settings},
    )  # fmt: skip
    if known_at_start_up:
        scheduler.need_mamba_block_aligned_split = True  # (vLLM's Scheduler.__init__ sets it)
    scheduler.run_profiling_chunk_init(FakeExecutor())
    scheduler.need_mamba_block_aligned_split = True
    assert scheduler.cpp_rule is not None
    if known_at_start_up:
        assert scheduler.cpp_rule.limits.granule_tokens % block == 0
    arrivals = [(0, request(f"chat{i}", 40, 300, start=100 * i + 1)) for i in range(6)]
    unsized = []

    def on_step(scheduler, _output):
        unsized.append(scheduler._cpp_cuts.unsized)
        return {}

    long = request("long", 7000, 2, start=20000)
    outputs = helpers.run_to_completion(scheduler, [*arrivals, (2, long)], on_step=on_step, max_steps=3000)
    chunks = prefill_chunks(outputs, "long")
    assert sum(chunks) == 7000 + 1  # (its prompt, then its one decode)
    if known_at_start_up:  # whole blocks to the prompt's last one, and no step left to vLLM
        assert all(c % block == 0 for c in chunks[:-3]) and 0 not in chunks and not any(unsized)


def test_under_the_priority_policy_the_allotment_takes_waiting_requests_in_admission_order(tmp_path):
    """vLLM's admission under ``--scheduling-policy priority`` takes the higher of the two waiting queues'
    heads, not the skipped queue first: a high-priority prompt behind 8 passed-over ones is admitted first.
    The allotment sees the same order, so the batch keeps to its target (before, it sized that prompt from
    what was left and still gave the allotted one its whole chunk: 27% over the target)."""
    settings = {"enabled": True, "cache_dir": str(tmp_path / "cache"), "profile_points": 16}
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler, model_dir=tmp_path / "model", num_blocks=1024, max_num_batched_tokens=2048,
        max_num_seqs=16, max_model_len=8192, block_size=BLOCK_SIZE, pipeline_parallel_size=8, policy="priority",
        additional_config={"profiling_chunk_config": settings},
    )  # fmt: skip
    scheduler.run_profiling_chunk_init(FakeExecutor())
    shared = list(range(100000, 106000))
    helpers.run_to_completion(scheduler, [(0, helpers.make_request("warm", shared, max_tokens=1, priority=5))])
    for i in range(8):  # passed over before (by CPP, a LoRA limit or a connector): vLLM's skipped queue
        tokens = shared + list(range(10000 * i + 1, 10000 * i + 2001 + 10 * i))
        scheduler.add_request(helpers.make_request(f"low{i}", tokens, max_tokens=1, priority=5, arrival_time=i))
        scheduler.skipped_waiting.add_request(scheduler.waiting.pop_request())
    high = helpers.make_request("high", list(range(50000, 50300)), max_tokens=1, priority=0, arrival_time=9.0)
    scheduler.add_request(high)
    assert next(cpp_held.waiting_in_order(scheduler)) is high
    out = scheduler.schedule()
    assert "high" in out.num_scheduled_tokens
    batch_ms = scheduler.cpp_rule.model.batch_time_ms(batch_pairs(out, {}).values())
    assert batch_ms <= scheduler.cpp_target_ms * (1 + TAIL_TOLERANCE) + 1e-9
