"""Rule 4's chunk while requests decode: between the slack's chunk and the least TTFT's, the decodes' pace weighed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cpp_samples import CPU_LIKE, NPU_LIKE, TRUE, Bent, Quadratic, Tiles, measured_model, start_up_samples
from vllm_ascend.core.cpp_acceptance import judge
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits, ChunkRule
from vllm_ascend.core.cpp_planner import TUNED_CHUNK_SLACK, plan_target
from vllm_ascend.core.cpp_traffic import (
    Load,
    chunk_for_decodes,
    decode_pace,
    fixed_chunk_batch_ms,
    fixed_chunk_ttft_ms,
    tuned_fixed_chunk,
)

LIMITS = ChunkLimits(base_chunk_tokens=8192, max_model_len=131_072)
PROMPTS = ((0, 16_000), (0, 4000), (2000, 30_000), (0, 8000))


def rule_for(truth, num_stages=4, limits=LIMITS):
    return ChunkRule(measured_model(truth, noise=0.0, max_history_tokens=limits.max_model_len), limits, num_stages)


def busy_rate(rule, fixed_ms, share):
    """The arrival rate at which prefills under the least TTFT's chunk fill ``share`` of the steps."""
    least = np.array([tuned_fixed_chunk(rule, Load(jobs=PROMPTS), fixed_ms, 2)])
    tiny = 1e-9  # arrivals per ms: the share of steps with prefills is this times a job's time
    gained = decode_pace(rule, Load(tiny, 0.1, PROMPTS), fixed_ms, least)[0] - 1.0
    full = decode_pace(rule, Load(jobs=PROMPTS), fixed_ms, least)[0] - 1.0  # no rate yet: every step
    return share * tiny * full / gained


