"""The twin driving real schedulers: vLLM 0.23.0's fixed chunking, upstream's CPP, ours.

Each tree runs in its own subprocess (both CPP schedulers import under the same name);
the cases of this module and of the trace replay run in one wave of them (twin_wave.py).
"""

from __future__ import annotations

import pytest
import twin_wave
from vllm_ascend_patchset import paths
from vllm_ascend_patchset.twin import policies as pol
from vllm_ascend_patchset.twin.optimum import optimum
from vllm_ascend_patchset.twin.pipeline import BatchRecord
from vllm_ascend_patchset.twin.report import completeness_problems, figures_from_result
from vllm_ascend_patchset.twin.surface import QuadraticSurface
from vllm_ascend_patchset.twin.surface_files import load_surface
from vllm_ascend_patchset.twin.tune import grid, tune_cases, tune_result
from vllm_ascend_patchset.twin.workloads import long_prompt, mixed

SURFACE = "quadratic:20,0.06,2e-5,4e-6,4e-6"
COEFFS = QuadraticSurface(20, 0.06, 2e-5, 4e-6, 4e-6)
CHUNK = 2048
LONG = long_prompt(12 * 1024)
pytestmark = pytest.mark.full_tier("the twin's policy workers import vLLM and the assembled tree")
MIXED = mixed(COEFFS, 2, seed=5, num_requests=8, min_prompt_tokens=1024, max_prompt_tokens=6144,
              prefix_hit_share=0.5, min_output_tokens=2, max_output_tokens=10, load=0.8,
              reference_chunk_tokens=CHUNK)  # fmt: skip


def comparison() -> list[pol.Policy]:
    policies = [pol.fixed(1024), pol.fixed(CHUNK), pol.upstream(CHUNK, min_chunk=512)]
    if pol.ours_available():
        policies.append(pol.ours(CHUNK))
    return policies


CASES = {
    "long": pol.Setup(SURFACE, 2, LONG),
    "long-noisy": pol.Setup(SURFACE, 2, LONG, seed=11, noise_sigma=0.1),
    "long-noisy-again": pol.Setup(SURFACE, 2, LONG, seed=11, noise_sigma=0.1),
    "mixed": pol.Setup(SURFACE, 2, MIXED, seed=5),
    "mixed-async": pol.Setup(SURFACE, 2, MIXED, seed=5, async_scheduling=True),
}


# The CPP gates: one prompt on the committed CPU surface and on the synthetic accelerator-like
# one, at P = 2 and 4; ours must be within 3% of the least TTFT any chunking reaches, and never
# slower than upstream's CPP.
CPU_SURFACE = str(paths.CPU_SURFACE)
GATE_CHUNK = 8192
GATE_PROMPT = long_prompt(24 * 1024)
GATES = {
    f"gate-{name}-p{stages}": pol.Setup(spec, stages, GATE_PROMPT)
    for name, spec in (("cpu", CPU_SURFACE), ("synthetic", "synthetic"))
    for stages in (2, 4)
}
# Surfaces a quadratic cannot follow: measured on this CPU at other widths and depths, and the
# stress family (twin/stress.py); one prompt at P = 4. And short prompts on deep pipelines.
DATA = paths.DATA_DIR
GATES.update(
    {
        f"gate-{name}-p4": pol.Setup(spec, 4, GATE_PROMPT)
        for name, spec in (
            ("wide", str(DATA / "cpu_surface_wide.csv")),
            ("deep", str(DATA / "cpu_surface_deep.csv")),
            ("cache", "stress:cache"),
            ("tiles256", "stress:tiles256"),
            ("knee", "stress:knee"),
            ("attn-switch", "stress:attn-switch"),
        )
    }
)
GATES.update({f"gate-short-{stages}": pol.Setup("synthetic", stages, long_prompt(4096)) for stages in (8, 16)})
# Uneven stages (the last one lighter): the profile and the timed steps measure the slowest stage.
UNEVEN = pol.Setup(SURFACE, 2, long_prompt(48 * 1024), layers=(18, 14))

TUNE_SETUP = pol.Setup(SURFACE, 2, long_prompt(16 * 1024))
TUNE_GRID = {"kind": "upstream", "default_base": CHUNK, "base_chunks": (1024, 4096), "smooth_factors": (0.5, 1.0)}


