"""The traffic: Traffic's estimate, the queueing wait, the tuned fixed chunk, rule 4's bound, the queue in the plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cpp_samples import CPU_LIKE, NPU_LIKE, TRUE, Tiles, Waves, located_model, measured_model
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_planner import TUNED_CHUNK_SLACK, plan_target, target_bounds
from vllm_ascend.core.cpp_traffic import (
    MIN_ARRIVALS,
    MIN_ROOM,
    NO_LOAD,
    STEADY_WINDOWS,
    TRAFFIC_WINDOW,
    Load,
    Traffic,
    chunk_for_decodes,
    fixed_chunk_batch_ms,
    fixed_chunk_ttft_ms,
    queue_wait_ms,
    tuned_fixed_chunk,
)

LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072)
PROMPTS = ((0, 16_000), (0, 4000), (2000, 30_000), (0, 8000))


def rule_for(truth, num_stages, limits=LIMITS):
    return ChunkRule(measured_model(truth, noise=0.0, max_history_tokens=limits.max_model_len), limits, num_stages)


# Traffic


def test_no_rate_until_enough_arrivals():
    traffic = Traffic()
    for second in range(MIN_ARRIVALS - 1):
        traffic.arrived(float(second))
    assert traffic.load().arrivals_per_ms == 0.0
    traffic.arrived(float(MIN_ARRIVALS - 1))
    load = traffic.load()
    assert load.arrivals_per_ms == pytest.approx(1e-3)  # one a second
    assert load.rate_error == pytest.approx(1.0 / math.sqrt(MIN_ARRIVALS - 1))


def test_arrivals_at_one_instant_give_no_rate():
    traffic = Traffic()
    for _ in range(TRAFFIC_WINDOW):
        traffic.arrived(5.0)
    assert traffic.load().arrivals_per_ms == 0.0


def test_the_rate_follows_the_latest_arrivals_and_its_error_shrinks_with_them():
    traffic = Traffic()
    for second in range(100):  # slow traffic long ago
        traffic.arrived(10.0 * second)
    start = 1000.0
    for i in range(TRAFFIC_WINDOW):  # then 4 a second
        traffic.arrived(start + 0.25 * i)
    load = traffic.load()
    assert load.arrivals_per_ms == pytest.approx(4e-3)
    assert load.rate_error == pytest.approx(1.0 / math.sqrt(TRAFFIC_WINDOW - 1))


def test_the_steady_rate_spans_many_windows_of_arrivals():
    """The latest window follows a burst; the steady rate, over STEADY_WINDOWS windows, barely moves."""
    traffic = Traffic()
    for second in range(200):  # one arrival every 10 s
        traffic.arrived(10.0 * second)
    for i in range(1, TRAFFIC_WINDOW + 1):  # then a burst: 4 a second
        traffic.arrived(1990.0 + 0.25 * i)
    load = traffic.load()
    assert load.arrivals_per_ms == pytest.approx(4e-3)
    kept = TRAFFIC_WINDOW * STEADY_WINDOWS
    first = 10.0 * (200 - (kept - TRAFFIC_WINDOW))  # the oldest arrival still kept
    assert load.steady_per_ms == pytest.approx((kept - 1) / ((1990.0 + 0.25 * TRAFFIC_WINDOW - first) * 1000.0))
    assert load.steady_error == pytest.approx(1.0 / math.sqrt(kept - 1))
    steady = load.steady()
    assert (steady.arrivals_per_ms, steady.rate_error) == (load.steady_per_ms, load.steady_error)
    assert steady.jobs == load.jobs
    assert Load(1e-3, 0.1, PROMPTS).steady() == Load(1e-3, 0.1, PROMPTS)  # none measured: the rate as it is


def test_a_prefill_counts_once_as_first_held_and_the_sample_is_bounded():
    traffic = Traffic()
    traffic.held("a", 0, 9000)
    traffic.held("a", 4096, 4904)  # the same prompt, a chunk later: not a second job
    traffic.held("done", 100, 0)  # nothing left to prefill: not a job
    assert traffic.load().jobs == ((0, 9000),)
    for i in range(2 * TRAFFIC_WINDOW):
        traffic.held(f"r{i}", 0, 100 + i)
    jobs = traffic.load().jobs
    assert len(jobs) == TRAFFIC_WINDOW
    assert jobs[0] == (0, 100 + TRAFFIC_WINDOW) and jobs[-1] == (0, 100 + 2 * TRAFFIC_WINDOW - 1)


# The queueing wait


def test_the_wait_is_pollaczek_khinchine_away_from_saturation():
    service_ms = np.array([[100.0, 300.0], [50.0, 50.0]])
    rate = 1e-3  # utilisation 0.2 and 0.05
    wait = queue_wait_ms(Load(rate, 0.01), service_ms)
    expected = [rate * (100.0**2 + 300.0**2) / 2 / (2 * (1 - rate * 200.0)), rate * 2500.0 / (2 * (1 - rate * 50.0))]
    assert wait == pytest.approx(expected)


def test_near_and_past_saturation_the_wait_stays_finite_and_grows_with_the_work():
    service_ms = np.array([[900.0], [1000.0], [2000.0], [4000.0]])
    wait = queue_wait_ms(Load(1e-3, 0.0), service_ms)  # utilisation 0.9, 1, 2, 4
    assert np.all(np.isfinite(wait)) and np.all(np.diff(wait) > 0)
    assert wait[1] == pytest.approx(1e-3 * 1000.0**2 / (2 * MIN_ROOM))
    # An uncertain rate keeps as much room as its error.
    assert queue_wait_ms(Load(1e-3, 0.5), service_ms)[1] == pytest.approx(1e-3 * 1000.0**2 / (2 * 0.5))


# The tuned fixed chunk


def profiled_sizes(rule):
    return [c for c in rule.model.chunk_tokens if rule.limits.floor_tokens <= c <= rule.limits.cap_tokens]


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, Tiles(256)], ids=["true", "npu", "cpu", "tiles"])
@pytest.mark.parametrize("stages", [2, 8])
def test_the_tuned_chunk_is_a_profiled_size_and_never_smaller_under_more_load(truth, stages):
    """More load weighs a chunk's tokens per millisecond more against the fill and drain it costs.
    Where the time per token is flat in the chunk (CPU-like) a larger chunk saves no work, and at 8
    stages its rise to the deepest batch, paid P - 1 times per prompt, keeps the smallest one best."""
    rule = rule_for(truth, stages)
    rates = (0.0, 1e-4, 1e-3, 2e-3, 3e-3, 5e-3)
    chunks = [tuned_fixed_chunk(rule, Load(rate, 0.05, PROMPTS), rule.model.fixed_ms) for rate in rates]
    assert all(chunk in profiled_sizes(rule) for chunk in chunks)
    assert chunks == sorted(chunks)
    assert chunks[-1] > chunks[0] or (truth is CPU_LIKE and stages == 8 and chunks[0] == min(profiled_sizes(rule)))


def test_without_load_a_deeper_pipeline_tunes_a_smaller_chunk():
    sizes = [tuned_fixed_chunk(rule_for(TRUE, stages), Load(0.0, 1.0, ((0, 32_768),)), 5.0) for stages in (1, 2, 8)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


def packed_batches(held, chunk):
    """(tokens, history) segments of each batch a fixed chunk makes: the prompts' tokens in FCFS order,
    cut every ``chunk`` tokens (vLLM's token budget spans requests)."""
    batches, current, room = [], [], chunk
    for history, remaining in held:
        while remaining > 0:
            take = min(room, remaining)
            current.append((take, history))
            history, remaining, room = history + take, remaining - take, room - take
            if room == 0:
                batches.append(current)
                current, room = [], chunk
    return batches + ([current] if current else [])


@pytest.mark.parametrize("truth", [TRUE, CPU_LIKE, Tiles(256)], ids=["true", "cpu", "tiles"])
@pytest.mark.parametrize("chunk", [512, 2048, 8192])
def test_the_fixed_chunk_batch_time_is_the_mean_over_its_full_batches(truth, chunk):
    rule = rule_for(truth, 4)
    held = [(0, 3 * 8192), (4000, 6 * 8192), (0, 300)]
    full = [b for b in packed_batches(held, chunk) if sum(t for t, _ in b) == chunk]
    exact = 7.0 + float(np.mean([sum(rule.model.request_ms(t, h) for t, h in b) for b in full]))
    assert fixed_chunk_batch_ms(rule, held, chunk, 7.0) == pytest.approx(exact, rel=0.03)


def fixed_chunk_served_ttft_ms(rule, prompts, arrivals_ms, chunk, fixed_ms):
    """Prompts arriving at ``arrivals_ms`` under a fixed chunk, as vLLM's engine serves them: a batch
    starts when the first stage is free and the batch P places ahead has left the last (at most P
    in flight), holds the arrived prompts' tokens in FCFS order up to the chunk, and spends its
    time on every stage in turn. Their mean TTFT (ms)."""
    stages = rule.num_stages
    free_ms, done_ms = [0.0] * stages, []
    left, history = [n for _, n in prompts], [h for h, _ in prompts]
    ttft_ms, head = [0.0] * len(prompts), 0
    while head < len(prompts):
        start_ms = max(free_ms[0], done_ms[-stages] if len(done_ms) >= stages else 0.0, arrivals_ms[head])
        batch_ms, ended, room, index = fixed_ms, [], chunk, head
        while room and index < len(prompts) and arrivals_ms[index] <= start_ms:
            take = min(room, left[index])
            batch_ms += rule.model.request_ms(take, history[index])
            history[index], left[index], room = history[index] + take, left[index] - take, room - take
            if left[index] == 0:
                ended, index = ended + [index], index + 1
        for stage in range(stages):
            start_ms = max(start_ms, free_ms[stage]) + batch_ms
            free_ms[stage] = start_ms
        done_ms.append(start_ms)
        for prompt in ended:
            ttft_ms[prompt] = start_ms - arrivals_ms[prompt]
        head = index
    return float(np.mean(ttft_ms))


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, Tiles(256)], ids=["true", "npu", "cpu", "tiles"])
@pytest.mark.parametrize("stages", [2, 4, 8])
def test_the_tuned_chunk_is_the_best_for_traffic_served_through_the_stages(truth, stages):
    """At most P batches are in flight: where the batches shorten at a prompt's end, the next
    prompt's batches restart behind its last one and pay their own rise to their deepest again.
    Under Poisson arrivals at half the pipeline's capacity, the tuned chunk is within 3.5% of the
    best fixed chunk, the traffic served batch by batch through the stages."""
    rule = rule_for(truth, stages)
    fixed_ms = rule.model.fixed_ms
    prompts = [(0, n) for n in (56_000, 6000, 30_000, 12_000, 2000, 40_000)] * 6
    mean_ms = np.mean([sum(rule.model.request_ms(min(1024, n - h), h) for h in range(0, n, 1024)) for _, n in prompts])
    gaps = np.random.default_rng(0).exponential(2.0 * mean_ms, len(prompts))
    arrivals = list(np.cumsum(gaps) - gaps[0])
    served = {c: fixed_chunk_served_ttft_ms(rule, prompts, arrivals, int(c), fixed_ms) for c in profiled_sizes(rule)}
    tuned = tuned_fixed_chunk(rule, Load(0.5 / mean_ms, 0.05, tuple(prompts[:16])), fixed_ms)
    assert served[tuned] <= min(served.values()) * 1.035


