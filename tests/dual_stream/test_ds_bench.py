"""The CPU dual-stream bench (scripts/vllm_ascend_patchset/dsbench): its link, its arithmetic, its flags, a smoke run.

The link is tested on a scripted clock (its delivery times and that waiting sleeps), the
figures on synthetic records (the shortfall splits exactly into its parts); one quick run
of ``ds-bench`` checks the whole path end to end, asserting what it printed and what the
ranks computed, never how fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from vllm_ascend.dual_stream.streams import EventKind
from vllm_ascend_patchset.dsbench import cases, command, link, report
from vllm_ascend_patchset.dsbench.attention import PagedSdpaAttention
from vllm_ascend_patchset.dsbench.link import EmulatedLink, EmulatedLinkBackend, LinkSpec, install_on_group


class Clock:
    """``time.perf_counter`` and ``time.sleep`` of the link module: sleeping moves the clock, nothing else does."""

    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    scripted = Clock()
    monkeypatch.setattr(link, "time", scripted)
    return scripted


def test_messages_leave_in_order_and_each_takes_alpha_plus_bytes_over_beta(clock):
    wire = EmulatedLink(LinkSpec(alpha_s=1.0, beta=100.0))
    assert [wire.issue(n) for n in (100, 200, 0)] == [102.0, 105.0, 106.0], "queued behind each other"
    clock.now = 200.0
    assert wire.issue(50) == 201.5, "an idle link starts at once"
    assert (wire.messages, wire.nbytes, wire.wire_s) == (4, 350, pytest.approx(7.5))


def test_waiting_for_a_message_sleeps_until_its_delivery_and_counts_as_blocked(clock):
    wire = EmulatedLink(LinkSpec(alpha_s=0.5))
    deadline = wire.issue(1 << 20)
    with wire.blocked():
        wire.sleep_until(deadline)
        wire.sleep_until(deadline)  # delivered already: no second sleep
    assert clock.sleeps == [0.5] and wire.blocked_s == pytest.approx(0.5)
    wire.reset()
    assert (wire.blocked_s, wire.blocked_group_s, wire.wire_s, wire.messages) == (0.0, 0.0, 0.0, 0)


class FakeGroup:
    def __init__(self, clock):
        self.clock, self.reduced = clock, []

    def _all_reduce_out_place(self, tensor):
        self.reduced.append(tensor.numel())
        self.clock.now += 0.1  # gloo's own time
        return tensor * 2


def test_the_groups_all_reduce_returns_no_earlier_than_the_delivery(clock):
    group = FakeGroup(clock)
    wire = EmulatedLink(LinkSpec(alpha_s=1.0))
    install_on_group(group, wire)
    result = group._all_reduce_out_place(torch.ones(4))
    assert torch.equal(result, torch.full((4,), 2.0)) and group.reduced == [4]
    assert clock.now == pytest.approx(101.0) and wire.blocked_s == pytest.approx(1.0) == wire.blocked_group_s
    wire.spec = LinkSpec(alpha_s=1.0, data="token")
    assert torch.equal(group._all_reduce_out_place(torch.ones(4)), torch.ones(4)), "the payload is left as it is"
    assert group.reduced == [4, 1] and clock.now == pytest.approx(102.0), "one element meets the peer"
    wire.spec = link.COMPUTE_ONLY
    assert torch.equal(group._all_reduce_out_place(torch.ones(4)), torch.ones(4)) and group.reduced == [4, 1]
    with pytest.raises(ValueError, match="link data must be one of"):
        LinkSpec(data="some")


class FakeWork:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("wait", self.name))


def test_the_backend_binds_all_reduces_to_the_next_comm_event_and_waits_for_them_there(clock, monkeypatch):
    log = []
    monkeypatch.setattr(link.dist, "all_reduce", lambda t, group, async_op: FakeWork(log, t.numel()))
    wire = EmulatedLink(LinkSpec(alpha_s=1.0))
    backend = EmulatedLinkBackend(wire)
    backend.begin()
    with pytest.raises(RuntimeError, match="must run on the communication stream"):
        backend.all_reduce(torch.ones(1))
    key = (EventKind.ATTN_COM_FINISH, 0, 0)
    reduced = (EventKind.ATTN_AR_FINISH, 0, 0)
    backend.record(key)
    with backend.comm_stream():
        backend.wait(key)  # the compute event: nothing bound to it
        partial = torch.ones(3)
        assert backend.all_reduce(partial) is partial, "reduced in place"
        backend.record(reduced)
    clock.now += 0.25  # the other micro-batch computes meanwhile
    assert log == [] and clock.sleeps == []
    backend.wait(reduced)
    assert log == [("wait", 3)] and clock.sleeps == [pytest.approx(0.75)], "only what compute did not cover"
    assert wire.blocked_s == pytest.approx(0.75) and wire.blocked_group_s == 0.0, "an event wait, not the group's"


def test_the_bench_attention_equals_the_tests_reference_attention_on_a_mixed_batch(monkeypatch):
    """Decodes, a chunk over cached history and fresh prompts, through the paged cache of both kernels."""
    import vllm.forward_context

    from dual_stream import rank_model
    from dual_stream.batches import Request, build_batch

    block = rank_model.BLOCK_SIZE
    monkeypatch.setattr(PagedSdpaAttention, "block_size", block)
    requests = [Request(9, 1), Request(20, 1), Request(13, 7), Request(0, 12), Request(0, 5)]
    metadata, _positions = build_batch(requests, block, rank_model.NUM_BLOCKS, seed=1)
    tokens, heads, kv_heads, dim = 26, 4, 2, 8
    gen = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(tokens, h * dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    history = torch.randn(2, rank_model.NUM_BLOCKS, block, kv_heads, dim, generator=gen)
    ctx = SimpleNamespace(attn_metadata={"l0": metadata}, slot_mapping={"l0": metadata.slot_mapping})
    monkeypatch.setattr(vllm.forward_context, "get_forward_context", lambda: ctx)
    outputs = []
    for kind in (PagedSdpaAttention, rank_model.ReferenceAttention):
        attention = kind(heads, dim, dim**-0.5, kv_heads, prefix="l0")
        attention.kv_cache = history.clone()
        outputs.append((attention(query, key, value), attention.kv_cache))
    (ours, our_cache), (reference, reference_cache) = outputs
    assert torch.allclose(ours, reference, atol=1e-5) and torch.equal(our_cache, reference_cache)


@given(
    share=st.floats(0.05, 0.9),
    compute_s=st.floats(0.01, 10.0),
    messages=st.integers(1, 200),
    nbytes=st.integers(1 << 10, 1 << 28),
)
def test_the_derived_bandwidth_gives_the_preset_share(share, compute_s, messages, nbytes):
    alpha = 1e-7
    beta = cases.beta_for_share(share, compute_s, messages, nbytes, alpha)
    comm = messages * LinkSpec(alpha, beta).wire_s(nbytes)
    assert comm / (compute_s + comm) == pytest.approx(share, rel=1e-9)


def test_a_share_alpha_alone_exceeds_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="lower --alpha-us"):
        cases.beta_for_share(0.2, compute_s=1e-3, messages=13, nbytes=1 << 20, alpha_s=1e-3)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        cases.beta_for_share(1.0, 1.0, 13, 1 << 20)


def _records(single, dual, compute_single, compute_dual):
    """One rank's records: (elapsed, blocked, wire, messages) per round, single and dual, plus compute-only."""
    records = []
    for rep, (s, d) in enumerate(zip(single, dual, strict=True)):
        records.append(dict(preset="p", case="c", mode="single", rep=rep, elapsed=s[0], blocked=s[1], wire=s[1],
                            messages=13, bytes=0))  # fmt: skip
        records.append(dict(preset="p", case="c", mode="dual:token_balanced", rep=rep, elapsed=d[0], blocked=d[1],
                            blocked_group=d[1] / 4, wire=d[1], messages=25, bytes=0))  # fmt: skip
    records.append(dict(preset="compute", case="c", mode="single", rep=0, elapsed=compute_single, blocked=0,
                        wire=0, messages=13, bytes=0))  # fmt: skip
    records.append(dict(preset="compute", case="c", mode="dual:token_balanced", rep=0, elapsed=compute_dual,
                        blocked=0, wire=0, messages=25, bytes=0))  # fmt: skip
    return records


