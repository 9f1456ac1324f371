"""The trace mode of ``make bench-e2e`` without the engine: the replay's requests and arrivals are the twin's,
shared blocks give shared prompt tokens, the client sends at the arrival times, and the figures and goals.

The replay itself runs in ``make bench-e2e BENCH_E2E_ARGS="--trace ..."`` (docs/e2e.md).
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
from vllm_ascend_patchset.e2e import run as e2e_run
from vllm_ascend_patchset.e2e import servers, trace_args, trace_replay, twin_predict
from vllm_ascend_patchset.e2e import trace_figures as tf
from vllm_ascend_patchset.e2e.bench import ArgumentError
from vllm_ascend_patchset.e2e.model import TINY_QWEN3
from vllm_ascend_patchset.paths import DATA_DIR
from vllm_ascend_patchset.twin import engine
from vllm_ascend_patchset.twin.command import build_parser as twin_parser
from vllm_ascend_patchset.twin.options import build_workloads
from vllm_ascend_patchset.twin.slo import Slo
from vllm_ascend_patchset.twin.workloads import TRACE_BLOCK_TOKENS, RequestSpec, Workload

MOONCAKE = DATA_DIR / "traces" / "mooncake.jsonl"


def _trace(tmp_path, rows):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(stamp, tokens, blocks, output=8):
    return {"timestamp": stamp, "input_length": tokens, "output_length": output, "hash_ids": blocks}


def test_equal_leading_block_ids_give_equal_leading_tokens_and_nothing_more(tmp_path):
    path = _trace(
        tmp_path,
        [_row(0, 1300, [7, 8, 9]), _row(50, 1100, [7, 8, 4]), _row(90, 600, [5, 8]), _row(200, 700, [7, 8])],
    )
    workload = trace_replay.build_replay("synthetic", f"{path}@0:4", 0.8, None, 2048)
    prompts = trace_replay.prompts_of(workload)
    a, b, c, d = (prompts[spec.req_id] for spec in workload.requests)
    assert [len(p) for p in (a, b, c, d)] == [1300, 1100, 600, 700]
    two = 2 * TRACE_BLOCK_TOKENS
    assert a[:two] == b[:two] and a[two:1100] != b[two:]  # blocks 7, 8 shared; 9 and 4 differ
    assert d == a[:700]  # a prefix of a's blocks, the last one cut by input_length
    assert c[:TRACE_BLOCK_TOKENS] != a[:TRACE_BLOCK_TOKENS]  # block 5 is not block 7
    assert c[TRACE_BLOCK_TOKENS:] == a[TRACE_BLOCK_TOKENS:600]  # block 8 (cut) is block 8, wherever it stands
    every = set(a + b + c + d)
    assert max(every) < TINY_QWEN3["vocab_size"] and not every & set(trace_replay.WARM_UP_IDS)
    assert trace_replay.prompts_of(workload) == prompts, "a replay's prompts are the same every time"


def test_the_replay_is_the_twins_trace_workload_at_the_same_load():
    item = f"{MOONCAKE}@42:20"
    ours = trace_replay.build_replay("tests/data/cpu_surface.csv", item, 0.8, 64, 2048)
    args = twin_parser().parse_args(
        ["--workload", f"trace:{item}", "--load", "0.8", "--output-cap", "64", "--chunk", "2048"]
    )
    [twins] = build_workloads(args, "tests/data/cpu_surface.csv", servers.PIPELINE_STAGES)
    assert trace_replay.same_requests(ours, twins) and ours.name == twins.name
    assert [r.req_id for r in ours.requests] == [f"t{i:05d}" for i in range(42, 62)]
    assert max(r.max_output_tokens for r in ours.requests) == 64 and ours.requests[0].arrival_ms == 0.0
    arrivals = [r.arrival_ms for r in ours.requests]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    heavier = trace_replay.build_replay("tests/data/cpu_surface.csv", item, 1.6, 64, 2048)
    assert [2 * r.arrival_ms for r in heavier.requests] == pytest.approx(arrivals, abs=1e-2)


def test_a_request_longer_than_the_servers_take_is_skipped_as_the_twin_skips_one(tmp_path):
    too_long = servers.MAX_MODEL_LEN - 4  # plus 8 output tokens: over
    blocks = list(range(100, 100 + -(-too_long // TRACE_BLOCK_TOKENS)))
    path = _trace(tmp_path, [_row(0, 900, [1, 2]), _row(10, too_long, blocks), _row(30, 900, [1, 3])])
    workload = trace_replay.build_replay("synthetic", f"{path}@0:3", 0.5, None, 2048)
    assert [r.req_id for r in workload.requests] == ["t00000", "t00002"]
    assert any("skipped 1 request(s)" in note and "1 (line 2)" in note for note in workload.notes)


def test_the_servers_cache_prefixes_in_the_twins_blocks_and_admit_as_many_requests(tmp_path):
    assert trace_replay.CACHE_BLOCK_TOKENS == engine.BLOCK_TOKENS
    assert trace_replay.TRACE_MAX_NUM_SEQS == engine.MAX_NUM_SEQS
    extra = trace_replay.server_args()
    command = servers.serve_command(servers.fixed(1024), tmp_path, 1, tmp_path, extra_args=extra)
    assert command[-len(extra) :] == list(extra) and "--enable-prefix-caching" in command
    last = len(command) - 1 - command[::-1].index("--max-num-seqs")
    assert command[last + 1] == str(engine.MAX_NUM_SEQS)  # the last one given is the one argparse keeps


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_each_request_is_sent_at_its_arrival_and_a_failure_is_kept():
    clock = FakeClock()
    specs = (RequestSpec("a", 0.0, 4, 3, 0), RequestSpec("b", 1500.0, 4, 1, 1), RequestSpec("c", 2500.0, 4, 2, 2))
    prompts = {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 9, 9, 9]}
    seen, done = [], []

    def send(ids, max_tokens):
        seen.append((tuple(ids), max_tokens))
        if ids == prompts["c"]:
            raise RuntimeError("HTTP 500")
        return [0.25 * (k + 1) for k in range(max_tokens)], 128 if ids == prompts["b"] else 0

    # One worker thread at a time keeps the fake clock's arithmetic exact.
    outcomes = trace_replay.replay(specs[:1], prompts, send, clock, clock.sleep, done.append)
    outcomes += trace_replay.replay(specs[1:2], prompts, send, clock, clock.sleep, done.append)
    outcomes += trace_replay.replay(specs[2:], prompts, send, clock, clock.sleep, done.append)
    assert [o.req_id for o in outcomes] == ["a", "b", "c"] and len(done) == 3
    assert [o.sent_s for o in outcomes] == pytest.approx([0.0, 1.5, 2.5])
    assert all(o.late_ms == pytest.approx(0.0) for o in outcomes)
    assert seen == [((1, 2, 3, 4), 3), ((5, 6, 7, 8), 1), ((9, 9, 9, 9), 2)]
    ttft, tpot = trace_replay.request_times(outcomes)
    assert ttft == {"a": 250.0, "b": 250.0, "c": None}
    assert tpot == {"a": pytest.approx(250.0), "b": None, "c": None}
    assert outcomes[2].error == "RuntimeError: HTTP 500"
    assert [o.cached_tokens for o in outcomes] == [0, 128, None]


SLO = Slo(ttft_ms=1000.0, tpot_ms=50.0, basis="test")


def test_serving_figures_follow_the_twins_definitions():
    ttft = {"a": 400.0, "b": 800.0, "c": 1200.0, "d": None}
    tpot = {"a": 40.0, "b": 60.0, "c": None, "d": None}
    f = tf.serving(ttft, tpot, SLO)
    assert f.ttft_mean_s == pytest.approx(0.8) and f.ttft_p50_s == pytest.approx(0.8)
    assert f.ttft_p99_s == pytest.approx(1.192)  # numpy's linear percentile, as the twin's report
    assert f.tpot_mean_ms == pytest.approx(50.0) and f.tpot_p99_ms == pytest.approx(59.8)
    assert f.goodput == pytest.approx(0.25)  # a only: b's TPOT, c's TTFT over; d never answered
    assert (f.answered, f.requests) == (3, 4)
    assert tf.tpot_ms([1.0]) is None and tf.tpot_ms([1.0, 1.1, 1.3]) == pytest.approx(150.0)


def test_paired_ratio_reads_the_noise_from_the_per_request_differences():
    fixed = {"a": 1000.0, "b": 2000.0, "c": 3000.0, "d": 4000.0}
    level = tf.paired_ratio({k: v + 20 * (-1) ** i for i, (k, v) in enumerate(fixed.items())}, fixed)
    assert level.ratio == pytest.approx(1.0) and not level.behind_beyond_noise and level.requests == 4
    behind = tf.paired_ratio({k: v * 1.1 for k, v in fixed.items()}, fixed)
    assert behind.ratio == pytest.approx(1.1) and behind.behind_beyond_noise
    assert tf.paired_ratio({"a": 1.0, "b": None}, {"a": 2.0}).requests == 1
    assert math.isnan(tf.paired_ratio({"a": None}, {"a": 2.0}).ratio)


def _serving(mean_s, tpot_p99_ms=50.0):
    return tf.Serving(mean_s, mean_s, mean_s, tpot_p99_ms, tpot_p99_ms, 1.0, 2, 2)


def test_goals_report_fidelity_ranking_and_ours_against_the_best_fixed_chunk():
    real = {"ours": _serving(2.0, 54.0), "fixed-1024": _serving(2.1), "upstream-cpp": _serving(3.0)}
    twin = {"ours": _serving(2.08), "fixed-1024": _serving(2.0), "upstream-cpp": _serving(3.3)}
    times = {"ours": {"a": 1900.0, "b": 2100.0}, "fixed-1024": {"a": 2000.0, "b": 2200.0}}
    found = {g.what: g for g in tf.goals(real, twin, times, "fixed-1024", "upstream-cpp")}
    assert found["ours: twin/real mean TTFT within 1 +/- 0.05"].value == "1.040"
    assert found["ours: twin/real mean TTFT within 1 +/- 0.05"].met
    assert not found["upstream-cpp: twin/real mean TTFT within 1 +/- 0.05"].met  # 1.100
    ranked = found["the twin ranks the policies as the engine does"]
    assert (
        not ranked.met
        and ranked.value == "real ours < fixed-1024 < upstream-cpp, twin fixed-1024 < ours < upstream-cpp"
    )
    assert found["ours' mean TTFT not behind fixed-1024's beyond 2 s.e."].met
    assert found["ours' TPOT P99 <= 1.1x fixed-1024's"].value == "1.080"
    table = "\n".join(tf.format_table(real, twin, {"ours": 3.5}, SLO))
    assert "twin/real" in table and "1.040" in table and "TTFT <= 1.00 s, TPOT <= 50 ms" in table


def serving(ttft_s: float, tpot_p99_ms: float = 50.0) -> tf.Serving:
    return tf.Serving(ttft_s, ttft_s, ttft_s, tpot_p99_ms, tpot_p99_ms, 1.0, 20, 20)


def test_the_fixed_chunks_served_are_the_twins_best_of_the_sweep():
    args = argparse.Namespace(fixed="512,1024,2048,4096", fixed_pick=2)
    means = {"fixed-512": 5.2, "fixed-1024": 4.9, "fixed-2048": 7.8, "fixed-4096": 10.3, "ours": 3.0}
    twin = {name: serving(mean) for name, mean in means.items()}
    assert trace_replay.fixed_to_serve(args, twin) == [1024, 512]
    assert trace_replay.fixed_to_serve(argparse.Namespace(fixed="512,1024", fixed_pick=0), twin) == [512, 1024]
    assert trace_replay.fixed_to_serve(args, {}) == [512, 1024, 2048, 4096], "no twin: every chunk of --fixed"


def test_with_a_tpot_target_the_chunks_served_meet_it_first_and_the_slo_tuned_one_is_found_among_them():
    args = argparse.Namespace(fixed="256,512,1024,2048", fixed_pick=2, target_tpot_ms=60.0)
    twin = {"fixed-256": serving(6.0, 30), "fixed-512": serving(5.0, 55), "fixed-1024": serving(4.5, 90),
            "fixed-2048": serving(4.0, 160)}  # fmt: skip
    assert trace_replay.fixed_to_serve(args, twin) == [512, 256]  # the fastest that meet 60 ms, then the rest
    assert trace_replay.slo_tuned(twin, 60.0) == "fixed-512"
    assert trace_replay.slo_tuned(twin, 10.0) == "fixed-256"  # none meets it: the least TPOT P99


def test_a_tpot_target_is_checked_before_any_server_and_judged_in_the_goodput():
    parse = e2e_run.build_parser().parse_args
    args = parse(["bench", "--trace", f"{MOONCAKE}@42:20", "--target-tpot-ms", "80"])
    trace_args.check_trace_args(args)
    slo = trace_replay.judged_at(args, Slo(9000.0, 40.0, "default"))
    assert (slo.ttft_ms, slo.tpot_ms) == (9000.0, 80.0)
    for bad in ("0", "-3", "nan", "inf"):
        with pytest.raises(ArgumentError, match="--target-tpot-ms must be a number of ms > 0"):
            trace_args.check_trace_args(parse(["bench", "--trace", f"{MOONCAKE}@42:20", "--target-tpot-ms", bad]))
    with pytest.raises(ArgumentError, match="--target-tpot-ms: trace-mode flags"):
        trace_args.check_trace_args(parse(["bench", "--target-tpot-ms", "80"]))


def test_ours_tpot_p99_is_judged_against_its_target_when_it_has_one():
    real = {"ours": serving(3.0, 85.0), "fixed-512": serving(3.2, 50.0)}
    ttft = {"ours": {"r": 3000.0}, "fixed-512": {"r": 3200.0}}
    (goal,) = [g for g in tf.goals(real, {}, ttft, "fixed-512", None, target_tpot_ms=80.0) if "TPOT" in g.what]
    assert goal.what.startswith("ours' TPOT P99 <= 1.1x its target 80 ms") and goal.met
    (goal,) = [g for g in tf.goals(real, {}, ttft, "fixed-512", None, target_tpot_ms=70.0) if "TPOT" in g.what]
    assert not goal.met


def test_bench_takes_a_trace_and_its_load_and_cap():
    args = e2e_run.build_parser().parse_args(["bench", "--trace", f"{MOONCAKE}@42:20", "--load", "0.9"])
    trace_args.check_trace_args(args)
    assert (args.trace, args.load, args.output_cap, args.fixed_pick) == (f"{MOONCAKE}@42:20", 0.9, 64, 1)
    assert not args.keep_profile and not args.report_only
    assert e2e_run.build_parser().parse_args(["bench"]).trace is None


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--trace", "nowhere.jsonl@0:4"], "--trace nowhere.jsonl: no such file"),
        (["--trace", f"{MOONCAKE}@-1:4"], "the slice after @ must be START or START:COUNT"),
        (["--trace", f"{MOONCAKE}@0:9000"], "the slice needs 9000; give a smaller START or COUNT"),
        (["--trace", f"{MOONCAKE}@0:4", "--load", "nan"], "--load must be a number in [0.01, 100]"),
        (["--trace", f"{MOONCAKE}@0:4", "--load", "0"], "--load must be a number in [0.01, 100]"),
        (["--trace", f"{MOONCAKE}@0:4", "--load", "1e-300"], "--load must be a number in [0.01, 100]"),
        (["--trace", f"{MOONCAKE}@0:20000"], "COUNT 20000 is more than a run replays (10000 requests at most)"),
        (["--trace", f"{MOONCAKE}@0:4", "--policies", "fixed,upstream"], "the trace mode needs ours"),
        (["--trace", f"{MOONCAKE}@0:4", "--output-cap", "0"], "--output-cap must be in [1, 33791]"),
        (["--trace", f"{MOONCAKE}@0:4", "--fixed-pick", "-1"], "--fixed-pick must be in [0, 4]"),
        # past what the servers and --fixed can mean (each started the servers)
        (["--trace", f"{MOONCAKE}@0:4", "--output-cap", "1000000000000"], "--output-cap must be in [1, 33791]"),
        (["--trace", f"{MOONCAKE}@0:4", "--target-tpot-ms", "1e300"], "--target-tpot-ms must be a number of ms > 0"),
        (["--trace", f"{MOONCAKE}@0:4", "--fixed-pick", "1000000000"], "--fixed-pick must be in [0, 4] (0 serves"),
        (["--report-only"], "--report-only: trace-mode flags; add --trace"),
        (["--load", "0.5", "--keep-profile"], "--load, --keep-profile: trace-mode flags; add --trace"),
        (["--fixed-pick", "0"], "--fixed-pick: trace-mode flags"),
    ],
)
def test_bad_trace_input_is_refused_before_any_server_starts(argv, says, monkeypatch, tmp_path, capsys):
    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(trace_replay, "serve_replay", no_server)
    monkeypatch.setattr(e2e_run.bench, "run", no_server)
    assert e2e_run.main(["bench", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench: error: ") and says in err, err
    assert not any(tmp_path.iterdir()), "nothing is written (nor a saved profile removed) before the checks"


def test_twin_predict_writes_the_replay_and_its_slo_for_the_engines_python(tmp_path):
    out = tmp_path / "w.json"
    item = f"{MOONCAKE}@42:20"
    argv = ["--surface", "synthetic", "--stages", "2", "--trace", item, "--load", "0.8", "--output-cap", "64"]
    assert twin_predict.main([*argv, "--chunk", "2048", "--json", str(out), "--workload-only"]) == 0
    data = json.loads(out.read_text())
    built = trace_replay.build_replay("synthetic", item, 0.8, 64, 2048)
    assert trace_replay.same_requests(Workload.from_json(data["workload"]), built)
    assert data["notes"] == list(built.notes) and set(data["slo"]) == {"ttft_ms", "tpot_ms", "basis"}


def _profile(tmp_path):
    """A saved profile of the synthetic surface (one stage), as the engine writes one."""
    from vllm_ascend_patchset.twin.surface_files import load_surface

    surface = load_surface("synthetic")
    samples = [[c, h, surface.time_ms(c, h)] for c in (64, 256, 1024, 2048) for h in (0, 4096, 16384, 32768)]
    path = tmp_path / "cpp-profile-x.json"
    from vllm_ascend.core.cpp_profile_store import PROFILE_SCHEMA_VERSION

    path.write_text(json.dumps({"schema_version": PROFILE_SCHEMA_VERSION, "base_chunk_size": 2048, "samples": samples}))
    return path


@pytest.mark.full_tier("the twin's policy workers import vLLM and the assembled tree")
def test_at_pace_the_device_is_slower_and_the_requests_stay_the_profiles(tmp_path):
    profile = _profile(tmp_path)
    assert twin_predict.at_pace(str(profile), 1.0, tmp_path / "d.json") == str(profile)  # pace 1: as saved
    assert twin_predict.at_pace(str(profile), 1.25, tmp_path / "d.json") == str(tmp_path / "d.json")
    saved, slowed = json.loads(profile.read_text())["samples"], json.loads((tmp_path / "d.json").read_text())["samples"]
    assert [s[:2] for s in slowed] == [s[:2] for s in saved]
    assert [s[2] for s in slowed] == pytest.approx([1.25 * s[2] for s in saved])
    item, fixed = f"{MOONCAKE}@42:4", [1024, 2048]
    at_profile = twin_predict.predict_trace(str(profile), item, 0.8, 8, fixed, 2048, {"fixed"})
    paces = {"fixed-2048": 1.25}  # one policy's server ran slower; the other's device stays the profile
    slower = twin_predict.predict_trace(str(profile), item, 0.8, 8, fixed, 2048, {"fixed"}, paces, tmp_path)
    assert slower["workload"] == at_profile["workload"]  # the same requests at the same times
    for name, slowed_down in (("fixed-2048", True), ("fixed-1024", False)):
        ttft = [t["policies"][name]["request_ttft_ms"] for t in (at_profile, slower)]
        assert all(ttft[1][r] > ttft[0][r] for r in ttft[0]) is slowed_down
        assert ttft[1] == ttft[0] or slowed_down


@pytest.mark.parametrize(
    ("pace", "saved", "says"),
    [(0.0, {"samples": [[1, 0, 1.0]]}, "--pace must be a positive number"),
     (float("nan"), {"samples": [[1, 0, 1.0]]}, "--pace must be a positive number"),
     (1.1, {"coefficients": {}}, "needs a saved profile with 'samples'")],
)  # fmt: skip
def test_a_pace_the_twin_cannot_apply_is_refused_by_name(tmp_path, pace, saved, says):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=says):
        twin_predict.at_pace(str(profile), pace, tmp_path / "d.json")


def test_a_servers_pace_is_its_steps_measured_over_the_profiles_stage_time_summed(tmp_path):
    from vllm_ascend_patchset.twin.surface import batch_ms
    from vllm_ascend_patchset.twin.surface_files import load_surface

    profile = _profile(tmp_path)
    data = json.loads(profile.read_text())
    data["fingerprint"] = {"pipeline_parallel_size": 2}  # samples are one stage's time: the surface is twice that
    profile.write_text(json.dumps(data))
    surface = load_surface(str(profile))
    batches = [[(512, 0)], [(300, 4096), (1, 900), (1, 2000)], [(2048, 16384)], [(64, 0), (1, 30000)]]
    paces = (1.2, 0.9, 1.04, 1.1)
    stage_ms = [batch_ms(surface, b) / 2 for b in batches]
    steps = [[b, ms * k] for b, ms, k in zip(batches, stage_ms, paces, strict=True)]
    pace = twin_predict.serving_pace(str(profile), steps)
    weighted = sum(k * ms for ms, k in zip(stage_ms, paces, strict=True)) / sum(stage_ms)
    assert pace.ratio == pytest.approx(weighted) and pace.steps == 4  # a long slow step weighs what it cost
    assert 0.9 <= pace.low < pace.high <= 1.2 and pace.low < (1.04 + 1.1) / 2 < pace.high
    mixed = [(300, 4096), (1, 900), (1, 2000)]  # a batch of several requests: the batch rule's time
    slow_mixed = [[mixed, 1.5 * batch_ms(surface, mixed) / 2]]
    assert twin_predict.serving_pace(str(profile), slow_mixed).ratio == pytest.approx(1.5)
    assert twin_predict.serving_pace(str(profile), []) is None


def test_a_policy_without_timed_steps_runs_at_the_others_median_pace():
    measured = {n: twin_predict.Pace(m, m, m, 9) for n, m in (("ours", 1.02), ("fixed-512", 0.9), ("x", 1.3))}
    names = ["ours", "fixed-512", "fixed-1024"]
    assert twin_predict.policy_paces(measured, names, 1.0) == {"ours": 1.02, "fixed-512": 0.9, "fixed-1024": 1.02}
    assert twin_predict.policy_paces({}, names, 1.1) == dict.fromkeys(names, 1.1)


def test_the_report_prints_the_table_the_hits_the_pace_and_the_goals(capsys):
    specs = (RequestSpec("a", 0.0, 600, 3, 0), RequestSpec("b", 900.0, 600, 2, 1))
    workload = Workload("mooncake-s0-n2-load0.8", 0, specs)

    def record(name, kind, ttft_s, cached, **extra):
        outcomes = [
            {"req_id": r, "sent_s": 0.0, "late_ms": 0.0, "token_s": [t, t + 0.1], "cached_tokens": c}
            for r, t, c in zip("ab", ttft_s, cached, strict=True)
        ]
        return {"policy": name, "kind": kind, "outcomes": outcomes, "errors": [], "loads": [3.0, 4.0], **extra}

    records = [
        record("ours", "ours", [1.0, 2.0], [0, 512]),
        record("fixed-512", "fixed", [1.2, 2.2], [0, 512]),
        record("upstream-cpp", "upstream", [1.5, 2.5], [0, None]),
    ]
    figures = {"ours": _serving(1.45), "fixed-512": _serving(1.7), "upstream-cpp": _serving(2.0)}
    paces = {"ours": {"ratio": 1.0, "low": 0.95, "high": 1.1, "steps": 3}}
    twin = trace_replay.TwinReplay(figures, {"ours": 512}, paces)
    assert trace_replay.report(records, twin, SLO, workload, 12.0) == 0
    out = capsys.readouterr().out
    assert "== mooncake-s0-n2-load0.8, PP=2, 2 requests, prefix caching on ==" in out
    assert "ours: prefix-cache hits 512 prompt tokens (twin 512)" in out
    assert "upstream-cpp: prefix-cache hits - prompt tokens (twin -)" in out
    assert "ours: 3 timed prefill steps ran at 1.000 x the profile's time (steps' quartiles 0.95 .. 1.10)" in out
    assert "the twin's device ran at that pace" in out
    assert "fixed-512: no timed steps; the twin's device ran at the others' median pace" in out
    assert "goal met   : the twin ranks the policies as the engine does" in out
    assert "goal MISSED: fixed-512: twin/real mean TTFT within 1 +/- 0.05: 1.000" not in out
    assert "best fixed chunk: real fixed-512, twin fixed-512" in out


@pytest.mark.parametrize(
    ("usage", "cached"),
    [({"prompt_tokens": 4000, "prompt_tokens_details": {"cached_tokens": 3072}}, 3072),
     ({"prompt_tokens": 600}, 0),  # vLLM leaves the details out when nothing was cached
     ({}, None)],  # no usage at all: unknown
)  # fmt: skip
def test_the_cached_tokens_come_from_the_servers_usage_report(monkeypatch, usage, cached):
    monkeypatch.setattr(servers, "stream_completion", lambda port, ids, n: ([0.5, 0.6], usage))
    assert trace_replay.send(1, [5, 6], 2) == ([0.5, 0.6], cached)


def test_report_only_without_a_run_says_what_to_run_first(tmp_path):
    args = argparse.Namespace(out=tmp_path, report_only=True)
    with pytest.raises(SystemExit, match="run the trace mode without --report-only first"):
        trace_replay.report_again(args, 0.0)


@pytest.mark.parametrize("saved", ["not json", "[]", '[{"policy": "ours"}]'])
def test_report_only_on_records_that_are_not_a_runs_names_the_file(tmp_path, saved):
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "records.json").write_text(saved)
    args = argparse.Namespace(out=tmp_path, report_only=True)
    with pytest.raises(SystemExit, match=r"records.json is not a trace run's records .*; run the trace mode"):
        trace_replay.report_again(args, 0.0)


def test_report_only_without_the_saved_profile_says_so(tmp_path):
    args = argparse.Namespace(out=tmp_path / "trace", report_only=True)
    with pytest.raises(SystemExit, match=r"--report-only: no saved profile in .*profiles; run the trace mode"):
        trace_replay.saved_profile(args)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--stages", "4", "--trace", f"{MOONCAKE}@42:20"], "--stages 4: the trace mode's servers run 2 stages"),
        (["--stages", "2", "--trace", "nowhere.jsonl@0:4"], "nowhere.jsonl: no such file"),
        (
            ["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--output-cap", "0"],
            "--output-cap must be a finite number in [1, 2096896], got 0",
        ),
    ],
)
def test_twin_predict_names_bad_input_without_a_traceback(tmp_path, capsys, argv, says):
    base = ["--surface", "synthetic", "--chunk", "2048", "--json", str(tmp_path / "out.json"), "--workload-only"]
    with pytest.raises(SystemExit) as exit_info:
        twin_predict.main([*base, *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, says",
    [
        # each used to start the twin's workers (or fail in them)
        (["--stages", "0", "--prompts", "1024"], "--stages must be a finite number in [2, 64], got 0"),
        (["--stages", "1000000", "--prompts", "1024"], "--stages must be a finite number in [2, 64], got 1000000"),
        (["--stages", "1", "--prompts", "1024", "--policies", "fixed", "--fixed", "512"], None),
        (["--stages", "2", "--prompts", "1024", "--chunk", "0"], "--chunk 0: a chunk budget must lie in [64, "),
        (["--stages", "2", "--prompts", "abc"], "--prompts item 'abc': give a whole number > 0"),
        (["--stages", "2", "--prompts", "1000000000000"], "--prompts must be a finite number in [1, 2096896]"),
        (["--stages", "2", "--prompts", "1024", "--fixed", "x"], "--fixed item 'x': give a whole number > 0"),
        (["--stages", "2", "--prompts", "1024", "--fixed", "0"], "--fixed item '0': give a whole number > 0"),
        (["--stages", "2", "--prompts", "1024", "--fixed", "10"], "--fixed 10: a chunk budget must lie in [64, "),
        (["--stages", "2", "--prompts", "1024", "--policies", "best"], "--policies 'best': give some of fixed,"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--output-cap", "1000000000000"], "--output-cap must be a"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--target-tpot-ms", "nan"], "--target-tpot-ms must be a"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--target-tpot-ms", "-5"], "--target-tpot-ms must be a"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--load", "1e9"], "--load must be a finite number in [0.01,"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--pace", "1e300"], "--pace must be a finite number in (0,"),
        (["--stages", "2", "--trace", f"{MOONCAKE}@0:4", "--steps", "/nonexistent"], "--steps /nonexistent: not a"),
        (["--stages", "2", "--prompts", "1024", "--json", "/proc/out.json"], "--json /proc/out.json: cannot write"),
    ],
)
def test_twin_predict_refuses_bad_input_before_the_twin_runs(tmp_path, capsys, monkeypatch, argv, says):
    def run_cases(*args, **kwargs):
        raise AssertionError("the twin's workers were started")

    monkeypatch.setattr(twin_predict.pol, "run_cases", run_cases)
    out = tmp_path / "out.json"
    base = ["--surface", "synthetic", "--chunk", "2048", "--json", str(out)]
    if says is None:  # one stage is fine for fixed chunks alone: the twin runs (here, the stand-in refuses)
        with pytest.raises(AssertionError, match="workers were started"):
            twin_predict.main([*base, *argv])
        return
    with pytest.raises(SystemExit) as exit_info:
        twin_predict.main([*base, *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {says}" in err and "Traceback" not in err, err
    assert not out.exists()
