"""Goodput and the default SLO bounds (twin/slo.py), and the options that set them."""

from __future__ import annotations

import pytest
from twin_scripted import ScriptedDriver
from vllm_ascend_patchset.paths import DATA_DIR
from vllm_ascend_patchset.twin import policies as pol
from vllm_ascend_patchset.twin.command import main
from vllm_ascend_patchset.twin.pipeline import RequestLog, run_pipeline
from vllm_ascend_patchset.twin.report import compute_figures, format_table
from vllm_ascend_patchset.twin.slo import Slo, best_chunk, default_slo, goodput, idle_ttft_ms
from vllm_ascend_patchset.twin.surface import SYNTHETIC, QuadraticSurface

SLO = Slo(ttft_ms=100.0, tpot_ms=50.0, basis="test")


def hand_made_logs() -> list[RequestLog]:
    return [
        RequestLog("on-the-bounds", 0.0, 1000, 3, token_ms=[100.0, 150.0, 200.0], finish_ms=200.0),  # 100, 50: meets
        RequestLog("late", 10.0, 1000, 2, token_ms=[120.0, 130.0], finish_ms=130.0),  # TTFT 110: misses
        RequestLog("slow-decode", 0.0, 1000, 2, token_ms=[50.0, 200.0], finish_ms=200.0),  # TPOT 150: misses
        RequestLog("one-token", 0.0, 1000, 1, token_ms=[80.0], finish_ms=80.0),  # no TPOT, TTFT 80: meets
        RequestLog("never-served", 0.0, 1000, 4),  # no first token: misses
    ]


def test_goodput_counts_the_requests_within_both_bounds_on_a_hand_made_log():
    figures = compute_figures("hand", [], hand_made_logs(), num_stages=2)
    assert figures.request_ttft_ms == (100.0, 110.0, 50.0, 80.0, None)
    assert figures.request_tpot_ms == (50.0, 10.0, 150.0, None, None)
    assert figures.goodput(SLO) == pytest.approx(2 / 5)
    assert figures.goodput(Slo(110.0, 50.0, "looser TTFT")) == pytest.approx(3 / 5)
    assert figures.goodput(Slo(110.0, 150.0, "looser both")) == pytest.approx(4 / 5)
    assert figures.goodput(Slo(99.9, 1000.0, "tighter TTFT")) == pytest.approx(2 / 5)  # on-the-bounds misses now
    table = format_table("hand", [figures], None, None, show_tpot=True, slo=SLO)
    assert "goodput %" in table.splitlines()[1] and " 40.0 " in table.splitlines()[2]


def test_end_to_end_latency_is_arrival_to_last_token_and_none_with_a_request_unfinished():
    logs = hand_made_logs()
    assert compute_figures("hand", [], logs, num_stages=2).e2e_mean_ms is None  # never-served has no end
    served = compute_figures("hand", [], logs[:4], num_stages=2)
    assert served.e2e_mean_ms == pytest.approx((200.0 + 120.0 + 200.0 + 80.0) / 4)
    assert 199.0 < served.e2e_p99_ms <= 200.0
    line = format_table("hand", [served], None, None, show_tpot=True, slo=SLO).splitlines()
    assert "E2E s" in line[1] and " 0.150 " in line[2]


def test_goodput_needs_one_tpot_per_ttft():
    with pytest.raises(ValueError, match="one of each per request"):
        goodput([1.0, 2.0], [None], SLO)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("chunk", [1024, 3000])
def test_idle_ttft_is_what_the_pipeline_gives_one_prompt_in_fixed_chunks(stages, chunk):
    prompt = 10_000
    driver = ScriptedDriver([min(chunk, prompt - h) for h in range(0, prompt, chunk)])

    def stage_ms(chunks, index):
        (c,) = chunks
        return (SYNTHETIC.time_ms(c.chunk_tokens, c.history_tokens) / stages,) * stages

    run_pipeline(driver, stage_ms, num_stages=stages)
    assert driver.log.token_ms[0] == pytest.approx(idle_ttft_ms(SYNTHETIC, prompt, stages, chunk))


