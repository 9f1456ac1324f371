"""The twin's discrete-event core against timelines computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twin_scripted import ScriptedDriver, timer_from_table
from vllm_ascend_patchset.twin.pipeline import Pipeline, SchedulerStuck, run_pipeline
from vllm_ascend_patchset.twin.report import compute_figures


def test_two_stages_three_chunks_by_hand():
    # Chunk sizes stand for chunks of 1, 2 and 3 ms per stage.
    #   t=0: batch queue of 2 -> schedule c1 and c2.  c1: S0 [0,1] S1 [1,2]; c2: S0 [1,3] S1 [3,5]
    #   t=2: c1 out -> schedule c3: S0 [3,6] S1 [6,9]
    #   t=5: c2 out -> schedule nothing (empty batch, ready with c3) -> queue full -> wait
    #   t=9: c3 out -> first token.  TTFT 9.
    #   Stage 0 busy 6 of 9 -> idle 3 (drain), no gap between its chunks.
    #   Stage 1 idle [0,1] (fill), [2,3], [5,6] -> 3, of which 2 between its chunks.
    driver = ScriptedDriver([100, 200, 300])
    records = run_pipeline(driver, timer_from_table({100: (1, 1), 200: (2, 2), 300: (3, 3)}), num_stages=2)
    real = [r for r in records if r.chunks]
    assert [r.submit_ms for r in real] == [0, 0, 2]
    assert [r.stage_start_ms for r in real] == [(0, 1), (1, 3), (3, 6)]
    assert [r.stage_end_ms for r in real] == [(1, 2), (3, 5), (6, 9)]
    assert driver.log.token_ms == [9]
    figures = compute_figures("by-hand", records, [driver.log], num_stages=2)
    assert figures.ttft_mean_ms == 9
    assert figures.bubble_per_stage == pytest.approx((3 / 9, 3 / 9))
    assert figures.steady_bubble_per_stage == pytest.approx((0.0, 2 / 9))
    assert figures.num_chunks == 3
    assert figures.prefill_tokens_per_s == pytest.approx(600 / 9 * 1000)


def test_arrival_later_than_zero_shifts_the_timeline():
    driver = ScriptedDriver([100, 200, 300], arrival_ms=50.0)
    run_pipeline(driver, timer_from_table({100: (1, 1), 200: (2, 2), 300: (3, 3)}), num_stages=2)
    assert driver.log.token_ms == [59]


def test_uneven_stage_split_the_slow_stage_paces_the_pipeline():
    # Stage 1 takes twice stage 0's time: S0 [0,1],[1,2],[2,3]; S1 [1,3],[3,5],[5,7]; but the
    # queue holds 2, so c3 is submitted only when c1 leaves S1 at t=3: S0 [3,4], S1 [5,7].
    driver = ScriptedDriver([100, 101, 102])
    records = run_pipeline(driver, lambda chunks, index: (1.0, 2.0), num_stages=2)
    real = [r for r in records if r.chunks]
    assert [r.stage_start_ms for r in real] == [(0, 1), (1, 3), (3, 5)]
    assert driver.log.token_ms == [7]


@settings(max_examples=40, deadline=None)
@given(
    num_stages=st.integers(1, 8),
    num_chunks=st.integers(1, 40),
    stage_ms=st.floats(0.5, 50.0, allow_nan=False),
)
def test_constant_time_chunks_leave_no_bubble_after_fill(num_stages, num_chunks, stage_ms):
    """Equal chunks keep every stage busy from its first chunk to its last; TTFT is (N + P - 1) stage times."""
    driver = ScriptedDriver([64] * num_chunks)
    records = run_pipeline(driver, lambda chunks, index: (stage_ms,) * num_stages, num_stages=num_stages)
    figures = compute_figures("constant", records, [driver.log], num_stages)
    assert figures.steady_bubble_per_stage == pytest.approx((0.0,) * num_stages, abs=1e-9)
    assert figures.ttft_mean_ms == pytest.approx((num_chunks + num_stages - 1) * stage_ms)
    # Fill plus drain is all the idle time there is: (P - 1) stage times per stage.
    expected = (num_stages - 1) * stage_ms / figures.work_ms
    assert figures.bubble_per_stage == pytest.approx((expected,) * num_stages)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 20.0, allow_nan=False), min_size=1, max_size=30), st.integers(1, 6))
def test_growing_chunk_times_never_finish_before_their_stages_allow(times_ms, num_stages):
    """Flow-shop invariants: a batch starts a stage after the previous stage and the previous batch."""
    sizes = list(range(100, 100 + len(times_ms)))
    table = {size: (t,) * num_stages for size, t in zip(sizes, times_ms, strict=True)}
    driver = ScriptedDriver(sizes)
    records = [r for r in run_pipeline(driver, timer_from_table(table), num_stages) if r.chunks]
    for i, record in enumerate(records):
        assert record.stage_start_ms[0] >= record.submit_ms
        for s in range(1, num_stages):
            assert record.stage_start_ms[s] >= record.stage_end_ms[s - 1]
        if i:
            for s in range(num_stages):
                assert record.stage_start_ms[s] >= records[i - 1].stage_end_ms[s]
    # The first token cannot come before the whole prompt has passed through stage 0 and the
    # last chunk through the remaining stages.
    assert driver.log.token_ms[0] >= sum(times_ms) + (num_stages - 1) * times_ms[-1] - 1e-9


def test_pipeline_rejects_a_wrong_number_of_stage_times():
    with pytest.raises(ValueError, match="2 stage times for 3 stages"):
        Pipeline(3).submit(0.0, (1.0, 1.0))


def test_a_scheduler_that_never_schedules_is_reported_not_looped_forever():
    class Stuck(ScriptedDriver):
        def schedule(self):
            return (), None

    with pytest.raises(SchedulerStuck, match="schedules no tokens"):
        run_pipeline(Stuck([100]), lambda chunks, index: (1.0,), num_stages=1)


def test_a_request_that_arrives_at_no_finite_time_is_reported_not_waited_for():
    # A clock moved to NaN never reaches the arrival: the run would spin for ever.
    with pytest.raises(SchedulerStuck, match="arrives at nan ms; arrival times must be finite"):
        run_pipeline(ScriptedDriver([100], arrival_ms=float("nan")), lambda chunks, index: (1.0,), num_stages=1)