@given(
    single=st.tuples(st.floats(1.0, 2.0), st.floats(0.05, 0.95)),
    dual=st.tuples(st.floats(0.5, 2.0), st.floats(0.0, 0.9)),
)
def test_the_shortfall_from_the_ideal_saving_is_exactly_compute_plus_embed_and_waits(single, dual):
    s_time, s_blocked = single[0], single[0] * single[1]
    d_time, d_blocked = dual[0], min(dual[1], dual[0])
    result = {"records": _records([(s_time, s_blocked)], [(d_time, d_blocked)], 1.0, 1.1),
              "split_merge": {"c": {"split": 0.01, "merge": 0.02}}}  # fmt: skip
    f = report.figures([result], "p", "c", "dual:token_balanced", alpha_s=0.001)
    compute, comm = s_time - s_blocked, s_blocked
    ideal, saved = min(compute, comm), s_time - d_time
    assert f["efficiency"] == pytest.approx(saved / ideal)
    assert f["compute_plus"] + f["embed"] + f["waits"] == pytest.approx((ideal - saved) / s_time, abs=1e-12)
    assert f["limit"] == pytest.approx(max(comm, compute) / s_time) and f["comm_share"] == pytest.approx(comm / s_time)
    assert f["alpha_extra"] == pytest.approx(12 * 0.001 / s_time)
    # without communication dual took 10% more compute: of it split and merge, the rest half+sched
    assert f["half_sched"] == pytest.approx((0.1 * compute - 0.03) / s_time) and f["split"] == pytest.approx(
        0.01 / s_time
    )
    parts = f["split"] + f["merge"] + f["half_sched"] + f["host"]
    assert parts == pytest.approx(f["compute_plus"], abs=1e-12)


