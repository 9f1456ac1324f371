"""ProfilingChunkScheduler on a real vLLM 0.23.0 scheduler, profiled through a fake executor.

The fake executor answers ``collective_rpc("profile_prefill_latency", (C, H))`` from a
known latency surface per pipeline stage, so what the scheduler does can be checked
against what the surface says.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from dataclasses import dataclass, field
from unittest import mock

import helpers
import pytest
from vllm_ascend.core import cpp_profiling

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
    tmp_path, executor=None, *, cache_dir=None, model_dir=None, num_blocks=1024, async_scheduling=False, **cpp
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
        max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16,
        max_model_len=8192,
        block_size=BLOCK_SIZE,
        additional_config={"profiling_chunk_config": settings},
    )
    scheduler.run_profiling_chunk_init(executor if executor is not None else FakeExecutor())
    return scheduler


def request(rid, prompt_tokens, max_tokens, *, start=1):
    return helpers.make_request(rid, list(range(start, start + prompt_tokens)), max_tokens=max_tokens)


def timing_from(surface):
    def on_step(scheduler, scheduler_output):
        plan = scheduler.planned_batch(scheduler_output)
        if plan is not None:  # the running sum the scheduler keeps is the model's time of the batch
            predictor = scheduler.profiling_chunk_manager.predictor
            assert plan.predicted_ms == pytest.approx(predictor.batch_time_ms(plan.pairs), rel=1e-9)
        if scheduler_output.cpp_time_step:
            return {"execution_time_ms": surface.batch_ms(scheduler.planned_batch(scheduler_output).pairs)}
        return {}

    return on_step


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


def test_profile_uses_the_slowest_stage_and_measures_history(profiled):
    _, executor, scheduler = profiled
    model = scheduler.profiling_chunk_manager.model
    assert model is not None and scheduler.uses_schedule_hooks
    assert scheduler.profiling_chunk_manager.target_ms == pytest.approx(STAGE_1.ms(BASE_CHUNK, 0), rel=0.02)
    histories = sorted({h for _, h in executor.calls})
    assert len(histories) == 7 and histories[0] == 0 and histories[-1] > 4 * BASE_CHUNK
    assert executor.calls[0] == executor.calls[1] == (BASE_CHUNK, 0)  # warm-up runs, dropped
    for chunk_tokens, history_tokens in [(64, 7000), (256, 3000), (512, 0)]:
        assert model.time_ms(chunk_tokens, history_tokens) == pytest.approx(
            STAGE_1.ms(chunk_tokens, history_tokens), rel=0.03
        )
    assert scheduler.cpp_source.startswith("profiled")


def test_chunks_shrink_with_history_as_predicted(tmp_path, profiled):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    predictor = scheduler.profiling_chunk_manager.predictor
    outputs = helpers.run_to_completion(scheduler, [(0, request("long", 6000, 1))])
    chunks = [out.num_scheduled_tokens["long"] for out in outputs if "long" in out.num_scheduled_tokens]
    assert sum(chunks) == 6000
    # A fresh prompt starts with exactly a base chunk: the target is that chunk's time.
    assert chunks[0] == BASE_CHUNK
    history_tokens = 0
    for chunk in chunks:
        assert chunk == predictor.next_chunk(history_tokens, 6000 - history_tokens)
        history_tokens += chunk
    assert all(later <= earlier for earlier, later in zip(chunks[:-2], chunks[1:-1], strict=True))
    assert chunks[-2] < BASE_CHUNK / 3
    # Rounded down, and the tail merged into the last chunk instead of costing a round of its own.
    assert all(chunk % predictor.align == 0 for chunk in chunks[:-1])
    assert chunks[-1] > predictor.floor_tokens


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_batches_stay_within_target_decodes_run_every_step_and_all_finish(tmp_path, profiled, async_scheduling):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", async_scheduling=async_scheduling)
    predictor = scheduler.profiling_chunk_manager.predictor
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
    outputs = helpers.run_to_completion(scheduler, arrivals, on_step=timing_from(STAGE_1), generated=generated)
    assert generated == expected
    for out in outputs:
        pairs = batch_pairs(out, history_of)
        if pairs:
            assert predictor.batch_time_ms(pairs.values()) <= predictor.target_ms * (1 + TAIL_TOLERANCE) + 1e-9
    # Decodes of the chat requests are in every batch while the long prompts prefill.
    long_steps = [
        out for out in outputs if "long-a" in out.num_scheduled_tokens and out.num_scheduled_tokens["long-a"] > 1
    ]
    assert len(long_steps) >= 4
    for out in long_steps:
        decoding = [rid for rid in scheduler_running_chats(out)]
        assert decoding, "no decode ran next to a prefill chunk"


def scheduler_running_chats(scheduler_output):
    return [rid for rid, n in scheduler_output.num_scheduled_tokens.items() if rid.startswith("chat-") and n == 1]


def test_prefix_cache_hit_is_charged_its_true_history(tmp_path, profiled):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    predictor = scheduler.profiling_chunk_manager.predictor
    shared = list(range(1, 4097))
    helpers.run_to_completion(scheduler, [(0, helpers.make_request("first", shared + [9], max_tokens=1))])
    hit = helpers.make_request("hit", shared + list(range(5000, 5500)), max_tokens=1)
    scheduler.add_request(hit)
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    history_tokens = new.num_computed_tokens
    assert history_tokens == 4096  # the shared blocks came from the prefix cache
    chunk = out.num_scheduled_tokens["hit"]
    remaining_tokens = 4096 + 500 - history_tokens
    assert chunk == predictor.next_chunk(history_tokens, remaining_tokens)
    assert chunk < 500 == predictor.next_chunk(0, 500)  # charged at H=0 it would have taken all 500
    assert predictor.time_ms(chunk, history_tokens) <= predictor.target_ms * (1 + TAIL_TOLERANCE)


def test_waiting_requests_keep_fcfs_order(tmp_path, profiled, monkeypatch):
    """A waiting request the budget cannot take stops admission: a smaller one behind it waits too."""
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    predictor = scheduler.profiling_chunk_manager.predictor
    left_ms = (predictor.request_ms(40, 0) + predictor.request_ms(predictor.align, 0)) / 2
    original = ProfilingChunkScheduler.schedule_step_starts

    def step_with_little_time_left(self, token_budget):
        token_budget = original(self, token_budget)
        self._step_used_ms = predictor.target_ms - left_ms  # another prefill already took the rest
        self._step_prefills.add("elsewhere")
        return token_budget

    monkeypatch.setattr(ProfilingChunkScheduler, "schedule_step_starts", step_with_little_time_left)
    scheduler.add_request(request("w1", 300, 1, start=8000))
    scheduler.add_request(request("w2", 40, 1, start=9000))
    first = scheduler.schedule()
    assert predictor.max_chunk_within(0, left_ms, 40) == 40  # w2 alone would fit what is left
    assert first.num_scheduled_tokens == {}  # but w1 is first in line and does not fit
    monkeypatch.setattr(ProfilingChunkScheduler, "schedule_step_starts", original)
    assert list(scheduler.schedule().num_scheduled_tokens) == ["w1", "w2"]  # in arrival order


def test_decodes_that_fill_the_budget_do_not_starve_the_first_prefill(tmp_path, profiled, monkeypatch):
    """With decodes reserved past the target, the step's first prefill still advances by the floor."""
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    predictor = scheduler.profiling_chunk_manager.predictor
    original = ProfilingChunkScheduler.schedule_step_starts

    def step_full_of_decodes(self, token_budget):
        token_budget = original(self, token_budget)
        self._step_reserved_ms["decodes"] = (1, 2 * predictor.target_ms)
        self._step_used_ms = 2 * predictor.target_ms
        return token_budget

    monkeypatch.setattr(ProfilingChunkScheduler, "schedule_step_starts", step_full_of_decodes)
    scheduler.add_request(request("w1", 3000, 1, start=8000))
    scheduler.add_request(request("w2", 3000, 1, start=9000))
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"w1": predictor.floor_tokens}  # w1 advances, w2 keeps its place