def again(candidate) -> pol.Policy:
    """A tuning candidate under a fresh name, for an independent measurement."""
    policy = candidate.policy()
    return pol.Policy(f"again-{policy.name}", policy.kind, policy.max_num_batched_tokens, policy.additional_config)


# Registered for the session's one wave of workers (twin_wave.py), with the trace replay's cases.
TUNE_CANDIDATES = grid(**TUNE_GRID)
twin_wave.add("tune", tune_cases([TUNE_SETUP], TUNE_CANDIDATES))
_COMPARED = [(setup, comparison()) for setup in CASES.values()]
_COMPARED.append((TUNE_SETUP, [again(c) for c in TUNE_CANDIDATES]))
_GATE_POLICIES = [pol.upstream(GATE_CHUNK)] + ([pol.ours(GATE_CHUNK)] if pol.ours_available() else [])
_COMPARED += [(setup, _GATE_POLICIES) for setup in GATES.values()]
_UNEVEN = [pol.ours(CHUNK, max_fit_chunk=8, calibration_window=8, timing_every=1)] if pol.ours_available() else []
_COMPARED.append((UNEVEN, _UNEVEN))
twin_wave.add("compared", _COMPARED)


@pytest.fixture(scope="module")
def twin():
    """The tuner's result, and the comparison cases plus every tuning candidate measured again, so whatever
    the tuner recommends has a measurement of its own."""
    tuned = tune_result([TUNE_SETUP], TUNE_CANDIDATES, twin_wave.results("tune"))
    results = twin_wave.results("compared")
    return tuned, dict(zip([*CASES, "tune-again", *GATES, "uneven"], results, strict=True))


@pytest.fixture(scope="module")
def runs(twin) -> dict[str, list[dict]]:
    return twin[1]


def test_every_policy_finishes_every_request_with_exact_token_counts(runs):
    for case, results in runs.items():
        if case not in CASES:
            continue
        for result in results:
            assert "error" not in result, f"{case}/{result['policy']['name']}: {result.get('error')}"
            figures = figures_from_result(result, CASES[case].num_stages)
            assert figures.problems == ()
            by_id = {r["req_id"]: r for r in result["requests"]}
            # Asynchronous scheduling may run a decode per batch in flight past the last token.
            overshoot = CASES[case].num_stages if CASES[case].async_scheduling else 0
            for spec in CASES[case].workload.requests:
                log = by_id[spec.req_id]
                assert len(log["token_ms"]) == spec.max_output_tokens
                computed = log["cached_tokens"] + log["scheduled_tokens"]
                assert 0 <= computed - (spec.prompt_tokens + spec.max_output_tokens - 1) <= overshoot


def test_completeness_check_catches_a_missing_token():
    from vllm_ascend_patchset.twin.pipeline import RequestLog

    log = RequestLog("r", 0.0, prompt_tokens=100, max_output_tokens=3, scheduled_tokens=101, token_ms=[1.0, 2.0])
    assert len(completeness_problems([log])) == 3


def test_asynchronous_scheduling_runs_vllms_async_scheduler_and_overlaps_decodes(runs):
    sync, asynchronous = runs["mixed"][1], runs["mixed-async"][1]
    assert sync["scheduler"].endswith(".Scheduler")
    assert asynchronous["scheduler"] == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    # With output placeholders a request decodes again before its previous token is back,
    # so the decodes' time per token drops.
    assert figures_from_result(asynchronous, 2).tpot_mean_ms < figures_from_result(sync, 2).tpot_mean_ms


def test_same_seed_gives_the_same_figures(runs):
    for first, again in zip(runs["long-noisy"], runs["long-noisy-again"], strict=True):
        assert figures_from_result(first, 2) == figures_from_result(again, 2)
    noisy = figures_from_result(runs["long-noisy"][1], 2)
    plain = figures_from_result(runs["long"][1], 2)
    assert noisy.ttft_mean_ms != plain.ttft_mean_ms  # the noise is really applied


