"""The running requests CPP keeps from step to step are the ones it would read again, and the batches the same.

``RunningState`` (core/cpp_running.py) is updated from events (a step scheduled, an output
back, requests finished, aborted or preempted) instead of a walk over every running request
at every step. With ``cpp_check_state`` each sized step compares it with a state rebuilt from
vLLM's queues; with ``cpp_keep_state = False`` the state is rebuilt at every sized step, as
before it was kept: that scheduler is the reference the batches are compared with.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from types import SimpleNamespace

import helpers
import numpy as np
import pytest
from test_scheduler_profiling_chunk import BASE_CHUNK, FakeExecutor, cpp_scheduler
from vllm.v1.request import RequestStatus
from vllm_ascend.core.cpp_running import RunningState
from vllm_ascend_patchset.paths import CPU_SURFACE
from vllm_ascend_patchset.twin import engine as twin_engine
from vllm_ascend_patchset.twin.pipeline import run_pipeline
from vllm_ascend_patchset.twin.surface import StageTimer
from vllm_ascend_patchset.twin.surface_files import load_surface
from vllm_ascend_patchset.twin.workloads import mixed

ProfilingChunkScheduler = helpers.profiling_chunk_scheduler_class()
AsyncProfilingChunkScheduler = sys.modules[ProfilingChunkScheduler.__module__].AsyncProfilingChunkScheduler


def workload(seed: int, count: int = 40) -> list[tuple[int, object]]:
    """(arrival step, request): prompts of many sizes, half sharing a prefix with an earlier one."""
    rng = random.Random(seed)
    prompts, arrivals = [], []
    for index in range(count):
        length = rng.choice([24, 80, 300, 700, 1500])
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            shared = base[: min(len(base), rng.choice([32, 128, 512]))]
            prompt = shared + [rng.randrange(1, 30_000) for _ in range(max(2, length - len(shared)))]
        else:
            prompt = [rng.randrange(1, 30_000) for _ in range(length)]
        prompts.append(prompt)
        request = helpers.make_request(f"r{index:03d}", prompt, max_tokens=rng.randrange(1, 40), arrival_time=index)
        arrivals.append((rng.randrange(0, 120), request))
    return arrivals


def small_pool_scheduler(tmp_path, *, async_scheduling: bool, policy: str):
    """A profiled CPP scheduler at P = 4 over a KV pool small enough that requests are preempted."""
    scheduler = helpers.make_scheduler(
        AsyncProfilingChunkScheduler if async_scheduling else ProfilingChunkScheduler,
        model_dir=tmp_path / "model",
        num_blocks=160,
        max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16,
        max_model_len=8192,
        pipeline_parallel_size=4,
        policy=policy,
        additional_config={"profiling_chunk_config": {"enabled": True, "cache_dir": str(tmp_path / "cache")}},
    )
    scheduler.run_profiling_chunk_init(FakeExecutor())
    assert scheduler.cpp_policy is not None
    return scheduler


def run_in_flight(scheduler, arrivals, *, in_flight: int, aborts=(), max_steps: int = 5000) -> list[dict]:
    """Drive the scheduler as vLLM's engine does under pipeline parallelism: ``in_flight`` batches out,
    a step's output back only once that many later ones are scheduled. ``aborts``: (step, request id)."""
    pending, aborts, outputs, flight = sorted(arrivals, key=lambda a: a[0]), sorted(aborts), [], deque()
    step = 0
    while pending or scheduler.has_unfinished_requests() or flight:
        while pending and pending[0][0] <= step:
            scheduler.add_request(pending.pop(0)[1])
        while aborts and aborts[0][0] <= step:
            request_id = aborts.pop(0)[1]
            if request_id in scheduler.requests:
                scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        out = scheduler.schedule()
        outputs.append(dict(out.num_scheduled_tokens))
        flight.append((out, helpers.model_output(scheduler, out)))
        while flight and (len(flight) >= in_flight or not out.total_num_scheduled_tokens):
            scheduler.update_from_output(*flight.popleft())
        step += 1
        assert step < max_steps, "requests still unfinished"
    scheduler.schedule()  # an idle step: what finished last is let go
    return outputs


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_kept_state_is_what_a_rebuild_reads_and_the_batches_are_the_same(tmp_path, async_scheduling, policy):
    """Preemption (a small KV pool), aborts, prefix-cache hits, P batches in flight: at every sized step
    the kept state equals a rebuilt one, and every step's batch equals the reference's (rebuilt each step)."""
    seed = 3 if policy == "fcfs" else 4
    aborts = [(30, "r005"), (45, "r011"), (60, "r020"), (61, "r021")]
    runs = {}
    for keep in (True, False):
        scheduler = small_pool_scheduler(tmp_path, async_scheduling=async_scheduling, policy=policy)
        scheduler.cpp_keep_state, scheduler.cpp_check_state = keep, keep
        runs[keep] = (scheduler, run_in_flight(scheduler, workload(seed), in_flight=4, aborts=aborts))
    (kept, kept_steps), (reference, reference_steps) = runs[True], runs[False]
    assert kept.cpp_policy is not None and reference.cpp_policy is not None  # no fault turned CPP off
    assert kept.cpp_running.mismatches == []
    assert kept_steps == reference_steps
    assert kept.cpp_running.rebuilds < reference.cpp_running.rebuilds / 2  # most sized steps kept their state
    assert kept.cpp_running.memory()["requests"] == 0  # every request left


