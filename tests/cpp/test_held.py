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


def test_waiting_prompts_are_allotted_from_their_prefix_hit_read_within_a_pipeline_round():
    waiting = [_request("a", 6000), _request("b", 3000)]
    scheduler, cache = _scheduler(1024, waiting)
    running = [_request("r", 8000, computed=2000)]
    hits = PrefixHits(max_age_steps=2)
    prefills = allotment_candidates(scheduler, running, 8, 1.0, hits)
    assert [p[:3] for p in prefills] == [("r", 2000, 6000), ("a", 1024, 4976), ("b", 1024, 1976)]
    cache.hit_tokens = 2048  # another prompt cached more of theirs
    hits.next_step()  # within the round: the hits read in it stand, no lookup
    assert allotment_candidates(scheduler, running, 8, 1.0, hits)[1][:3] == ("a", 1024, 4976)
    assert cache.lookups == 2
    hits.next_step()  # the next round reads them again
    assert allotment_candidates(scheduler, running, 1, 1.0, hits)[1][:3] == ("a", 2048, 3952)
    assert cache.lookups == 3


def test_a_request_that_changed_is_looked_up_again_and_stale_hits_are_dropped():
    scheduler, cache = _scheduler(1024, [])
    hits = PrefixHits(max_age_steps=4)
    preempted = _request("p", 6000)
    assert hits.tokens(scheduler, preempted) == 1024
    preempted.num_tokens = 6010  # back in the queue with ten output tokens: its own blocks may be cached
    cache.hit_tokens = 4096
    assert hits.tokens(scheduler, preempted) == 4096 and cache.lookups == 2
    for i in range(1100):  # many prompts passed through; only the last round's are kept
        hits.tokens(scheduler, _request(f"r{i}", 3000))
        hits.next_step()
    assert len(hits._hits) <= 1024
    assert "p" not in hits._hits


def test_one_prefill_alone_needs_no_allotment_and_no_lookup():
    scheduler, cache = _scheduler(1024, [_request("a", 6000)])
    assert allotment_candidates(scheduler, [], 8, 1.0, PrefixHits(2)) == []
    assert cache.lookups == 0


def test_plan_shape_groups_sizes_within_a_factor_of_sqrt2_and_tells_others_apart():
    assert plan_shape([(0, 6000)], 4) == plan_shape([(0, 6100)], 4)
    assert plan_shape([(0, 6000)], 4) != plan_shape([(0, 12000)], 4)
    assert plan_shape([(0, 6000)], 4) != plan_shape([(0, 6000)], 0)