# Rule 4 and the load in the plan


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE])
@pytest.mark.parametrize("stages", [2, 4])
def test_with_decodes_the_target_is_bounded_by_the_tuned_chunk(truth, stages):
    rule = rule_for(truth, stages)
    held = [(0, 60_000), (0, 12_000)]
    fixed_ms = rule.model.fixed_ms + 2.0
    load = Load(2e-4, 0.2, PROMPTS)
    tuned = chunk_for_decodes(rule, load, fixed_ms, len(held), TUNED_CHUNK_SLACK)
    bound = fixed_chunk_batch_ms(rule, held, tuned, fixed_ms)
    low, high = target_bounds(rule, held, fixed_ms)
    alone = plan_target(rule, held, fixed_ms=fixed_ms, load=load).target_ms
    plan = plan_target(rule, held, fixed_ms=fixed_ms, decoding=16, load=load)
    planned = plan.target_ms
    assert low * (1 - 1e-6) <= planned <= max(low, min(bound, high)) * (1 + 1e-6)
    assert planned <= alone * (1 + 1e-6)  # decodes never lengthen the batches
    # Nor does any chunk exceed the tuned one, at any history: no batch is longer than its there.
    for history in (0, 2000, 20_000, 70_000):
        assert rule.wanted_chunk(history, 10**6, plan) <= tuned
    assert plan.batch_tokens == tuned  # and prefills packed in one batch share that many tokens
    assert plan_target(rule, held, fixed_ms=fixed_ms, load=load).batch_tokens == math.inf  # none without decodes


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE])
def test_the_decode_bound_takes_the_smallest_chunk_near_the_best(truth):
    """With a slack, the tuned chunk is the smallest size within it of the least predicted mean TTFT:
    never larger than the best one, and no larger as the slack grows."""
    rule = rule_for(truth, 4)
    load = Load(2e-4, 0.2, PROMPTS)
    sizes = [tuned_fixed_chunk(rule, load, rule.model.fixed_ms, 2, slack) for slack in (0.0, 0.02, 0.05, 0.2, 1e9)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] == min(c for c in rule.model.chunk_tokens if c >= rule.limits.floor_tokens)  # any size at all
    assert sizes[0] > sizes[-1]


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE])
def test_the_decode_bound_moves_a_little_with_a_small_change(truth):
    """Near the flat bottom of the predicted TTFT curve, a change of a percent in the model (here: in
    the bound, the same thing relative to the curve) moves the tuned chunk by about as much, never
    by a ladder step: the chunk is read where the curve crosses the bound between profiled sizes."""
    rule = rule_for(truth, 2)
    load = Load(2e-4, 0.2, PROMPTS)
    slacks = np.geomspace(1e-3, 0.4, 60)
    chunks = [tuned_fixed_chunk(rule, load, rule.model.fixed_ms, 2, float(slack)) for slack in slacks]
    assert chunks == sorted(chunks, reverse=True)
    assert max(chunks) / min(chunks) >= 2  # the sweep crosses ladder steps (of 1.33x and 1.5x)
    steps = [a / b for a, b in zip(chunks, chunks[1:], strict=False)]
    assert max(steps) < 1.1
    ladder = sorted(c for c in rule.model.chunk_tokens if c >= rule.limits.floor_tokens)
    assert any(c not in ladder for c in chunks)  # read between the sizes, not snapped to them


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE])
def test_the_decode_bound_is_never_a_profiled_size_above_the_bound(truth):
    """Read between two sizes, the chunk is rounded up: never down onto the size outside the bound."""
    rule = rule_for(truth, 2)
    load, fixed_ms = Load(2e-4, 0.2, PROMPTS), rule.model.fixed_ms
    ladder = np.array([c for c in rule.model.chunk_tokens if c >= rule.limits.floor_tokens], dtype=np.float64)
    curve = fixed_chunk_ttft_ms(rule, load, fixed_ms, 2, ladder)
    # Bounds a hair below each size's TTFT: that size is just outside, the crossing just above it.
    for size, ttft in zip(ladder, curve, strict=True):
        slack = ttft * (1 - 1e-7) / curve.min() - 1
        if slack > 0:
            chunk = tuned_fixed_chunk(rule, load, fixed_ms, 2, slack)
            assert chunk != size and fixed_chunk_ttft_ms(rule, load, fixed_ms, 2, np.array([chunk]))[0] < ttft