def passed_over_while_preempted(scheduler, request_id: str):
    """Schedule ``request_id``'s prompt, preempt it with that output in flight (as a full KV pool does),
    and let CPP pass it over at the next step (it then waits in vLLM's skipped queue): the output of
    the first step, which stops it (``max_tokens=1``), is returned, not yet given back."""
    first = scheduler.schedule()
    assert request_id in first.num_scheduled_tokens
    output = helpers.model_output(scheduler, first)  # (what the device computed before the preemption)
    request = scheduler.requests[request_id]
    scheduler.running.remove(request)
    scheduler._preempt_request(request, 0.0)
    budget, admit = scheduler.cpp_policy.budget, scheduler.cpp_policy.budget.admit
    budget.admit = (
        lambda history, remaining, allowed, rid="": -1 if rid == request_id else admit(history, remaining, allowed, rid)
    )
    second = scheduler.schedule()
    del budget.admit
    assert request_id not in second.num_scheduled_tokens and request in list(scheduler.skipped_waiting)
    return first, output, second


def run_out(scheduler, steps: int = 40) -> None:
    for _ in range(steps):
        out = scheduler.schedule()
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))
        if not scheduler.has_unfinished_requests():
            return


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_passed_over_preempted_request_that_finishes_is_not_scheduled(tmp_path, policy, async_scheduling):
    """It finishes when its output comes back: it leaves every queue, and the next steps schedule the
    rest (vLLM takes it out of ``waiting`` only; before, "Invalid request status: FINISHED_LENGTH_CAPPED")."""
    scheduler = small_pool_scheduler(tmp_path, async_scheduling=async_scheduling, policy=policy)
    scheduler.add_request(helpers.make_request("done", list(range(1, 40)), max_tokens=1))
    scheduler.add_request(helpers.make_request("other", list(range(100, 160)), max_tokens=4))
    first, output, second = passed_over_while_preempted(scheduler, "done")
    request = scheduler.requests["done"]
    scheduler.update_from_output(first, output)
    assert request.is_finished()
    assert request not in list(scheduler.skipped_waiting) and request not in list(scheduler.waiting)
    scheduler.update_from_output(second, helpers.model_output(scheduler, second))
    run_out(scheduler)
    assert not scheduler.has_unfinished_requests() and not scheduler._cpp_preempted


def test_a_passed_over_streaming_request_that_stops_waits_once(tmp_path):
    """A streaming-input request stopped the same way waits for its next input in the skipped queue once
    (vLLM puts it there again: two copies, and the next input ran it twice: "Invalid request status")."""
    scheduler = small_pool_scheduler(tmp_path, async_scheduling=False, policy="fcfs")
    session = helpers.make_request("sess", list(range(1, 40)), max_tokens=1)
    session.resumable = True
    scheduler.add_request(session)
    scheduler.add_request(helpers.make_request("other", list(range(100, 160)), max_tokens=4))
    first, output, second = passed_over_while_preempted(scheduler, "sess")
    request = scheduler.requests["sess"]
    scheduler.update_from_output(first, output)
    assert not request.is_finished() and sum(r is request for r in scheduler.skipped_waiting) == 1
    scheduler.update_from_output(second, helpers.model_output(scheduler, second))
    more = helpers.make_request("sess", list(range(200, 210)), max_tokens=1)
    more.resumable = True
    scheduler.add_request(more)  # the session's next input
    run_out(scheduler)
    assert sum(r is request for r in scheduler.skipped_waiting) <= 1 and "other" not in scheduler.requests