def test_default_bounds_scale_with_the_surface_so_they_mean_the_same_on_any():
    slower = QuadraticSurface(*(3 * c for c in SYNTHETIC.coefficients))
    for stages in (2, 4):
        base, scaled = default_slo(SYNTHETIC, stages), default_slo(slower, stages)
        assert scaled.ttft_ms == pytest.approx(3 * base.ttft_ms)
        assert scaled.tpot_ms == pytest.approx(3 * base.tpot_ms)
        chunk, idle_ms = best_chunk(SYNTHETIC, 16384, stages)
        assert base.ttft_ms == pytest.approx(5 * idle_ms)
        assert all(idle_ms <= idle_ttft_ms(SYNTHETIC, 16384, stages, c) for c in (512, 1024, 4096, 8192, 16384))
        # A decode step next to one best chunk of the reference prompt, fixed cost paid once.
        step = SYNTHETIC.time_ms(chunk, 8192) + SYNTHETIC.time_ms(1, 16384) - SYNTHETIC.fixed_ms
        assert base.tpot_ms == pytest.approx(step)


def test_a_given_bound_replaces_its_default_only():
    default = default_slo(SYNTHETIC, 4)
    given = default_slo(SYNTHETIC, 4, ttft_ms=1234.0)
    assert (given.ttft_ms, given.tpot_ms) == (1234.0, default.tpot_ms)
    assert "TTFT" not in given.basis and "TPOT" in given.basis
    assert default_slo(SYNTHETIC, 4, ttft_ms=1.0, tpot_ms=2.0).basis == "given"


@pytest.fixture
def no_workers(monkeypatch):
    def run_cases(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(pol, "run_cases", run_cases)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be a finite number in (0, 86400000], got 0.0"),
        (["--slo-tpot-ms", "nan"], "--slo-tpot-ms must be a finite number in (0, 86400000], got nan"),
        (["--slo-reference", "0"], "argument --slo-reference: token count '0'"),
        (["--output-cap", "-3"], "argument --output-cap: token count '-3'"),
        (["--load", "0.5,x"], "--load '0.5,x': give numbers in [0.01, 100], comma-separated"),
        (["--load", "0.5,0"], "--load must be a finite number in [0.01, 100], got 0.0"),
        (["--workload", "trace:nowhere.jsonl@0:4"], "--workload trace:nowhere.jsonl: no such file"),
        (["--workload", "trace:t.jsonl@4:"], "the slice after @ must be START or START:COUNT"),
    ],
)
def test_bad_trace_and_slo_options_fail_before_any_worker(argv, message, capsys, no_workers):
    try:
        code = main(["--surface", "synthetic", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_bad_trace_line_fails_before_any_worker_naming_file_and_line(tmp_path, capsys, no_workers):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n{oops\n')
    assert main(["--surface", "synthetic", "--workload", f"trace:{trace}@0:2"]) == 2
    assert f"{trace}:2: not JSON" in capsys.readouterr().err


def test_every_mixed_and_trace_item_runs_at_each_load_in_one_invocation():
    from vllm_ascend_patchset.twin.command import build_parser
    from vllm_ascend_patchset.twin.options import build_workloads

    trace = DATA_DIR / "traces" / "mooncake.jsonl"
    args = build_parser().parse_args(
        ["--workload", f"long:4k,trace:{trace}@10:6,mixed", "--load", "0.4,0.8", "--requests", "5"]
    )
    workloads = build_workloads(args, "synthetic", 4)
    names = ["long-4k", "mooncake-s10-n6-load0.4", "mooncake-s10-n6-load0.8", "mixed-s0-load0.4", "mixed-s0-load0.8"]
    assert [w.name for w in workloads] == names
    light, heavy = workloads[1], workloads[2]
    assert [r.req_id for r in light.requests] == [f"t{i:05d}" for i in range(10, 16)]
    # Twice the load, half the gaps; the same requests.
    assert [2 * r.arrival_ms for r in heavy.requests] == pytest.approx([r.arrival_ms for r in light.requests], abs=1e-2)
    assert [r.prompt_tokens for r in heavy.requests] == [r.prompt_tokens for r in light.requests]
    single = build_parser().parse_args(["--workload", "mixed", "--load", "0.4", "--requests", "5"])
    assert [w.name for w in build_workloads(single, "synthetic", 4)] == ["mixed-s0"]