def test_on_a_device_with_waves_the_decode_bound_takes_the_whole_wave():
    """Where the crossing falls inside a wave of the model (a step between profiled sizes), the chunk is the
    wave's end: the same time for the most tokens."""
    truth = Waves(2304, fixed_ms=40.0, wave_ms=100.0)
    model = located_model(truth, LIMITS, 2, LIMITS.max_model_len * 3 // 4)
    rule = ChunkRule(model, LIMITS, 2)
    ends = model.step_lowers()
    assert ends  # the premise: the model has steps
    ladder = sorted(model.chunk_tokens)
    load = Load(2e-4, 0.2, PROMPTS)
    chunks = {tuned_fixed_chunk(rule, load, model.fixed_ms, 2, float(slack)) for slack in np.geomspace(1e-3, 0.5, 40)}
    for chunk in chunks:
        above = min([c for c in ladder if c >= chunk])
        assert chunk in ends or chunk in ladder or not any(chunk < end <= above for end in ends), (chunk, ends)
    assert chunks & set(ends)


def test_the_decode_bound_stays_in_the_basin_of_the_least(monkeypatch):
    """A predicted curve with a second basin within the slack, across a hump: the chunk is read below the
    least in its own basin, never in the other one. (The curve of a mixed-traffic replay on a measured
    surface: 256 tokens predicted 2.7% over the least at 768, 512 21% over it; the replay measured 5%
    and 44%, and capped at 256 tokens CPP lost 13% of mean TTFT to fixed 768-token chunks.)"""
    curve = {64: 235.7, 96: 230.2, 128: 207.2, 192: 172.4, 256: 164.0, 384: 168.6, 512: 193.8, 768: 159.6}
    curve.update({1024: 179.1, 1536: 198.2, 2048: 217.2, 3072: 256.2, 4096: 297.0, 6144: 340.0, 8192: 390.0})

    def two_basins(rule, load, fixed_ms, pending, sizes):
        return np.array([curve.get(int(c), 500.0) for c in sizes])

    monkeypatch.setattr("vllm_ascend.core.cpp_traffic.fixed_chunk_ttft_ms", two_basins)
    rule = rule_for(TRUE, 4)
    assert {256, 512, 768} <= set(rule.model.chunk_tokens)  # the premise: the curve's sizes are profiled
    chunk = tuned_fixed_chunk(rule, Load(2e-4, 0.2, PROMPTS), rule.model.fixed_ms, 2, TUNED_CHUNK_SLACK)
    assert 512 < chunk <= 768
    # A slack wide enough to take the hump in makes the basins one: then the smaller sizes are near the best.
    assert tuned_fixed_chunk(rule, Load(2e-4, 0.2, PROMPTS), rule.model.fixed_ms, 2, 0.25) < 256


def test_a_curve_with_no_finite_least_is_an_error():
    rule = rule_for(TRUE, 2)
    with pytest.raises(ValueError, match="not finite"):
        tuned_fixed_chunk(rule, Load(2e-4, 0.2, PROMPTS), math.nan, 2, TUNED_CHUNK_SLACK)


def test_on_a_tiled_device_the_decode_bound_is_whole_tiles_or_a_profiled_size():
    limits = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072, granule_tokens=256)
    rule = rule_for(Tiles(256), 4, limits)
    load = Load(2e-4, 0.2, PROMPTS)
    ladder = set(rule.model.chunk_tokens)
    for slack in np.linspace(0.01, 0.4, 40):
        chunk = tuned_fixed_chunk(rule, load, rule.model.fixed_ms, 2, float(slack))
        assert chunk % 256 == 0 or chunk in ladder, (slack, chunk)


