"""core/cpp_held.py: what the scheduler reads of vLLM's queues for the plan and the allotment."""

from __future__ import annotations

from types import SimpleNamespace

from vllm_ascend.core.cpp_held import PrefixHits, allotment_candidates, plan_shape


class Coordinator:
    """A prefix cache that counts its lookups; ``hit_tokens`` is what it holds of any prompt."""

    def __init__(self, hit_tokens: int) -> None:
        self.hit_tokens = hit_tokens
        self.lookups = 0

    def find_longest_cache_hit(self, block_hashes, max_length):
        self.lookups += 1
        return None, min(self.hit_tokens, max_length)


def _scheduler(hit_tokens: int, waiting: list):
    coordinator = Coordinator(hit_tokens)
    manager = SimpleNamespace(enable_caching=True, coordinator=coordinator)
    return SimpleNamespace(kv_cache_manager=manager, skipped_waiting=[], waiting=waiting), coordinator


def _request(request_id: str, num_tokens: int, arrival_time: float = 0.0, computed: int = 0):
    return SimpleNamespace(
        request_id=request_id,
        num_tokens=num_tokens,
        num_computed_tokens=computed,
        block_hashes=(),
        arrival_time=arrival_time,
    )


def test_waiting_prompts_are_allotted_from_their_prefix_hit_as_it_is_now():
    waiting = [_request("a", 6000), _request("b", 3000)]
    scheduler, cache = _scheduler(1024, waiting)
    running = [_request("r", 8000, computed=2000)]
    hits = PrefixHits()
    prefills = allotment_candidates(scheduler, running, 8, 1.0, hits)
    assert [p[:3] for p in prefills] == [("r", 2000, 6000), ("a", 1024, 4976), ("b", 1024, 1976)]
    assert [p[4] for p in prefills] == [True, False, False]  # the running one has started
    assert hits.tokens(scheduler, waiting[0]) == 1024 and cache.lookups == 2  # the plan of the same step
    cache.hit_tokens = 2048  # another prompt cached more of theirs: the next step sees it
    hits.next_step()
    assert allotment_candidates(scheduler, running, 1, 1.0, hits)[1][:3] == ("a", 2048, 3952)
    assert cache.lookups == 3


def test_one_prefill_alone_needs_no_allotment_and_no_lookup():
    scheduler, cache = _scheduler(1024, [_request("a", 6000)])
    assert allotment_candidates(scheduler, [], 8, 1.0, PrefixHits()) == []
    assert cache.lookups == 0


def test_plan_shape_groups_sizes_within_a_factor_of_sqrt2_and_tells_others_apart():
    assert plan_shape([(0, 6000)], 4) == plan_shape([(0, 6100)], 4)
    assert plan_shape([(0, 6000)], 4) != plan_shape([(0, 12000)], 4)
    assert plan_shape([(0, 6000)], 4) != plan_shape([(0, 6000)], 0)