def test_second_start_with_same_fingerprint_makes_no_profiling_call(tmp_path, profiled):
    cache_dir = profiled[0] / "cache"
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, cache_dir=cache_dir)
    assert executor.calls == []
    assert scheduler.cpp_source.startswith("cache ")
    assert scheduler.profiling_chunk_manager.model == profiled[2].profiling_chunk_manager.model


def test_corrupt_cache_file_is_profiled_again(tmp_path, profiled):
    cache_dir = tmp_path / "cache"
    (cache_file,) = list((profiled[0] / "cache").glob("*.json"))
    cache_dir.mkdir()
    (cache_dir / cache_file.name).write_text('{"schema_version": 1, "coefficients": {"c0_ms": ')
    executor = FakeExecutor()
    scheduler = cpp_scheduler(tmp_path, executor, cache_dir=cache_dir, model_dir=profiled[0] / "model")
    assert len(executor.calls) > 16 and scheduler.cpp_source.startswith("profiled")
    assert json.loads((cache_dir / cache_file.name).read_text())["coefficients"]["c3_ms"] > 0


def test_worker_failure_leaves_fixed_chunks_and_every_request_finishes(tmp_path):
    executor = FakeExecutor(fail_after=5)
    with mock.patch.object(cpp_profiling, "logger") as log:
        scheduler = cpp_scheduler(tmp_path, executor)
    assert log.warning.call_count == 1
    assert (
        "RuntimeError: worker 1 failed: NPU out of memory"
        in log.warning.call_args.args[0] % log.warning.call_args.args[1:]
    )
    assert scheduler.profiling_chunk_manager.predictor is None and not scheduler.uses_schedule_hooks
    generated: dict[str, int] = {}
    arrivals = [(0, request("long", 2000, 2)), (1, request("short", 100, 3, start=3000))]
    outputs = helpers.run_to_completion(scheduler, arrivals, generated=generated)
    assert generated == {"long": 2, "short": 3}
    long_chunks = [out.num_scheduled_tokens["long"] for out in outputs if out.num_scheduled_tokens.get("long", 0) > 1]
    assert long_chunks[:3] == [BASE_CHUNK] * 3  # fixed chunks at the token budget
    assert not any(out.cpp_time_step for out in outputs)