def test_a_burst_does_not_lengthen_the_batches_decodes_wait_for():
    """Rule 4's chunk is tuned for the traffic at large (its steady rate), not for a burst's rate."""
    rule = rule_for(TRUE, 4)
    held = [(0, 60_000), (0, 12_000)]
    fixed_ms = rule.model.fixed_ms + 2.0
    steady = chunk_for_decodes(rule, Load(1e-4, 0.1, PROMPTS), fixed_ms, len(held), TUNED_CHUNK_SLACK)
    burst = chunk_for_decodes(rule, Load(5e-3, 0.1, PROMPTS), fixed_ms, len(held), TUNED_CHUNK_SLACK)
    assert burst > steady  # the premise: a burst alone would tune a larger chunk
    load = Load(5e-3, 0.1, PROMPTS, steady_per_ms=1e-4, steady_error=0.1)
    assert plan_target(rule, held, fixed_ms=fixed_ms, decoding=4, load=load).batch_tokens == steady


def test_load_makes_the_planner_value_throughput_on_a_step_bound_device():
    rule = rule_for(NPU_LIKE, 8)
    held = [(0, 32_768)]
    alone = plan_target(rule, held, load=NO_LOAD).target_ms
    loaded = [plan_target(rule, held, load=Load(rate, 0.1, PROMPTS)).target_ms for rate in (1e-3, 3e-3)]
    assert alone <= loaded[0] <= loaded[1] and loaded[1] > alone