@pytest.mark.parametrize("stream", [False, True], ids=["finished", "streaming"])
def test_a_preempted_request_vllm_itself_passes_over_is_settled_too(tmp_path, stream):
    """vLLM's loop passes a request over on its own (here: the LoRA limit) into the skipped queue; preempted
    with its token in flight, it stops there just the same, and leaves it (or waits there once)."""
    from vllm.lora.request import LoRARequest

    scheduler = small_pool_scheduler(tmp_path, async_scheduling=False, policy="fcfs")
    scheduler.lora_config = SimpleNamespace(max_loras=1)
    done = helpers.make_request("done", list(range(1, 40)), max_tokens=1)
    done.lora_request, done.resumable = LoRARequest("a", 1, "/a"), stream
    other = helpers.make_request("other", list(range(100, 160)), max_tokens=4)
    other.lora_request = LoRARequest("b", 2, "/b")
    scheduler.add_request(done)
    scheduler.add_request(other)
    first = scheduler.schedule()
    output = helpers.model_output(scheduler, first)
    scheduler.running.remove(done)
    scheduler._preempt_request(done, 0.0)
    second = scheduler.schedule()  # "other" holds the one LoRA slot: vLLM skips "done"
    assert "done" not in second.num_scheduled_tokens and done in list(scheduler.skipped_waiting)
    scheduler.update_from_output(first, output)
    assert sum(r is done for r in scheduler.skipped_waiting) == (1 if stream else 0)
    scheduler.update_from_output(second, helpers.model_output(scheduler, second))
    run_out(scheduler)
    assert "other" not in scheduler.requests and sum(r is done for r in scheduler.skipped_waiting) <= 1


def test_a_preempted_streaming_request_with_its_next_input_is_not_lost(tmp_path):
    """Preempted with its token in flight and its next input already come, a streaming request that stops
    is taken out of ``waiting`` by vLLM as it is put back there: it waits there once and runs."""
    scheduler = small_pool_scheduler(tmp_path, async_scheduling=False, policy="fcfs")
    session = helpers.make_request("sess", list(range(1, 40)), max_tokens=1)
    session.resumable = True
    scheduler.add_request(session)
    first = scheduler.schedule()
    output = helpers.model_output(scheduler, first)
    scheduler.running.remove(session)
    scheduler._preempt_request(session, 0.0)
    more = helpers.make_request("sess", list(range(200, 210)), max_tokens=1)
    more.resumable = True
    scheduler.add_request(more)
    scheduler.update_from_output(first, output)
    assert sum(r is session for r in scheduler.waiting) + sum(r is session for r in scheduler.skipped_waiting) == 1
    computed = []
    for _ in range(10):
        out = scheduler.schedule()
        computed.append(out.num_scheduled_tokens.get("sess", 0))
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))
    assert sum(computed) > 0  # before: in no queue, never scheduled again


def test_the_workload_preempts_and_hits_the_prefix_cache(tmp_path):
    """The workload above does what it is there for: requests are preempted and prompts hit the cache."""
    scheduler = small_pool_scheduler(tmp_path, async_scheduling=False, policy="fcfs")
    preempted, hits = [], []
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        out = original(*args, **kwargs)
        preempted.extend(out.preempted_req_ids or ())
        hits.extend(r.num_computed_tokens for r in out.scheduled_new_reqs if r.num_computed_tokens > 0)
        return out

    scheduler.schedule = schedule
    run_in_flight(scheduler, workload(3), in_flight=4)
    assert preempted and hits


def test_the_check_sees_a_kept_history_that_is_off_by_one(tmp_path):
    """The comparison can fail: a decode's kept history one token off is found, and read again."""
    scheduler = cpp_scheduler(tmp_path, pipeline_parallel_size=2)
    scheduler.cpp_check_state = True
    for index in range(3):
        prompt = list(range(1 + 50 * index, 40 + 50 * index))
        scheduler.add_request(helpers.make_request(f"d{index}", prompt, max_tokens=50))
    scheduler.add_request(helpers.make_request("long", list(range(5000, 7000)), max_tokens=2))  # every step sized
    flight = deque()
    for _ in range(8):
        out = scheduler.schedule()
        flight.append((out, helpers.model_output(scheduler, out)))
        if len(flight) >= 2:
            scheduler.update_from_output(*flight.popleft())
    state = scheduler.cpp_running
    assert state.num_decodes == 3 and state.prefills and state.mismatches == []
    state._history[state._order[0]] += 1  # corrupt the kept state
    scheduler.schedule()
    assert len(state.mismatches) == 1 and "kept" in state.mismatches[0]