def test_the_fastest_forwards_give_the_figures_and_the_rounds_give_the_spread():
    """Per round the slower rank's forward counts; the ratio is fastest dual over fastest single."""
    rank0 = {"records": _records([(1.0, 0.3), (2.0, 0.6), (1.2, 0.3)], [(0.8, 0.1), (1.0, 0.2), (0.9, 0.1)], 1, 1)}
    rank1 = {"records": _records([(1.1, 0.3), (1.0, 0.3), (1.0, 0.3)], [(0.7, 0.1), (1.6, 0.2), (0.9, 0.1)], 1, 1)}
    f = report.figures([rank0, rank1], "p", "c", "dual:token_balanced", alpha_s=0.0)
    # slower rank per round: single 1.1, 2.0, 1.2 and dual 0.8, 1.6, 0.9
    assert f["ratio"] == pytest.approx(0.8 / 1.1)
    assert (f["ratio_min"], f["ratio_max"]) == pytest.approx((0.8 / 1.1, 0.8))  # rounds: 0.8/1.1, 1.6/2, 0.9/1.2
    assert f["comm_share"] == pytest.approx(0.3 / 1.1), "the fastest single forward's own split"


def test_rounds_a_busy_host_slowed_do_not_move_the_figures():
    quiet = _records([(1.0, 0.3)], [(0.8, 0.1)], 1, 1)
    busy = [dict(r, elapsed=2 * r["elapsed"], blocked=r["blocked"], rep=1) for r in quiet if r["preset"] == "p"]
    f = report.figures([{"records": quiet + busy}], "p", "c", "dual:token_balanced", alpha_s=0.0)
    one = report.figures([{"records": quiet}], "p", "c", "dual:token_balanced", alpha_s=0.0)
    for key in ("ratio", "comm_share", "limit", "efficiency", "compute_plus", "waits"):
        assert f[key] == pytest.approx(one[key]), key


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "comm35,fast"], "--preset: unknown fast; choose from bare, comm20, comm35, comm55"),
        (["--preset", ","], "--preset: name at least one preset, or give --beta-gbps"),
        (["--alpha-us", "-1"], "argument --alpha-us: must be a number in [0, 10000], got -1"),
        (["--alpha-us", "nan"], "argument --alpha-us: must be a number in [0, 10000], got nan"),
        (["--alpha-us", "inf"], "argument --alpha-us: must be a number in [0, 10000], got inf"),
        (["--alpha-us", "2e4"], "argument --alpha-us: must be a number in [0, 10000], got 2e4"),
        (["--beta-gbps", "1e-300"], "argument --beta-gbps: must be a number in [0.01, 10000], got 1e-300"),
        (["--beta-gbps", "inf"], "argument --beta-gbps: must be a number in [0.01, 10000], got inf"),
        (["--beta-gbps", "nan"], "argument --beta-gbps: must be a number in [0.01, 10000], got nan"),
        (["--beta-gbps", "0"], "argument --beta-gbps: must be a number in [0.01, 10000], got 0"),
        (["--repeats", "0"], "--repeats: must be > 0"),
        # bounded: 10**12 rounds, or a timeout of a thousand years, started the ranks for a run that never ends
        (["--repeats", "1000000000000"], "argument --repeats: must be > 0 and at most 1000, got 1000000000000"),
        (["--gate-repeats", "1000000000000"], "argument --gate-repeats: must be > 0 and at most 1000, got"),
        (["--timeout-s", "inf"], "argument --timeout-s: must be > 0 and at most 86400, got inf"),
        (["--timeout-s", "1e300"], "argument --timeout-s: must be > 0 and at most 86400, got 1e300"),
        (["--beta-gbps", "fast"], "--beta-gbps: must be a number"),
        (["--cases", "prompts:2x2600,prompts:9x9"], "--cases: unknown prompts:9x9; choose from prompts:2x128"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        command.parse_args(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_link_flag_out_of_range_stops_the_command_before_any_rank_starts(capsys, monkeypatch):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks started")

    monkeypatch.setattr(command, "run_ranks", no_ranks)
    with pytest.raises(SystemExit) as info:
        command.main(["--quick", "--beta-gbps", "1e-300"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--beta-gbps: must be a number in [0.01, 10000]" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        command.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "us, in [0, 10000]: 0 is a link of bandwidth alone" in shown, "the help states the range and why"
    assert "GB/s, in [0.01, 10000]: below 10 MB/s" in shown


def _saved(**changes):
    """A saved result of the right shape, as far as the checks before the tables read it, with ``changes``."""
    rank = {"presets": {"bare": {}}, "gate": {"bare": {}}, "modes": {}, "records": [], "max_rel_diff": 0.0}
    plan = {"cases": [next(iter(cases.BY_NAME))], "presets": ["bare"], "reference": "r", "repeats": 1}
    return {"plan": plan, "ranks": [rank, rank], "load_before": [1, 1, 1], "load_after": [1, 1, 1], "seconds": 1.0,
            **changes}  # fmt: skip


@pytest.mark.parametrize(
    "saved, message",
    [  # each valid JSON that ended in a TypeError from inside the tables
        ([1, 2], "the file holds a list, not an object with plan, ranks, load_before, load_after, seconds"),
        ({"ranks": 5, "plan": 5, "load_before": 0, "load_after": 0, "seconds": 0}, "plan is a whole number, not an"),
        (_saved(ranks=[5]), "ranks[0] is a whole number, not an object"),
        (_saved(ranks=[]), "ranks is empty"),
        (_saved(load_after=[1, "x", 1]), "load_after must be the 3 load averages"),
        (_saved(plan={"cases": ["nope"], "presets": [], "reference": "r", "repeats": 1}), "plan.cases names no case"),
        (_saved(seconds=None), "seconds is null, not a number"),
        (_saved(), "(KeyError: "),  # past the checks: what the tables trip on is still an error, not a traceback
    ],
)
def test_a_from_json_file_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, capsys, saved, message):
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    assert command.main(["--from-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --from-json {path}: not a saved ds-bench result (") and message in err, err


@pytest.mark.parametrize("where", ["under a file", "a folder"])
def test_an_out_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, monkeypatch, where):
    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks started")

    monkeypatch.setattr(command, "run_ranks", no_ranks)
    (tmp_path / "file").write_text("kept")
    out, fault = {"under a file": (tmp_path / "file" / "r.json", "file is not a folder"),
                  "a folder": (tmp_path, "is a folder")}[where]  # fmt: skip
    assert command.main(["--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: ") and fault in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_run_that_fails_to_start_leaves_no_folder_for_its_out(tmp_path, capsys, monkeypatch):
    """The --out check made the result's folders before the ranks started; a run that failed left them."""

    def ranks_fail(*args, **kwargs):
        raise RuntimeError("build/vllm_ascend is not assembled; run 'make assemble' first")

    monkeypatch.setattr(command, "run_ranks", ranks_fail)
    assert command.main(["--quick", "--out", str(tmp_path / "new" / "sub" / "r.json")]) == 2
    assert "error: build/vllm_ascend is not assembled" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "no folder made for a result never written"


@pytest.mark.parametrize(
    "spec, message",
    [
        (dict(alpha_s=float("nan")), "link alpha must be finite and >= 0 s"),
        (dict(alpha_s=-1e-6), "link alpha must be finite and >= 0 s"),
        (dict(beta=float("inf")), "link beta must be finite and > 0"),
        (dict(beta=0.0), "link beta must be finite and > 0"),
    ],
)
def test_a_link_no_wait_can_be_slept_on_is_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        LinkSpec(**spec)


def test_a_bandwidth_of_ones_own_adds_a_custom_link():
    args = command.parse_args(["--preset", "bare", "--alpha-us", "30", "--beta-gbps", "0.5"])
    assert args.presets == ["bare", "custom"]
    assert command.plan_of(args)["alpha_us"] == 30.0 and command.plan_of(args)["beta_gbps"] == 0.5


def test_a_rank_left_waiting_by_a_failed_peer_is_stopped_and_the_failure_named(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "PEER_GRACE_S", 0.5)
    monkeypatch.setenv("PYTHONPATH", str(conftest.ROOT / "tests"))
    with pytest.raises(RuntimeError, match="rank 0 failed:\ninjected: rank 0 failed"):
        command.run_ranks({}, tmp_path, timeout_s=60, module="dual_stream.stuck_rank")
    assert (tmp_path / "rank1.log").read_text().strip().endswith("(killed: its peer failed)"), "not the deadline"
    assert "killed" not in (tmp_path / "rank0.log").read_text()


def _processes_under(folder) -> list[int]:
    """Pids of the live processes whose command line names ``folder`` (the ranks get paths in it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(folder).encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _wait_for(found, what: str, driver, seconds: float = 300.0):
    """Poll ``found()`` until it is truthy while ``driver`` runs; fail naming ``what`` after ``seconds`` (a guard)."""
    until = time.monotonic() + seconds
    while not (value := found()):
        assert driver.poll() is None, f"the command ended ({driver.returncode}) before {what}: {driver.stderr.read()}"
        assert time.monotonic() < until, f"not {what} after {seconds:.0f} s"
        time.sleep(0.2)
    return value


def _stop_and_check(driver, tmp, signum, ready):
    """Signal ``driver`` once ``ready`` holds; it must exit 128 + signum, its ranks gone, ``tmp`` empty."""
    try:
        ranks = _wait_for(lambda: ready() and _processes_under(tmp), "both ranks started", driver)
        driver.send_signal(signum)
        _out, err = driver.communicate(timeout=120)
        assert driver.returncode == 128 + signum, err[-4000:]
        assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err, err[-4000:]
        assert [pid for pid in ranks if pid in _processes_under(tmp)] == [], "a rank outlived the command"
        left = [p.name for p in tmp.iterdir() if p.name.startswith(("ds-bench-", "dsbench-"))]
        assert left == [], "the command's or a rank's temporary folder stays"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in _processes_under(tmp):  # only what this test started: its command lines name tmp
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_both_ranks_and_removes_the_temporary_folder(tmp_path, signum):
    """One rank exits on SIGTERM, the other ignores it and is killed after the grace period."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = (
        "import functools, sys\n"
        "from vllm_ascend_patchset.dsbench import command\n"
        "command.STOP_GRACE_S = 1.0\n"
        "command.run_ranks = functools.partial(command.run_ranks, module='dual_stream.sleeping_rank')\n"
        f"sys.exit(command.main(['--quick', '--preset', 'bare', '--out', {str(tmp_path / 'out.json')!r}]))\n"
    )
    path = os.pathsep.join([str(conftest.ROOT / "scripts"), str(conftest.ROOT / "tests")])
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=conftest.ROOT, text=True,
                              env={**_env(), "PYTHONPATH": path, "TMPDIR": str(tmp)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _stop_and_check(driver, tmp, signum, lambda: len(list(tmp.glob("ds-bench-*/rank*.ready"))) == 2)
    assert not (tmp_path / "out.json").exists()


def test_sigterm_stops_the_real_ranks_and_leaves_no_folder_of_theirs(tmp_path):
    """``timeout`` or a cancelled CI job: the model-building ranks go, and so do their own folders."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ["--quick", "--repeats", "1", "--gate-repeats", "1", "--preset", "bare", "--out", str(tmp_path / "o.json")]
    driver = subprocess.Popen([sys.executable, "-m", "vllm_ascend_patchset", "ds-bench", *argv], cwd=conftest.ROOT,
                              env={**_env(), "PYTHONPATH": str(conftest.ROOT / "scripts"), "TMPDIR": str(tmp)},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _stop_and_check(driver, tmp, signal.SIGTERM, lambda: len(list(tmp.glob("**/model/config.json"))) == 2)


def test_a_quick_run_prints_every_table_and_the_dual_stream_outputs_equal_single_streams(tmp_path):
    out = tmp_path / "result.json"
    argv = ["--quick", "--repeats", "1", "--gate-repeats", "1", "--preset", "comm35", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "vllm_ascend_patchset", "ds-bench", *argv],
        cwd=conftest.ROOT, env={**_env(), "PYTHONPATH": str(conftest.ROOT / "scripts")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    text = done.stdout
    assert "load average" in text.splitlines()[0] and "load average" in text.splitlines()[-2]
    assert "link comm35: alpha 20 us, beta" in text and "measured gate (3 probes" in text
    for case in cases.QUICK_CASES:
        assert case.name in text
    assert "not timed: split refused by strategy" in text, "the long prompt: no boundary splits it"
    saved = json.loads(out.read_text())
    ranks = saved["ranks"]
    assert len(ranks) == 2 and all(r["max_rel_diff"] < 1e-5 for r in ranks)
    for rank in ranks:
        timed = {(r["preset"], r["case"], r["mode"]) for r in rank["records"]}
        for case in (c for c in cases.QUICK_CASES if c.timed):
            for mode in rank["modes"][case.name]:
                assert {("compute", case.name, mode), ("comm35", case.name, mode)} <= timed
    gate = ranks[0]["gate"]["comm35"]
    assert gate["finished"] and gate["probes"] == 3 and ranks[1]["gate"]["comm35"]["crossover"] == gate["crossover"]
    replay = subprocess.run(
        [sys.executable, "-m", "vllm_ascend_patchset", "ds-bench", "--from-json", str(out)],
        cwd=conftest.ROOT, env={**_env(), "PYTHONPATH": str(conftest.ROOT / "scripts")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert replay.returncode == 0 and replay.stdout.splitlines()[2:-1] == text.splitlines()[2:-2]


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