def test_a_load_without_jobs_samples_the_held_prefills():
    rule = rule_for(TRUE, 4)
    held = [(0, 40_000), (0, 3000)]
    without = plan_target(rule, held, load=Load(3e-4, 0.1)).target_ms
    sampled = plan_target(rule, held, load=Load(3e-4, 0.1, tuple(held))).target_ms
    assert without == pytest.approx(sampled)


# Packing and the queue


@pytest.mark.parametrize("chunk", [512, 2048])
def test_a_fixed_chunk_packs_short_prompts_into_its_batches(chunk):
    rule = rule_for(TRUE, 4)
    short = [(0, 100)] * 8
    token_ms = rule.model.request_ms(100, 0) / 100
    assert fixed_chunk_batch_ms(rule, short, chunk, 3.0) == pytest.approx(3.0 + min(chunk, 800) * token_ms, rel=0.02)
    # Queued tokens fill the batch up to the chunk, at the held prompts' cost per token.
    full_ms = 3.0 + chunk * token_ms
    assert fixed_chunk_batch_ms(rule, short, chunk, 3.0, queued_tokens=10_000) == pytest.approx(full_ms, rel=0.02)


def test_many_waiting_prompts_tune_a_larger_fixed_chunk():
    """One of many waiting prompts waits for half the others: a chunk's tokens per ms count more."""
    rule = rule_for(TRUE, 8)
    jobs = Load(0.0, 1.0, ((0, 20_000),) * 16)
    chunks = [tuned_fixed_chunk(rule, jobs, rule.model.fixed_ms, pending) for pending in (1, 4, 16, 64)]
    assert chunks == sorted(chunks) and chunks[-1] > chunks[0]