def test_fixed_policy_is_vllms_fixed_chunking_and_matches_the_closed_form(runs):
    """One prompt, equal chunks: stage 0 never waits, so TTFT = sum(t_k)/P + (P-1) t_last/P."""
    result = runs["long"][1]
    records = [BatchRecord.from_json(b) for b in result["batches"] if b["chunks"]]
    chunks = [c.chunk_tokens for r in records for c in r.chunks]
    assert chunks == [CHUNK] * (LONG.requests[0].prompt_tokens // CHUNK)
    times = [COEFFS.time_ms(CHUNK, i * CHUNK) for i in range(len(chunks))]
    expected = sum(times) / 2 + times[-1] / 2
    assert figures_from_result(result, 2).ttft_mean_ms == pytest.approx(expected)


def test_upstream_cpp_profiles_at_start_up_and_then_varies_its_chunks(runs):
    result = runs["long"][2]
    assert result["scheduler"] == "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
    assert len(result["profile_calls"]) == 65  # upstream's warm-up plus 64 sizes
    chunks = [c["chunk_tokens"] for b in result["batches"] for c in b["chunks"]]
    assert sum(chunks) == LONG.requests[0].prompt_tokens
    assert len(set(chunks)) > 1


def test_mixed_traffic_hits_the_prefix_cache_and_runs_decodes_next_to_prefills(runs):
    result = runs["mixed"][1]
    assert sum(r["cached_tokens"] for r in result["requests"]) > 0
    mixed_batches = [b for b in result["batches"] if {c["is_prefill"] for c in b["chunks"]} == {True, False}]
    assert mixed_batches
    assert figures_from_result(result, 2).tpot_mean_ms > 0


def test_tune_never_recommends_a_setting_measured_worse_than_the_default(twin):
    tuned, runs = twin
    assert tuned.score(tuned.best) <= 1.0
    # Measured again in another process, as a user would after taking the recommendation.
    fresh = {r["policy"]["name"]: figures_from_result(r, 2).ttft_mean_ms for r in runs["tune-again"]}
    assert fresh[again(tuned.best).name] <= fresh[again(tuned.default).name]
    assert fresh[again(tuned.default).name] == pytest.approx(tuned.ttft_ms[tuned.default.name][0])


def test_ours_gets_its_latency_model_from_start_up_profiling_when_assembled(runs):
    if not pol.ours_available():
        pytest.skip("our ProfilingChunkScheduler is not in the assembled tree")
    result = runs["long"][3]
    assert result["policy"]["kind"] == "ours"
    assert "latency model from profiled" in result["start_up"]
    # Its profile covers fresh chunks and chunks that carry history.
    assert {h > 0 for _, h, _ in result["profile_calls"]} == {True, False}


@pytest.mark.parametrize("case", list(GATES))
def test_gate_ours_is_within_3_percent_of_the_optimum_and_never_slower_than_upstream(runs, case):
    if not pol.ours_available():
        pytest.skip("our ProfilingChunkScheduler is not in the assembled tree")
    setup = GATES[case]
    upstream, ours = (figures_from_result(r, setup.num_stages) for r in runs[case])
    assert ours.problems == () and upstream.problems == ()
    prompt_tokens = setup.workload.requests[0].prompt_tokens
    best = optimum(load_surface(setup.surface), prompt_tokens, setup.num_stages, base_chunk_tokens=GATE_CHUNK)
    assert best.certified
    # Within 3% of the least TTFT any chunking reaches, or ahead of the best chunking the engine,
    # which keeps at most P batches in flight, can run.
    assert ours.ttft_mean_ms <= 1.03 * best.lower_ms or ours.ttft_mean_ms <= best.in_flight_ms
    assert ours.ttft_mean_ms <= upstream.ttft_mean_ms


def test_calibration_on_uneven_stages_keeps_the_target_of_the_profile(runs):
    """The profile and the timed steps both measure the slowest stage, so refits agree with the profile."""
    if not pol.ours_available():
        pytest.skip("our ProfilingChunkScheduler is not in the assembled tree")
    (result,) = runs["uneven"]
    assert result["calibration"]["timed_steps"] >= 16  # at least two refits were tried
    profiled, final = result["calibration"]["profiled_target_ms"], result["calibration"]["final_target_ms"]
    assert final == pytest.approx(profiled, rel=0.05)