def test_flat_profile_is_rejected_and_leaves_fixed_chunks(tmp_path):
    """A fit without a quadratic term is refused: fixed chunks, nothing cached."""
    flat = Surface(c0=5.0, c1=0.0, c2=0.0, c3=0.0, c4=0.0)
    scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(flat,)))
    assert scheduler.profiling_chunk_manager.predictor is None and scheduler.cpp_source is None
    assert not list((tmp_path / "cache").glob("*.json"))
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1200, 1))])
    assert [out.num_scheduled_tokens["r"] for out in outputs[:3]] == [BASE_CHUNK, BASE_CHUNK, 1200 - 2 * BASE_CHUNK]


@dataclass
class Concave(Surface):
    def ms(self, chunk_tokens, history_tokens):
        return 5.0 + 0.05 * chunk_tokens - 4e-5 * chunk_tokens**2  # a negative quadratic term


def test_concave_profile_never_makes_chunks_grow_or_times_negative(tmp_path):
    """Upstream's unguarded fit took the negative curvature: chunks grew with history."""
    scheduler = cpp_scheduler(tmp_path, FakeExecutor(stages=(Concave(),)))
    predictor = scheduler.profiling_chunk_manager.predictor
    if predictor is None:  # refused outright: fixed chunks
        outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1200, 1))])
        assert outputs[0].num_scheduled_tokens["r"] == BASE_CHUNK
        return
    # Accepted only as a non-negative model (here: nearly linear), within the fit's error bound.
    assert all(c >= 0 for c in predictor.model.coefficients)
    chunks = [predictor.next_chunk(history, 10**6) for history in range(0, 8000, 500)]
    assert all(later <= earlier for earlier, later in zip(chunks, chunks[1:], strict=False))
    assert all(predictor.time_ms(c, h) > 0 for c in (1, 64, BASE_CHUNK) for h in (0, 4000))
    assert predictor.target_ms == pytest.approx(Concave().ms(BASE_CHUNK, 0), rel=0.15)


