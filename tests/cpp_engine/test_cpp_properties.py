"""Properties of the CPP scheduler on random workloads, in the domain's words."""

from __future__ import annotations

import helpers
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_profiling_chunk import (
    STAGE_1,
    TAIL_TOLERANCE,
    FakeExecutor,
    batch_pairs,
    cpp_scheduler,
    timing_from,
)

SHARED_PREFIX = list(range(20_000, 21_024))

requests = st.lists(
    st.tuples(
        st.integers(0, 12),  # arrival step
        st.integers(1, 2500),  # prompt tokens of its own
        st.integers(1, 6),  # tokens to generate
        st.booleans(),  # starts with the shared 1024-token prefix (a prefix-cache hit)
    ),
    min_size=1,
    max_size=7,
)


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpp-properties")
    cpp_scheduler(root, FakeExecutor(), cache_dir=root / "cache")  # profile once, cached for every example
    return root


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=requests)
def test_batches_with_a_prefill_stay_within_the_target_fcfs_holds_and_every_request_finishes(
    profile_dir, tmp_path, workload
):
    scheduler = cpp_scheduler(tmp_path, cache_dir=profile_dir / "cache", num_blocks=600)
    rule = scheduler.cpp_rule
    assert scheduler.cpp_source.startswith("cache")
    arrivals = []
    for index, (step, own_tokens, max_tokens, shared) in enumerate(workload):
        prompt = (SHARED_PREFIX if shared else []) + list(range(1 + 3000 * index, 1 + 3000 * index + own_tokens))
        arrivals.append((step, helpers.make_request(f"r{index}", prompt, max_tokens=max_tokens, arrival_time=index)))
    generated: dict[str, int] = {}
    history_of: dict[str, int] = {}
    timing = timing_from(STAGE_1)
    first_scheduled, first_chunks = [], {}

    def on_step(scheduler, out):
        pairs = batch_pairs(out, history_of)
        prefill_chunks = [chunk for chunk, _ in pairs.values() if chunk > 1]
        if prefill_chunks:
            # Within this step's target, unless the floor forced the step's only prefill chunk,
            # or a prefill alone in the batch took the chunk of its own.
            alone = len(pairs) == 1
            floor_forced = len(prefill_chunks) == 1 and prefill_chunks[0] <= rule.limits.floor_tokens
            limit_ms = scheduler.cpp_target_ms * (1 + TAIL_TOLERANCE) + 1e-9
            assert alone or floor_forced or rule.model.batch_time_ms(pairs.values()) <= limit_ms
        for new in out.scheduled_new_reqs:
            if new.req_id not in first_scheduled:
                first_scheduled.append(new.req_id)
                first_chunks[new.req_id] = out.num_scheduled_tokens[new.req_id]
        return timing(scheduler, out)

    helpers.run_to_completion(scheduler, arrivals, on_step=on_step, generated=generated)

    assert generated == {r.request_id: r.max_tokens for _, r in arrivals}
    # First come, first served, but for shortest remaining first: a request is admitted ahead of an
    # earlier one only if it has fewer tokens to prefill (of its own, against the other's whole
    # prompt), or its whole prompt fits its first batch.
    arrival_order = [r.request_id for _, r in sorted(arrivals, key=lambda item: (item[0], item[1].arrival_time))]
    prompt_tokens = {r.request_id: r.num_tokens for _, r in arrivals}
    own_tokens = {f"r{index}": own for index, (_, own, _, _) in enumerate(workload)}
    for later_index, later in enumerate(arrival_order):
        for earlier in arrival_order[:later_index]:
            jumped = first_scheduled.index(later) < first_scheduled.index(earlier)
            if jumped and first_chunks[later] < own_tokens[later]:
                assert own_tokens[later] < prompt_tokens[earlier], (later, earlier, first_scheduled)
