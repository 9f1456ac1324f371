"""The measured gate in the real model at TP = 2 (gloo): probes, one decision on every rank, its cache, faults.

measured_scenarios.py runs on both ranks of the session's TP run (conftest.py); the clock
is scripted per rank, so these assert the protocol, never this host's speed.
"""

from __future__ import annotations

TOLERANCE = 1e-4


def _scenario(tp_runs, name):
    return [result["measured"][name] for result in tp_runs]


def _equal_to_single_stream(tp_runs, served):
    scale = max(1.0, tp_runs[0]["measured"]["out_scale"])
    return all(s["max_out_diff"] <= TOLERANCE * scale for s in served)


def test_the_first_batches_of_a_class_are_probes_then_the_agreed_timings_decide(tp_runs):
    for result in _scenario(tp_runs, "probe"):
        probes, second, decided = result["served"]
        assert [s["dual_runs"] for s in result["served"]] == [1, 1, 1], "two probes (one dual run each), then dual"
        assert probes["reason"] == second["reason"] == "measured gate: probe"
        assert result["clock_calls"] == 8, "two probes, each run timed at its start and end"
        # rank 0 timed its dual runs at 0.92 s, rank 1 at 0.94 s: both keep the max
        assert decided["probes"] == [[128, 1.0, 0.94], [128, 1.0, 0.94]]
        assert result["crossover"] == 128
        assert _equal_to_single_stream(tp_runs, result["served"])
        assert len(result["cache_files"]) == 1 and result["cache_files"][0].startswith("dual-stream-probes-")


def test_every_rank_holds_the_same_probes_and_takes_the_same_decisions(tp_runs):
    for name in ("probe", "cached", "corrupt_cache", "timing_fault"):
        per_rank = [[(s["dual_runs"], s["probes"]) for s in result["served"]] for result in _scenario(tp_runs, name)]
        assert per_rank[0] == per_rank[1], name


def test_a_restart_adopts_the_cached_probes_and_measures_nothing(tp_runs):
    for result in _scenario(tp_runs, "cached"):
        (served,) = result["served"]
        assert result["clock_calls"] == 0 and served["dual_runs"] == 1 and result["crossover"] == 128
        assert served["probes"] == [[128, 1.0, 0.94], [128, 1.0, 0.94]], "rank 1 holds what rank 0 read"
        assert _equal_to_single_stream(tp_runs, result["served"])


def test_a_corrupt_cache_warns_where_it_was_read_and_every_rank_measures_again(tp_runs):
    first, peer = _scenario(tp_runs, "corrupt_cache")
    assert len(first["warnings"]) == 1 and first["warnings"][0].startswith("[DualStream] ignoring the measured gate")
    assert "measuring again" in first["warnings"][0] and peer["warnings"] == []
    for result in (first, peer):
        (served,) = result["served"]
        assert served["reason"] == "measured gate: probe" and served["probes"] == [[128, 1.0, 0.5]]


def test_a_timing_fault_on_one_rank_turns_dual_stream_off_on_every_rank_with_one_warning(tp_runs):
    assert not any(r["timed_out"] for r in tp_runs)
    for result in _scenario(tp_runs, "timing_fault"):
        assert [s["dual_runs"] for s in result["served"]] == [1, 0], "the probe ran; the next batch single-stream"
        assert result["served"][0]["probes"] == [] and not result["still_on"]
        assert len(result["warnings"]) == 1
        assert result["warnings"][0].startswith("[DualStream] measuring dual stream failed: a rank could not time")
        assert _equal_to_single_stream(tp_runs, result["served"])


def test_a_set_length_threshold_is_trusted_without_measuring(tp_runs):
    for result in _scenario(tp_runs, "explicit"):
        assert result["took_dual"] and result["dual_runs"] == 1 and not result["measured"]
        assert result["max_out_diff"] <= TOLERANCE * max(1.0, tp_runs[0]["measured"]["out_scale"])