def test_start_up_logs_the_model_the_target_and_its_source(tmp_path, profiled):
    module = sys.modules[ProfilingChunkScheduler.__module__]
    with mock.patch.object(module, "logger") as log:
        cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    ((message, *values),) = [call.args for call in log.info.call_args_list]
    line = message % tuple(values)
    assert "t = c0 + c1*C + c2*H + c3*C^2 + c4*C*H" in line and "target 16.3" in line
    assert f"from cache {profiled[0] / 'cache'}" in line


def test_a_few_fast_batches_do_not_move_the_target(tmp_path, profiled):
    """Upstream let any three history-free batches (a health check) overwrite the target."""
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    target_ms = scheduler.profiling_chunk_manager.target_ms
    arrivals = [(i, request(f"ping-{i}", 8, 1, start=100 * i + 1)) for i in range(5)]

    def fast(scheduler, scheduler_output):
        if scheduler_output.cpp_time_step:
            return {"execution_time_ms": 0.2 * STAGE_1.batch_ms(scheduler.planned_batch(scheduler_output).pairs)}
        return {}

    helpers.run_to_completion(scheduler, arrivals, on_step=fast)
    assert scheduler.profiling_chunk_manager.target_ms == target_ms


def test_no_copy_of_the_scheduling_loop():
    """Upstream's scheduler carried a ~520-line copy of schedule(); ours wraps the hooked loop."""
    source = inspect.getsource(ProfilingChunkScheduler.schedule)
    assert "super().schedule(" in source and len(source.splitlines()) < 25
    module = ast.parse(inspect.getsource(sys.modules[ProfilingChunkScheduler.__module__]))
    assert not [node for node in ast.walk(module) if isinstance(node, ast.While)]


def test_timing_is_sampled_once_calibrated(tmp_path, profiled):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", max_fit_chunk=8, timing_every=4)
    arrivals = [(i, request(f"r{i}", 1500, 20, start=1 + 2000 * i)) for i in range(6)]
    with mock.patch.object(scheduler.profiling_chunk_manager, "record_batch", return_value=False) as record:
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
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", need_timing=False)
    outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1500, 2))])
    assert not any(out.cpp_time_step for out in outputs)


def test_pipelined_steps_chunk_one_prompt_ahead_and_skip_decodes_in_flight(tmp_path, profiled):
    """With PP the engine schedules the next step before the previous one's output is back."""
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", num_blocks=2048)
    predictor = scheduler.profiling_chunk_manager.predictor
    chats = [f"chat-{i}" for i in range(10)]
    for i, rid in enumerate(chats):
        scheduler.add_request(request(rid, 2500, 500, start=10_000 * (i + 1)))
    while any(scheduler.requests[rid].num_output_tokens == 0 for rid in chats):
        out = scheduler.schedule()
        scheduler.update_from_output(out, helpers.model_output(scheduler, out))  # until every chat decodes
    reserved_ms = sum(predictor.decode_ms(scheduler.requests[rid].num_computed_tokens) for rid in chats)
    assert reserved_ms > predictor.request_ms(predictor.align, 600)  # enough to cost the prompt a block
    scheduler.add_request(request("long", 5000, 1))
    first = scheduler.schedule()  # decodes + the first chunk
    second = scheduler.schedule()  # the decodes are in flight: only the prompt's next chunk
    assert set(first.num_scheduled_tokens) == {*chats, "long"}
    assert list(second.num_scheduled_tokens) == ["long"]
    history_tokens = first.num_scheduled_tokens["long"]
    assert second.num_scheduled_tokens["long"] == predictor.next_chunk(history_tokens, 5000 - history_tokens)
    assert scheduler.planned_batch(second).pairs == ((second.num_scheduled_tokens["long"], history_tokens),)
    for output in (first, second):
        scheduler.update_from_output(output, helpers.model_output(scheduler, output))
    assert scheduler.planned_batch(first) is None and scheduler.planned_batch(second) is None


