"""The start-up profile can be watched: a few INFO lines while it runs, and its total time in the verdict.

A fake device times each run on a known surface and moves a fake clock by what the run
would take on a large model, so the lines are checked without waiting for them.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
from cpp_samples import TRUE
from vllm_ascend.core import cpp_profiling
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_config import CppConfig

BASE_CHUNK_TOKENS = 8192
MAX_HISTORY = 65_536
RUN_S = 3.0  # what one profiling run takes on the fake clock


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class SlowDevice:
    """Each run takes ``run_s`` on the clock; ``slow_first_round`` puts a slow spell where the decisions are."""

    def __init__(self, clock, *, run_s=RUN_S, slow_first_round=0):
        self.clock, self.run_s, self.runs, self.slow_first_round = clock, run_s, 0, slow_first_round

    def __call__(self, chunk_tokens, history_tokens):
        self.runs += 1
        self.clock.now += self.run_s
        slow = self.runs <= self.slow_first_round and 256 <= chunk_tokens <= 2048 and history_tokens == 0
        return TRUE.time_ms(chunk_tokens, history_tokens) * (3.0 if slow else 1.0)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(cpp_profiling, "monotonic", clock)
    return clock


def plan_of(config):
    return cpp_profiling.profile_plan(
        base_chunk_tokens=BASE_CHUNK_TOKENS,
        points=config.profile_points,
        repeats=config.profile_repeats,
        history_points=config.profile_history_points,
        max_history_tokens=MAX_HISTORY,
    )


def start(device, caplog, config):
    caplog.set_level(logging.INFO, logger=cpp_profiling.logger.name)
    limits = ChunkLimits(base_chunk_tokens=BASE_CHUNK_TOKENS, max_model_len=MAX_HISTORY + BASE_CHUNK_TOKENS)
    kwargs = dict(fingerprint={"model": "m"}, measure=device, max_history_tokens=MAX_HISTORY)
    result = cpp_profiling.initialise_profile(config, limits, 4, **kwargs)
    lines = [r.getMessage() for r in caplog.records if r.name == cpp_profiling.logger.name]
    return result, lines


PROGRESS = re.compile(r"\[CPP\] start-up profile: (\d+) of (\d+) runs done in (.+), about (.+) left at this pace")


def progress_lines(lines):
    return [PROGRESS.fullmatch(line).groups() for line in lines if PROGRESS.fullmatch(line)]


def test_a_long_profile_logs_a_few_lines_with_the_runs_done_of_planned_and_what_is_left(clock, caplog):
    config = CppConfig(cache_dir="")  # the default plan: 210 runs, ten and a half minutes at 3 s a run
    plan = plan_of(config)
    planned = len(plan)
    device = SlowDevice(clock)
    result, lines = start(device, caplog, config)
    assert result.verdict.model is not None and device.runs == planned + cpp_profiling.WARMUP_RUNS
    assert lines[0] == (
        f"[CPP] start-up profile: {planned} runs over {len(set(plan))} points after "
        f"{cpp_profiling.WARMUP_RUNS} warm-up runs ({planned} more if too noisy to decide, up to "
        f"{cpp_profiling.after_rounds_budget(plan)} to measure falls again, place steps and odd points' reach)"
    )
    shown = progress_lines(lines)
    assert 5 <= len(shown) <= 1 / cpp_profiling.PROGRESS_SHARE  # a few, never one a run
    done = [int(d) for d, _, _, _ in shown]
    assert done == sorted(done) and min(b - a for a, b in zip(done, done[1:], strict=False)) >= planned // 10
    for runs, of, elapsed, left in shown:
        # The clock moved 3 s a run, warm-up included; the pace is that of the runs, not the warm-up.
        assert int(of) == planned
        assert elapsed == cpp_profiling._duration(RUN_S * (int(runs) + cpp_profiling.WARMUP_RUNS))
        assert left == cpp_profiling._duration(RUN_S * (planned - int(runs)))
    # The verdict line (the source of the latency model) carries the whole profile's time.
    total = cpp_profiling._duration(RUN_S * device.runs)
    assert result.source == f"profiled ({planned} runs after {cpp_profiling.WARMUP_RUNS} warm-up in {total})"
    assert total == "10 min 24 s"


def test_a_quick_profile_logs_no_progress_only_its_plan(clock, caplog):
    device = SlowDevice(clock, run_s=0.001)  # a small model: a millisecond a run, a fraction of a second in all
    result, lines = start(device, caplog, CppConfig(cache_dir=""))
    assert result.verdict.model is not None
    assert len(lines) == 1 and lines[0].startswith("[CPP] start-up profile: ") and not progress_lines(lines)


def test_a_second_round_is_announced_with_its_reason_and_counted_in_the_plan(clock, caplog):
    config = CppConfig(cache_dir="", profile_points=10, profile_repeats=2, profile_history_points=2)
    planned = len(plan_of(config))
    device = SlowDevice(clock, slow_first_round=cpp_profiling.WARMUP_RUNS + planned // 2)  # the first pass
    result, lines = start(device, caplog, config)
    assert result.verdict.model is not None
    second = [line for line in lines if "second round" in line]
    assert len(second) == 1 and "because unstable decisions: " in second[0], lines  # the slow spell's pass
    assert f"the same {planned} runs once more ({planned} of {2 * planned} done in" in second[0]
    shown = progress_lines(lines)
    assert {int(of) for _, of, _, _ in shown} == {planned, 2 * planned}
    assert len(shown) <= 2 / cpp_profiling.PROGRESS_SHARE
    assert result.source.startswith(f"profiled ({device.runs - cpp_profiling.WARMUP_RUNS} runs after")


def test_a_refused_profile_names_its_time_in_the_reason_the_warning_shows(clock, caplog):
    """Without a model the scheduler's line is the reason alone: the profile's time is in it."""
    device = SlowDevice(clock)
    broken = lambda c, h: device(c, h) * (float("nan") if c >= 64 else 1.0)  # noqa: E731  (no measurement)
    result, _ = start(broken, caplog, CppConfig(cache_dir="", profile_points=10, profile_repeats=1))
    assert result.verdict.model is None and "no usable profile" in result.verdict.reason
    total = cpp_profiling._duration(RUN_S * device.runs)
    assert result.verdict.reason.endswith(f"; profiled: {device.runs - 2} runs after 2 warm-up in {total}")


def test_runs_made_to_measure_a_fall_again_are_counted_in_a_failures_message(clock, caplog, monkeypatch):
    """The verdict asks for two points again (a fall it doubts): those runs are counted like the plan's, so a
    worker that fails among them is reported with every run made."""
    config = CppConfig(cache_dir="", profile_points=10, profile_repeats=2, profile_history_points=2)
    planned, judge = len(plan_of(config)), cpp_profiling.judge
    asked = [(BASE_CHUNK_TOKENS, 0), (BASE_CHUNK_TOKENS // 2, 0)]
    verdicts = iter([lambda v: dataclasses.replace(v, remeasure=tuple(asked))])
    monkeypatch.setattr(cpp_profiling, "judge", lambda *a, **k: next(verdicts, lambda v: v)(judge(*a, **k)))
    device = SlowDevice(clock, run_s=0.001)

    def failing_on_the_second_run_asked_again(chunk_tokens, history_tokens):
        if device.runs == cpp_profiling.WARMUP_RUNS + planned + 1:
            raise RuntimeError("worker lost")
        return device(chunk_tokens, history_tokens)

    result, lines = start(failing_on_the_second_run_asked_again, caplog, config)
    assert any("measured again" in line for line in lines), lines
    assert result.verdict.model is None and "worker lost" in result.verdict.reason
    assert f"; {planned + 1} runs in " in result.verdict.reason, result.verdict.reason
