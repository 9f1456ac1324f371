"""The trace bench's step log: prefill steps marked for the worker's clock, their batches logged with the time."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_ascend_patchset.e2e import step_log


class _Scheduler:
    """A scheduler whose steps are given: each schedules ``plan`` ({req_id: tokens}) and advances the requests."""

    def __init__(self, requests, plans, marks=()):
        self.requests, self.plans, self.marks, self.updates, self.steps = requests, list(plans), set(marks), [], 0

    def schedule(self):
        index = self.steps
        self.steps += 1
        plan = self.plans.pop(0)
        for req_id, tokens in plan.items():
            self.requests[req_id].num_computed_tokens += tokens
        return SimpleNamespace(num_scheduled_tokens=plan, cpp_time_step=index in self.marks)

    def update_from_output(self, scheduler_output, model_runner_output):
        self.updates.append((scheduler_output, model_runner_output))
        return "engine outputs"


def _request(prompt, computed=0):
    return SimpleNamespace(num_prompt_tokens=prompt, num_computed_tokens=computed)


def test_prefill_steps_are_marked_and_logged_with_their_batch_and_decode_steps_are_left_as_they_were():
    lines = []
    cls = type("S", (_Scheduler,), {})
    assert step_log.install(cls, lambda fmt, *args: lines.append(fmt % args))
    assert not step_log.install(cls, lines.append)  # once
    requests = {"long": _request(3000), "chat": _request(40, computed=40)}  # chat is decoding
    plans = [{"long": 1024, "chat": 1}, {"chat": 1}, {"long": 1024, "chat": 1}]
    scheduler = cls(requests, plans, marks={1})  # the scheduler itself marks the decode-only step 1
    outputs = [scheduler.schedule() for _ in range(3)]
    assert [o.cpp_time_step for o in outputs] == [True, True, True]  # marks only ever added
    assert scheduler.update_from_output(outputs[0], SimpleNamespace(execution_time_ms=210.5)) == "engine outputs"
    scheduler.update_from_output(outputs[1], SimpleNamespace(execution_time_ms=9.0))  # not a prefill: not logged
    scheduler.update_from_output(outputs[2], SimpleNamespace())  # no time came back: nothing logged
    assert lines == ["[CPP e2e] timed step 1024+0,1+40: 210.50 ms"]
    assert len(scheduler.updates) == 3  # every output reaches the scheduler
    assert step_log.timed_steps("noise\n" + "\n".join(lines)) == [([(1024, 0), (1, 40)], 210.5)]


def test_a_decode_only_step_is_not_marked_and_a_step_of_a_gone_request_is_left_out():
    cls = type("S", (_Scheduler,), {})
    step_log.install(cls, lambda *a: None)
    requests = {"a": _request(10, computed=12)}
    scheduler = cls(requests, [{"a": 1}, {"a": 1, "gone": 5}])
    assert scheduler.schedule().cpp_time_step is False
    assert step_log.batch_pairs(scheduler, SimpleNamespace(num_scheduled_tokens={"a": 1, "gone": 5})) == (
        [(1, 12)],
        False,
    )


def test_a_fault_in_reading_the_batch_leaves_the_step_to_the_engine():
    cls = type("S", (_Scheduler,), {})
    step_log.install(cls, lambda *a: None)
    scheduler = cls({}, [{"x": 5}])
    scheduler.requests = None  # no .get: reading the batch fails
    scheduler.plans = [{}]
    output = scheduler.schedule()
    assert output.cpp_time_step is False