def test_each_timed_batch_logs_predicted_and_measured_time(tmp_path, profiled):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache")
    module = sys.modules[ProfilingChunkScheduler.__module__]
    with mock.patch.object(module, "logger") as log:
        outputs = helpers.run_to_completion(scheduler, [(0, request("r", 1500, 2))], on_step=timing_from(STAGE_1))
    lines = [call.args[0] % tuple(call.args[1:]) for call in log.debug.call_args_list]
    timed = [out for out in outputs if out.cpp_time_step]
    assert len(lines) == len(timed) >= 3
    assert all("predicted" in line and "measured" in line for line in lines)
    predictor = scheduler.profiling_chunk_manager.predictor
    chunk = outputs[0].num_scheduled_tokens["r"]
    assert lines[0] == (
        f"[CPP] batch of 1 requests, {chunk} tokens: predicted {predictor.time_ms(chunk, 0):.2f} ms, "
        f"measured {STAGE_1.ms(chunk, 0):.2f} ms"
    )


def test_async_scheduling_reserves_decodes_scheduled_ahead_of_their_output(tmp_path, profiled):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profiled[0] / "cache", num_blocks=2048, async_scheduling=True)
    predictor = scheduler.profiling_chunk_manager.predictor
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
    for out in (first, second):
        assert set(out.num_scheduled_tokens) == {*chats, "long"}
        pairs = batch_pairs(out, history_of)
        assert predictor.batch_time_ms(pairs.values()) <= predictor.target_ms * (1 + TAIL_TOLERANCE)
    alone = predictor.next_chunk(first.num_scheduled_tokens["long"], 5000 - first.num_scheduled_tokens["long"])
    assert second.num_scheduled_tokens["long"] < alone  # the decodes' reservation took its share


def test_priority_preemption_refunds_what_the_preempted_request_was_charged(tmp_path, profiled):
    cache_dir = str(profiled[0] / "cache")
    settings = {"enabled": True, "cache_dir": cache_dir, "min_chunk": 64, "tail_tolerance": TAIL_TOLERANCE}
    scheduler = helpers.make_scheduler(
        ProfilingChunkScheduler,
        model_dir=profiled[0] / "model",
        num_blocks=150,
        max_num_batched_tokens=BASE_CHUNK,
        max_num_seqs=16,
        max_model_len=8192,
        policy="priority",
        additional_config={"profiling_chunk_config": settings},
    )
    scheduler.run_profiling_chunk_init(FakeExecutor())
    predictor = scheduler.profiling_chunk_manager.predictor
    arrivals = [
        (i, helpers.make_request(f"p{i}", list(range(1 + 1000 * i, 1 + 1000 * i + 300)), max_tokens=200,
                                 priority=i % 3, arrival_time=i))
        for i in range(8)
    ]  # fmt: skip
    generated: dict[str, int] = {}
    history_of: dict[str, int] = {}
    with mock.patch.object(
        ProfilingChunkScheduler, "refund_scheduled_tokens", autospec=True,
        side_effect=ProfilingChunkScheduler.refund_scheduled_tokens,
    ) as refund:  # fmt: skip
        outputs = helpers.run_to_completion(scheduler, arrivals, on_step=timing_from(STAGE_1), generated=generated)
    assert refund.call_count > 0
    assert generated == {f"p{i}": 200 for i in range(8)}
    for out in outputs:
        pairs = batch_pairs(out, history_of)
        if pairs and any(chunk > 1 for chunk, _ in pairs.values()):
            assert predictor.batch_time_ms(pairs.values()) <= predictor.target_ms * (1 + TAIL_TOLERANCE)