def test_a_queue_behind_the_held_prefills_counts_as_they_would_one_by_one():
    """Prefills after the first PLAN_MAX_PREFILLS count by number and tokens: for equal prompts
    the queue's predicted mean TTFT is the one of planning each."""
    from vllm_ascend.core import cpp_planner

    rule = rule_for(TRUE, 4)
    prompts = [(0, 600)] * 24
    targets = np.array([20.0, 60.0, 200.0])
    efficient = rule.efficient_chunks()
    one_by_one, _ = cpp_planner.predicted_ttft_ms(rule, prompts, targets, rule.model.fixed_ms, 0.0, efficient)
    head, behind = prompts[: cpp_planner.PLAN_MAX_PREFILLS], prompts[cpp_planner.PLAN_MAX_PREFILLS :]
    queued = (len(behind), sum(r for _, r in behind))
    as_queue, _ = cpp_planner.predicted_ttft_ms(
        rule, head, targets, rule.model.fixed_ms, 0.0, efficient, NO_LOAD, queued
    )
    assert as_queue == pytest.approx(one_by_one, rel=0.02)


def test_a_queue_of_short_prompts_gets_batches_that_pack_them():
    """A burst of short prompts: the plan puts several in a batch (not one per batch, as a
    fixed chunk of a prompt's size would), with decodes running too; the drain of a full batch
    keeps the batches from growing to the cap."""
    rule = rule_for(TRUE, 4)
    burst = [(0, 200)] * 64
    one_prompt_ms = rule.model.fixed_ms + rule.model.request_ms(200, 0)
    _, high = target_bounds(rule, burst[:8], rule.model.fixed_ms)
    for decoding in (0, 32):
        fixed_ms = rule.model.fixed_ms + (1.0 if decoding else 0.0)
        target = plan_target(rule, burst, fixed_ms=fixed_ms, decoding=decoding).target_ms
        assert 1.5 * one_prompt_ms < target < high / 2