def test_a_decode_that_goes_out_uncharged_makes_the_state_be_read_again(tmp_path):
    """With no check (as in production), a kept state that says a ready decode waits: vLLM schedules it, the
    budget had not reserved it, the counts differ, and the next step reads the running requests again."""
    scheduler = cpp_scheduler(tmp_path, pipeline_parallel_size=2)
    for index in range(3):
        prompt = list(range(1 + 50 * index, 40 + 50 * index))
        scheduler.add_request(helpers.make_request(f"d{index}", prompt, max_tokens=50))
    scheduler.add_request(helpers.make_request("long", list(range(5000, 9000)), max_tokens=2))  # every step sized
    flight = deque()
    for _ in range(8):
        out = scheduler.schedule()
        flight.append((out, helpers.model_output(scheduler, out)))
        if len(flight) >= 2:
            scheduler.update_from_output(*flight.popleft())
    state = scheduler.cpp_running
    ready = state.ready_decodes()[0]
    assert len(ready) and out.num_scheduled_tokens.get("long", 0) > 1
    state._ready[ready[0]] = False  # corrupt the kept state: a ready decode said to wait
    rebuilds = state.rebuilds
    out = scheduler.schedule()
    assert state._ids[ready[0]] in out.num_scheduled_tokens  # vLLM scheduled it, unreserved and uncharged
    scheduler.schedule()
    assert state.rebuilds == rebuilds + 1 and state.check(scheduler.running) is None


class CountedList(list):
    """vLLM's running queue, counting the walks over it."""

    walks = 0

    def __iter__(self):
        CountedList.walks += 1
        return super().__iter__()


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "reference"])
def test_a_step_with_no_change_of_requests_does_not_walk_the_running_ones(tmp_path, keep):
    """Sized steps (a long prompt in chunks) beside 12 decodes, no arrival and none finishing: the kept state
    reads no running request; the reference walks them at every step."""
    scheduler = cpp_scheduler(tmp_path, pipeline_parallel_size=2)
    scheduler.cpp_keep_state = keep
    for index in range(12):
        prompt = list(range(1 + 50 * index, 40 + 50 * index))
        scheduler.add_request(helpers.make_request(f"d{index}", prompt, max_tokens=500))
    scheduler.add_request(helpers.make_request("long", list(range(5000, 8000)), max_tokens=2))
    flight = deque()

    def step():
        out = scheduler.schedule()
        flight.append((out, helpers.model_output(scheduler, out)))
        if len(flight) >= 2:
            scheduler.update_from_output(*flight.popleft())
        return out

    for _ in range(6):
        step()
    scheduler.running = CountedList(scheduler.running)
    CountedList.walks = 0
    outs = [step() for _ in range(4)]
    assert all(out.num_scheduled_tokens.get("long", 0) > 1 for out in outs)  # sized steps, the prompt open
    assert all(not out.finished_req_ids and not out.scheduled_new_reqs for out in outs)  # no change of requests
    assert (CountedList.walks == 0) if keep else (CountedList.walks >= 4), CountedList.walks


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_prompt_after_steps_of_decodes_only_reads_the_running_ones_once(tmp_path, async_scheduling):
    """Steps of decodes only are not tracked; the first sized step after them reads the running requests
    once, and the decodes still in flight in those steps' outputs wait for them (checked every step)."""
    scheduler = cpp_scheduler(tmp_path, async_scheduling=async_scheduling, pipeline_parallel_size=4)
    scheduler.cpp_check_state = True
    for index in range(12):
        prompt = list(range(1 + 50 * index, 40 + 50 * index))
        scheduler.add_request(helpers.make_request(f"d{index}", prompt, max_tokens=400))
    flight = deque()

    def step():
        out = scheduler.schedule()
        flight.append((out, helpers.model_output(scheduler, out)))
        if len(flight) >= 4:
            scheduler.update_from_output(*flight.popleft())
        return out

    for _ in range(12):  # the prompts, then decodes only
        step()
    assert not scheduler._cpp_sizing  # noqa: SLF001
    state = scheduler.cpp_running
    before = state.rebuilds
    scheduler.add_request(helpers.make_request("long", list(range(5000, 9000)), max_tokens=2))
    outs = [step() for _ in range(6)]
    assert all(out.num_scheduled_tokens.get("long", 0) > 1 for out in outs)  # every one a sized step
    assert state.mismatches == []
    assert state.rebuilds == before + 1