@pytest.mark.parametrize("truth", [TRUE, NPU_LIKE, CPU_LIKE, Bent()])
@pytest.mark.parametrize("rate", [0.0, 1e-5, 2e-4, 5e-3])
def test_the_chunk_lies_between_the_slacks_and_the_least_ttfts(truth, rate):
    rule = rule_for(truth)
    load, fixed_ms = Load(rate, 0.1, PROMPTS), rule.model.fixed_ms + 1.0
    lowest = tuned_fixed_chunk(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
    least = tuned_fixed_chunk(rule, load, fixed_ms, 2)
    chunk = chunk_for_decodes(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
    assert lowest <= chunk <= least
    # Of the chunks between, none has a smaller product of TTFT and pace: the rule is that product's least.
    sizes = np.linspace(lowest, least, 7)
    cost = fixed_chunk_ttft_ms(rule, load, fixed_ms, 2, sizes) * decode_pace(rule, load, fixed_ms, sizes)
    ours = fixed_chunk_ttft_ms(rule, load, fixed_ms, 2, np.array([chunk])) * decode_pace(
        rule, load, fixed_ms, np.array([chunk])
    )
    assert ours[0] <= cost.min() * 1.01


@pytest.mark.parametrize("truth", [TRUE, CPU_LIKE, Bent()])
def test_the_pace_is_the_share_of_steps_with_prefills_at_the_batch_they_make(truth):
    rule = rule_for(truth)
    fixed_ms = rule.model.fixed_ms + 1.0
    sizes = np.array([256.0, 1024.0, 4096.0])
    full = decode_pace(rule, Load(jobs=PROMPTS), fixed_ms, sizes)  # no rate yet: every step carries prefills
    batches = np.array([fixed_chunk_batch_ms(rule, PROMPTS, c, fixed_ms) for c in sizes])
    np.testing.assert_allclose(full, batches / fixed_ms)
    assert np.all(np.diff(full) > 0)  # a larger chunk, a longer batch
    rates = [busy_rate(rule, fixed_ms, share) for share in (1e-4, 0.01, 0.3)] + [1.0]
    paces = [decode_pace(rule, Load(rate, 0.1, PROMPTS), fixed_ms, sizes) for rate in rates]
    for slower, faster in zip(paces, paces[1:], strict=False):
        assert np.all(slower <= faster + 1e-12)  # more traffic, more steps with prefills
    assert np.all(paces[0] >= 1.0) and np.all(paces[0] - 1.0 < 0.01 * (full - 1.0))  # rare prefills: decodes' own pace
    np.testing.assert_allclose(paces[-1], full)  # saturated: every step
    # In between, the mean over decodes each beside prefills or not: a share u of them at the batch.
    least = np.array([tuned_fixed_chunk(rule, Load(jobs=PROMPTS), fixed_ms, 2)])
    third = decode_pace(rule, Load(busy_rate(rule, fixed_ms, 0.3), 0.1, PROMPTS), fixed_ms, least)[0]
    full_least = decode_pace(rule, Load(jobs=PROMPTS), fixed_ms, least)[0]
    assert third - 1.0 == pytest.approx(0.3 * (full_least - 1.0))


@pytest.mark.parametrize("share", [0.01, 0.3])
def test_where_a_steps_fixed_cost_dominates_the_decodes_gain_little_and_the_chunk_stays_at_the_least(share):
    """A chunk's tokens add little to a batch whose fixed cost is large: a smaller chunk would cost the
    prompts' TTFT for a pace the decodes hardly gain. Where the tokens are most of a batch, the decodes'
    pace gains as much as the batch shrinks on the steps with prefills, and the chunk goes down to the slack's."""
    heavy = rule_for(Quadratic(40.0, 0.004, 1e-5, 1e-8, 2e-9))  # a 40 ms step, 4 ms for 1k tokens
    light = rule_for(Quadratic(0.5, 0.02, 1e-5, 1e-8, 2e-9))  # a 0.5 ms step, 20 ms for 1k tokens
    chunks = {}
    for name, rule in (("heavy", heavy), ("light", light)):
        fixed_ms = rule.model.fixed_ms
        load = Load(busy_rate(rule, fixed_ms, share), 0.05, PROMPTS)
        lowest = tuned_fixed_chunk(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
        least = tuned_fixed_chunk(rule, load, fixed_ms, 2)
        assert lowest < least / 1.15  # the premise: the slack reaches well below the least
        chunk = chunk_for_decodes(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
        chunks[name] = (chunk - lowest) / (least - lowest)  # 0: the slack's chunk, 1: the least's
    assert chunks["heavy"] == 1.0 and chunks["light"] < 0.5


@pytest.mark.parametrize("truth", [TRUE, Bent(), Quadratic(0.5, 0.02, 1e-5, 1e-8, 2e-9)])
def test_the_busier_the_pipeline_the_nearer_the_chunk_to_the_slacks(truth):
    rule = rule_for(truth)
    fixed_ms = rule.model.fixed_ms
    places = []
    for share in (0.0001, 0.01, 0.1, 0.5, 0.9):
        load = Load(busy_rate(rule, fixed_ms, share), 0.05, PROMPTS)
        lowest = tuned_fixed_chunk(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
        least = tuned_fixed_chunk(rule, load, fixed_ms, 2)
        chunk = chunk_for_decodes(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK)
        places.append(np.log(chunk / lowest) / np.log(least / lowest) if least > lowest else 0.0)
    assert places == sorted(places, reverse=True) and places[0] > places[-1], places


@pytest.mark.parametrize("truth", [TRUE, CPU_LIKE, Bent()])
def test_a_small_change_in_the_traffic_moves_the_chunk_a_little(truth):
    """The chunk is weighed on a grid between profiled sizes: a change of a few percent in the rate moves
    it by little, never from the slack's chunk to the least's at once (by no more than its ends move, and
    one step of the grid)."""
    rule = rule_for(truth)
    fixed_ms = rule.model.fixed_ms + 1.0
    rates = busy_rate(rule, fixed_ms, 0.05) * np.geomspace(0.2, 50.0, 80)
    rows = []
    for rate in rates:
        load = Load(rate, 0.05, PROMPTS)
        lowest, least = (
            tuned_fixed_chunk(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK),
            tuned_fixed_chunk(rule, load, fixed_ms, 2),
        )
        rows.append((chunk_for_decodes(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK), lowest, least))

    def step(a, b):
        return max(a, b) / min(a, b)

    for before, after in zip(rows, rows[1:], strict=False):
        ends = max(step(before[1], after[1]), step(before[2], after[2]))
        assert step(before[0], after[0]) <= 1.2 * ends, rows  # (one step of the grid)
    assert len({row[0] for row in rows} - set(rule.model.chunk_tokens)) > 3  # read between the sizes


def test_beside_decodes_on_a_device_of_heavy_steps_the_plan_keeps_the_least_ttfts_chunk():
    """The plan's chunks while requests decode are capped at rule 4's chunk: on a device whose step's fixed cost
    dominates a batch, that is the least predicted TTFT's, not the slack's smaller one (which cost the prompts'
    TTFT for a pace the decodes hardly gained)."""
    rule = rule_for(Quadratic(40.0, 0.004, 1e-5, 1e-8, 2e-9))
    fixed_ms, held = rule.model.fixed_ms, [(0, 60_000), (0, 12_000)]
    load = Load(busy_rate(rule, fixed_ms, 0.3), 0.05, PROMPTS)
    least = tuned_fixed_chunk(rule, load, fixed_ms, len(held))
    assert tuned_fixed_chunk(rule, load, fixed_ms, len(held), TUNED_CHUNK_SLACK) < least  # the premise
    plan = plan_target(rule, held, fixed_ms=fixed_ms, decoding=8, load=load)
    assert plan.batch_tokens == least


@pytest.mark.parametrize("truth", [Tiles(256, fixed_ms=2.0), Tiles(256)])
def test_on_a_tiled_device_the_chunk_is_whole_tiles(truth):
    """The profile finds the tiles; every chunk weighed between the slack's and the least's is whole tiles."""
    limits = ChunkLimits(base_chunk_tokens=8192, max_model_len=65_536)
    samples = start_up_samples(truth, noise=0.0, max_history_tokens=65_536)
    verdict = judge(samples, limits, 4, max_history_tokens=65_536, last_round=True)
    assert verdict.granule_tokens == 256  # the premise: the tiles are found
    rule = ChunkRule(verdict.model, replace(limits, granule_tokens=256), 4)
    chunks = set()
    for rate in (0.0, 1e-5, 1e-4, 1e-3):
        for fixed_ms in (rule.model.fixed_ms, rule.model.fixed_ms + 1.0):
            load = Load(rate, 0.1, PROMPTS)
            chunks.add(chunk_for_decodes(rule, load, fixed_ms, 2, TUNED_CHUNK_SLACK))
            chunks.add(chunk_for_decodes(rule, load, fixed_ms, 2, 0.2))
    assert all(chunk % 256 == 0 for chunk in chunks), chunks
    assert len(chunks) > 2  # the rule chose among several


def test_bad_input_to_the_pace_is_an_error_naming_it():
    rule = rule_for(TRUE)
    with pytest.raises(ValueError, match="fixed_ms > 0"):
        decode_pace(rule, Load(jobs=PROMPTS), 0.0, np.array([512.0]))
    with pytest.raises(ValueError, match="jobs of > 0 tokens"):
        decode_pace(rule, Load(jobs=((0, 0),)), 5.0, np.array([512.0]))
    with pytest.raises(ValueError, match="sizes > 0"):
        decode_pace(rule, Load(jobs=PROMPTS), 5.0, np.array([0.0]))
