"""One check for every profile sample, wherever it comes from; grouping into points and their scatter."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_ascend.core.cpp_samples import (
    MAX_LATENCY_MS,
    MIN_LATENCY_MS,
    Point,
    SampleError,
    check_sample,
    check_samples,
    group_points,
)


@pytest.mark.parametrize(
    "sample",
    [(256, 0, 12.5), (1, 65_536, 3), (np.int64(512), np.int64(1024), np.float64(7.25)), [2048, 0, MAX_LATENCY_MS]],
)
def test_measurements_are_admitted_as_ints_and_a_float(sample):
    chunk, history, latency = check_sample(sample)
    assert (type(chunk), type(history), type(latency)) == (int, int, float)
    assert (chunk, history, latency) == (int(sample[0]), int(sample[1]), float(sample[2]))


@pytest.mark.parametrize(
    "sample, names",
    [
        ((256, 0, 1e-320), "latency_ms"),  # a denormal: 1/latency overflows
        ((256, 0, 5e-324), "latency_ms"),
        ((256, 0, 0.0), "latency_ms"),
        ((256, 0, -3.0), "latency_ms"),
        ((256, 0, math.nan), "latency_ms"),
        ((256, 0, math.inf), "latency_ms"),
        ((256, 0, 1e308), "latency_ms"),
        ((256, 0, 10**400), "latency_ms"),
        ((256, 0, True), "latency_ms"),
        ((256, 0, "12.5"), "latency_ms"),
        ((256.0, 0, 12.5), "chunk_tokens"),  # a count written as a float was not written by the profiler
        ((256.5, 0, 12.5), "chunk_tokens"),
        ((True, 0, 12.5), "chunk_tokens"),
        ((0, 0, 12.5), "chunk_tokens"),
        ((10**4000, 0, 12.5), "chunk_tokens"),
        ((256, -1, 12.5), "history_tokens"),
        ((256, False, 12.5), "history_tokens"),
        ((256, "8", 12.5), "history_tokens"),
        ("123", "a sample is"),  # a string unpacked as three characters
        ((256, 0), "a sample is"),
        ({"chunk": 256}, "a sample is"),
    ],
)
def test_anything_else_is_refused_naming_what_is_wrong(sample, names):
    with pytest.raises(SampleError, match=names):
        check_sample(sample)


def test_a_bad_sample_in_a_list_is_named_by_its_index():
    with pytest.raises(SampleError, match="sample 2: latency_ms"):
        check_samples([(256, 0, 1.0), (512, 0, 2.0), (1024, 0, 1e-320)])


def test_the_physical_range_is_a_microsecond_to_hours():
    assert MIN_LATENCY_MS == 1e-3 and 3600e3 < MAX_LATENCY_MS < 24 * 3600e3


def test_points_are_medians_of_their_repeats_sorted_by_history_then_chunk():
    points, _ = group_points([(512, 0, 3.0), (256, 4096, 5.0), (256, 0, 1.0), (256, 0, 9.0), (256, 0, 2.0)])
    assert [(p.chunk_tokens, p.history_tokens, p.median_ms, p.repeats) for p in points] == [
        (256, 0, 2.0, 3),
        (512, 0, 3.0, 1),
        (256, 4096, 5.0, 1),
    ]


@pytest.mark.parametrize("sigma", [0.02, 0.1])
@pytest.mark.parametrize("repeats", [2, 3])
def test_the_scatter_estimates_the_noise_of_one_sample(sigma, repeats):
    rng = np.random.default_rng(1)
    samples = [(c, 0, 100.0 * (1 + sigma * rng.standard_normal())) for c in range(1, 301) for _ in range(repeats)]
    _, scatter = group_points(samples)
    assert scatter == pytest.approx(sigma, rel=0.2)


def test_no_repeats_no_scatter():
    assert group_points([(256, 0, 1.0), (512, 0, 2.0)])[1] == 0.0


def listed_scatter(samples):
    """The scatter as its definition reads: every pair of repeats of a point listed, sorted, the middle one (or
    the mean of the middle two)."""
    by_point = {}
    for chunk, history, latency in samples:
        by_point.setdefault((chunk, history), []).append(latency)
    differences = []
    for values in by_point.values():
        median = statistics.median(values)
        differences += [abs(a - b) / median for a, b in itertools.combinations(values, 2)]
    if not differences:
        return 0.0
    differences.sort()
    middle = len(differences) // 2
    pair_median = differences[middle] if len(differences) % 2 else (differences[middle - 1] + differences[middle]) / 2
    return pair_median / (0.6745 * math.sqrt(2.0))


LATENCIES = st.one_of(
    st.floats(MIN_LATENCY_MS, MAX_LATENCY_MS),  # any time a pass can take
    st.floats(99.0, 101.0),  # close together: their differences keep few bits
    st.sampled_from([MIN_LATENCY_MS, 1.0, 1.5, 10.0, 10.1, 100.0, MAX_LATENCY_MS]),  # ties
)


# A point measured a few times, or many (from 18 repeats, more than 8 pairs a sample: thousands of pairs).
REPEATS = st.one_of(st.lists(LATENCIES, min_size=1, max_size=6), st.lists(LATENCIES, min_size=18, max_size=70))


@settings(max_examples=300, deadline=None)
@given(st.lists(REPEATS, min_size=1, max_size=4), st.randoms())
def test_the_scatter_is_the_median_of_every_listed_pair_to_the_last_bit(repeats_of_points, rng):
    """Any number of points, each measured from once to 70 times, in any order: the same float as the listing."""
    samples = [(chunk, 0, ms) for chunk, repeats in enumerate(repeats_of_points, start=1) for ms in repeats]
    rng.shuffle(samples)
    assert group_points(samples)[1] == listed_scatter(samples)


@pytest.mark.parametrize("seed", range(12))
def test_the_scatter_is_exactly_the_median_of_every_pair_however_many_repeats(seed):
    """Few repeats and many (thousands of pairs) give the listing's float."""
    rng = random.Random(seed)
    samples = []
    for chunk in range(1, rng.randint(2, 6)):
        base_ms = rng.uniform(1.0, 500.0)
        for _ in range(rng.choice([1, 2, 3, 40, 150])):
            # ties (a rounded time repeats exactly) and Gaussian noise
            samples.append((chunk, 0, round(base_ms, 1) if rng.random() < 0.3 else base_ms * (1 + rng.gauss(0, 0.05))))
    rng.shuffle(samples)
    assert group_points(samples)[1] == listed_scatter(samples)


def test_a_point_repeated_as_often_as_a_profile_may_is_one_point_and_the_median_of_its_pairs():
    """200 runs of one point (more than a profile makes of any): 9,900 pairs differ by nothing, 10,000 by 1 ms
    around a median of 10.5 ms, so the median pair is one of the latter."""
    many = [(256, 0, 10.0 + (i % 2)) for i in range(200)]
    assert group_points(many) == ([Point(256, 0, 10.5, 200)], (1 / 10.5) / (0.6745 * math.sqrt(2.0)))