def test_ten_thousand_requests_leave_nothing_behind(tmp_path):
    """Memory kept across steps is per running request and goes with it."""
    scheduler = cpp_scheduler(tmp_path, pipeline_parallel_size=2)
    rng = random.Random(0)
    arrivals = [
        (step, helpers.make_request(f"m{step}-{k}", [rng.randrange(1, 30_000) for _ in range(20)], max_tokens=2))
        for step in range(2500)
        for k in range(4)
    ]
    run_in_flight(scheduler, arrivals, in_flight=2, max_steps=20_000)
    memory = scheduler.cpp_running.memory()
    assert memory["requests"] == memory["decodes"] == memory["prefills"] == memory["pending_outputs"] == 0, memory
    assert memory["slots"] <= 2 * scheduler.max_num_running_reqs, memory
    assert not scheduler.requests and not scheduler.cpp_policy._in_flight  # noqa: SLF001


def test_decode_costs_are_the_models_own_numbers(tmp_path):
    """The table the reservation reads is ``decode_ms_many`` entry for entry, and follows a new model."""
    scheduler = cpp_scheduler(tmp_path)
    budget, model = scheduler.cpp_policy.budget, scheduler.cpp_rule.model
    histories = np.array([0, 1, 17, 511, 4095, 7000, 20_000, 3], dtype=np.int64)
    assert budget.decode_costs(histories).tolist() == model.decode_ms_many(histories).tolist()
    longer = np.array([70_000, 5], dtype=np.int64)  # past the table: it grows
    assert budget.decode_costs(longer).tolist() == model.decode_ms_many(longer).tolist()


def twin_batches(keep: bool, async_scheduling: bool, seed: int) -> list[list[tuple[str, int]]]:
    """Ours on the twin (the committed CPU surface, P = 4, mixed traffic with prefix hits): each batch."""
    surface, stages = load_surface(str(CPU_SURFACE)), 4
    work = mixed(surface, stages, seed=seed, num_requests=12, reference_chunk_tokens=2048)
    timer = StageTimer.build(surface, stages, None, 0.0, seed, 0.0)
    config = twin_engine.make_vllm_config(
        max_num_batched_tokens=2048,
        num_stages=stages,
        max_model_len=work.max_request_tokens + twin_engine.MODEL_LEN_SLACK_TOKENS,
        additional_config={"profiling_chunk_config": {"enabled": True, "cache_dir": ""}},
        async_scheduling=async_scheduling,
    )
    cls = AsyncProfilingChunkScheduler if async_scheduling else ProfilingChunkScheduler
    scheduler = twin_engine.make_scheduler(cls, config, twin_engine.kv_blocks_for(work))
    scheduler.cpp_keep_state = scheduler.cpp_check_state = keep
    scheduler.run_profiling_chunk_init(twin_engine.SurfaceExecutor(config, timer))

    def timed(output, stage_ms):
        return max(stage_ms) if getattr(output, "cpp_time_step", False) else None

    driver = twin_engine.VllmDriver(scheduler, work, timed)
    batches = run_pipeline(driver, timer, stages, config.max_concurrent_batches)
    assert scheduler.cpp_policy is not None and scheduler.cpp_running.mismatches == []
    return [[(c.req_id, c.chunk_tokens, c.history_tokens) for c in b.chunks] for b in batches]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_twin_runs_make_the_same_batches_step_by_step(async_scheduling):
    """A seeded twin run (timing feedback, refits, a planner thread) makes every batch as the reference does."""
    kept, reference = twin_batches(True, async_scheduling, 1), twin_batches(False, async_scheduling, 1)
    assert len(kept) > 200
    assert kept == reference


def test_a_state_that_does_not_add_up_is_read_again():
    """A request gone by a path no event covers: the count differs, and the state is rebuilt."""

    class Request:
        def __init__(self, request_id, computed, tokens):
            self.request_id, self.num_computed_tokens, self.num_tokens = request_id, computed, tokens
            self.num_output_placeholders, self.spec_token_ids = 0, []

    class Scheduler:
        running = [Request("a", 10, 11), Request("b", 0, 500), Request("c", 30, 31)]
        finished_req_ids: set = set()

    state = RunningState(asynchronous=False)
    state.step_start(Scheduler)
    assert state.snapshot() == (["b"], [("a", 10, True), ("c", 30, True)]) and state.rebuilds == 1
    Scheduler.running = Scheduler.running[1:]  # "a" left unseen
    state.step_start(Scheduler)
    assert state.snapshot() == (["b"], [("c", 30, True)]) and state.rebuilds == 2
