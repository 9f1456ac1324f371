#!/usr/bin/env python3
"""CPU cost of one scheduling step with and without CPP, measured side by side (no NPU).

Both schedulers are real vLLM 0.23.0 schedulers from the assembled tree: upstream's
BalanceScheduler (CPP off: vLLM's own loop) and our ProfilingChunkScheduler (CPP on,
profiled through a fake executor). The same workload, many decoding requests plus long
prompts arriving, runs through each in lock-step; the script prints the mean time of
``schedule()`` + ``update_from_output()`` per step and the ratio. It asserts nothing.
With ``--burst N`` the prompts come N at a time (of 6000, 3000, 2000, ... tokens), so
steps hold several prefills and the response-ratio allotment (with its prefix-cache
lookups) runs, which one prompt at a time never needs. A fourth scheduler, upstream's loop
replaying CPP's batches (``replay_class``), separates what CPP's decisions cost from what
vLLM's loop costs for the batches they make; ``--parts`` also times CPP's own pieces of a step.

Each configuration (``--decodes`` 32, 128, 512 running decodes; ``--arrivals`` yes: prompts
arriving, no: decodes only) runs ``--repeats`` times; the closing table gives, per
configuration, the medians of CPP's time added over the loop making its batches (us a step),
CPP over that loop and over identity hooks, and the share of steps at whose start CPP's
running set had changed. ``--json FILE`` writes the table's rows.

    make assemble && .venv/bin/python scripts/bench/cpp_sched_overhead.py [--decodes 32,128,512] [--steps 300]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import TESTS_DIR, assembled_root  # noqa: E402
from vllm_ascend_patchset.twin.options import MAX_STAGES  # noqa: E402

MAX_STEPS = 10_000  # --steps, --every, --block: 10,000 steps of four schedulers take minutes a configuration
MAX_DECODES = 2048  # the schedulers' 16384 KV blocks of 16 tokens: 2048 decodes' prompts take half of them


def _setup() -> None:
    os.environ.setdefault("VLLM_PLUGINS", "")
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    sys.path[:0] = [str(assembled_root()), str(TESTS_DIR / "cpp_engine"), str(TESTS_DIR)]
    from vllm_ascend_patchset.npu_stubs import install_npu_stubs

    install_npu_stubs()


def replay_class(balance_cls: type) -> type:
    """Upstream's loop whose hooks only replay the batches another scheduler made.

    ``replay`` is that scheduler's ``num_scheduled_tokens`` of the same step: each request
    gets what it got there, and a waiting request it did not admit is passed over while one it
    admitted is still behind it (admission stops after the last one, as CPP's hook stops it). So this
    scheduler does vLLM's work for CPP's batches (as many prefill steps, the same chunks)
    with next to no decision cost of its own: CPP's time over it is what CPP's decisions cost.
    """

    class Replay(balance_cls):
        uses_schedule_hooks = True
        replay: dict[str, int] | None = None  # None: identity hooks (before timing starts)
        differed = 0  # timed steps whose batch was not the one replayed
        to_admit = 0  # waiting requests of the replayed batch not visited yet in this step

        def schedule_step_starts(self, token_budget):
            if self.replay is not None:
                waiting = {r.request_id for r in itertools.chain(self.skipped_waiting, self.waiting)}
                self.to_admit = sum(1 for request_id in self.replay if request_id in waiting)
            return token_budget

        def cap_running_tokens(self, request, num_new_tokens):
            if self.replay is None:
                return num_new_tokens
            return min(num_new_tokens, self.replay.get(request.request_id, 0))

        def cap_waiting_tokens(self, request, history_tokens, num_new_tokens):
            if self.replay is None:
                return num_new_tokens
            if request.request_id in self.replay:
                self.to_admit -= 1
                return min(num_new_tokens, self.replay[request.request_id])
            # Passed over while a request of the batch is still behind it; then admission stops, as
            # CPP's own hook stops it (a visit costs vLLM's loop a prefix-cache lookup).
            return -1 if self.to_admit > 0 else 0

    return Replay


# The engine thread's CPU time (other processes' load leaves it alone) or the wall clock.
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def run_side_by_side(schedulers, helpers, args, replayed=None, timing_starts=lambda: None, watched=None):
    """Mean microseconds of schedule() + update_from_output() per step, the schedulers taking turns.

    As vLLM's engine does under pipeline parallelism, each scheduler keeps ``args.in_flight``
    batches in flight: a step's output comes back (``update_from_output``) only once that
    many later steps are scheduled, and between steps the engine waits on the device for
    the oldest batch, for which the bench sleeps ``args.device_ms`` (untimed; CPP plans in
    that wait). Each scheduler runs ``args.block`` steps in turn (one step each with
    ``--block 1``), so a change of machine load falls on all of them alike. Timing starts
    once every decoder's prompt has been admitted (``timing_starts()`` is called then).
    ``replayed``: (index of a scheduler whose batches are recorded, index of a
    ``replay_class`` scheduler that runs them after it). ``watched``: the index of a scheduler whose
    running set is compared step to step (untimed). Returns the microseconds per step of each scheduler
    and the share of the watched one's steps that began with another running set than the step before.
    """
    source, replay = replayed if replayed is not None else (None, None)
    clock = CLOCKS[args.clock]
    batches: dict[int, dict[str, int]] = {}
    for scheduler in schedulers:
        for i in range(args.decodes):
            prompt = list(range(1 + 100 * i, 65 + 100 * i))
            scheduler.add_request(helpers.make_request(f"d{i}", prompt, max_tokens=10**6))
        for _ in range(1000):  # the decoders' prompts
            out = scheduler.schedule()
            scheduler.update_from_output(out, helpers.model_output(scheduler, out))
            if not scheduler.waiting and out.total_num_scheduled_tokens == len(scheduler.running):
                break
    timing_starts()
    running_before, changed = None, 0
    elapsed = [0.0] * len(schedulers)
    in_flight = [collections.deque() for _ in schedulers]
    for first in range(0, args.steps, args.block):
        for index, scheduler in enumerate(schedulers):
            for step in range(first, min(first + args.block, args.steps)):
                if args.with_arrivals and step % args.every == 0:
                    for k in range(args.burst):
                        start_id = 10**6 + 10_000 * (step * args.burst + k)
                        prompt = list(range(start_id, start_id + 6000 // (k + 1)))
                        scheduler.add_request(helpers.make_request(f"long{step}-{k}", prompt, max_tokens=1))
                if index == replay:
                    scheduler.replay = batches.pop(step)
                if index == watched:
                    running = {r.request_id for r in scheduler.running}
                    changed += running_before is not None and running != running_before
                    running_before = running
                start = clock()
                out = scheduler.schedule()
                elapsed[index] += clock() - start
                in_flight[index].append((out, helpers.model_output(scheduler, out)))
                if index == source:
                    batches[step] = dict(out.num_scheduled_tokens)
                elif index == replay:
                    scheduler.differed += scheduler.replay != out.num_scheduled_tokens
                if len(in_flight[index]) < args.in_flight:
                    continue
                time.sleep(args.device_ms / 1000.0)  # the engine waits on the device for the oldest batch
                start = clock()
                scheduler.update_from_output(*in_flight[index].popleft())
                elapsed[index] += clock() - start
    return [total / args.steps * 1e6 for total in elapsed], changed / max(1, args.steps - 1)


def positive_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers >= 1, comma-separated (e.g. 32,128,512), got {text!r}"
        )
    return values


def arrival_list(text: str) -> list[bool]:
    answers = {"yes": True, "no": False}
    if not text or any(part not in answers for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"expected yes, no or yes,no, got {text!r}")
    return [answers[part] for part in text.split(",")]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--decodes", type=positive_list, default=[32, 128, 512], help="running decodes, e.g. 32,128,512"
    )
    parser.add_argument(
        "--arrivals", type=arrival_list, default=[True, False], help="yes (prompts arrive), no, or both"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (the table gives medians)")
    parser.add_argument("--json", metavar="FILE", help="write the table's rows as JSON")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: the engine thread's CPU time (default; other processes on the machine do not count), wall: "
        "elapsed time",
    )
    parser.add_argument("--burst", type=int, default=1, help="prompts arriving together every --every steps")
    parser.add_argument("--every", type=int, default=20, help="steps between arrivals of prompts")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages CPP plans for (CPP needs at least 2)")
    parser.add_argument("--block", type=int, default=20, help="steps each scheduler runs in turn (1: lock-step)")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help="batches in flight, as vLLM's engine keeps one per pipeline stage (default --stages; 1: each "
        "step's output back before the next step)",
    )
    parser.add_argument(
        "--device-ms",
        type=float,
        default=5.0,
        help="the engine's wait on the device between steps, untimed (a long-context batch on an NPU takes "
        "tens of ms or more)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="also time CPP's own pieces of a step (step start, lookups, reservation, allotment, record, "
        "output); the timers cost a little, so use another run for the ratios",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the start-up heap to the garbage collector (the engine freezes it)",
    )
    args = parser.parse_args()
    args.in_flight = args.stages if args.in_flight is None else args.in_flight
    for name, low, high, what in (
        ("repeats", 1, 1000, "runs of each configuration"),
        ("steps", 1, MAX_STEPS, "timed steps of each scheduler"),
        ("every", 1, MAX_STEPS, "steps between arrivals"),
        ("burst", 1, 64, "prompts of 6000, 3000, 2000, ... tokens: past 64 one is under 100 tokens"),
        ("block", 1, MAX_STEPS, "steps each scheduler runs in turn"),
        ("stages", 2, MAX_STAGES, "CPP runs only under pipeline parallelism"),
        ("in_flight", 1, args.stages, "batches in flight: at most one a stage"),
    ):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} must be in [{low}, {high}] ({what}), got {getattr(args, name)}")
    if not 0 <= args.device_ms <= 1000:  # NaN fails both
        parser.error(f"--device-ms must be a number of ms in [0, 1000] (a second between steps), got {args.device_ms}")
    if max(args.decodes) > MAX_DECODES:
        parser.error(f"--decodes must be in [1, {MAX_DECODES}] (their KV blocks fit), got {max(args.decodes)}")
    if args.json:
        target = Path(args.json)
        if target.is_dir() or not target.parent.is_dir() or not os.access(target.parent, os.W_OK):
            parser.error(f"--json {args.json}: cannot write a file there (give a file in an existing, writable folder)")
    return args


def one_run(args, helpers, executor_cls, parts_s, planning_s) -> dict[str, float]:
    """The four schedulers side by side on one configuration (``args.decodes``, ``args.with_arrivals``)."""
    scheduler_cls = helpers.profiling_chunk_scheduler_class()
    tmp = Path(tempfile.mkdtemp(prefix="cpp-overhead-"))
    common = dict(
        model_dir=tmp / "model",
        num_blocks=16384,
        max_num_batched_tokens=2048,
        max_num_seqs=args.decodes + 8,
        max_model_len=16384,
        pipeline_parallel_size=args.stages,
    )
    fixed = helpers.make_scheduler(None, **common)
    balance_cls = helpers.load_balance_module().BalanceScheduler
    identity = helpers.make_scheduler(type("Hooked", (balance_cls,), {"uses_schedule_hooks": True}), **common)
    cpp = helpers.make_scheduler(
        scheduler_cls,
        additional_config={"profiling_chunk_config": {"enabled": True, "cache_dir": "", "profile_repeats": 1}},
        **common,
    )
    cpp.run_profiling_chunk_init(executor_cls())
    same_batches = helpers.make_scheduler(replay_class(balance_cls), **common)
    if not args.no_freeze:
        # As vLLM's engine core does once it is set up: the start-up heap (modules, the
        # schedulers, CPP's profile) is frozen, so the collector's oldest generation does
        # not walk it again and again while serving.
        from vllm.utils.gc_utils import freeze_gc_heap

        freeze_gc_heap()

    def timing_starts() -> None:
        planning_s.update(step=0.0, off=0.0)
        parts_s.update(dict.fromkeys(parts_s, 0.0))

    (fixed_us, identity_us, cpp_us, same_us), changed = run_side_by_side(
        (fixed, identity, cpp, same_batches), helpers, args, replayed=(2, 3), timing_starts=timing_starts, watched=2
    )
    if not args.with_arrivals:
        prompts = "no prompts arriving"
    else:
        prompts = "a 6000-token prompt" if args.burst == 1 else f"{args.burst} prompts (6000, 3000, ... tokens)"
        prompts += f" every {args.every} steps"
    print(f"\n{args.decodes} decoding requests, {prompts}, {args.steps} steps")
    print(f"{args.in_flight} batch(es) in flight, {args.device_ms:g} ms on the device between steps (untimed)")
    print(f"fixed chunks, vLLM's loop:        {fixed_us:8.1f} us per step")
    print(f"upstream's loop, identity hooks:  {identity_us:8.1f} us per step   ratio {identity_us / fixed_us:.2f}")
    print(f"CPP, upstream's loop:             {cpp_us:8.1f} us per step   ratio {cpp_us / fixed_us:.2f}")
    print(f"upstream's loop, CPP's batches:   {same_us:8.1f} us per step   ratio {same_us / fixed_us:.2f}")
    if same_batches.differed:
        print(f"  (its batch differed from CPP's in {same_batches.differed} of {args.steps} steps)")
    print(f"CPP over upstream's loop with identity hooks: {cpp_us / identity_us:.3f}")
    print(f"CPP over upstream's loop making the same batches (the decisions' cost): {cpp_us / same_us:.3f}")
    print(f"steps that began with another running set than the step before: {100 * changed:.1f}%")
    on_step, off_step = (planning_s[k] / args.steps * 1e6 for k in ("step", "off"))
    print(f"CPP's planning per step: {on_step:.1f} us in the step (counted above),", end=" ")
    print(f"{off_step:.1f} us in the planner thread")
    if parts_s:
        print("CPP's own pieces, us per step (timers included):")
        for label, seconds in parts_s.items():
            print(f"  {label:44s} {seconds / args.steps * 1e6:8.1f}")
    return {"identity": identity_us, "cpp": cpp_us, "same": same_us, "changed": changed}


def main() -> int:
    args = parse_args()
    _setup()
    import helpers
    from cpp_sched_parts import timing_parts, timing_plans
    from test_scheduler_profiling_chunk import FakeExecutor
    from vllm_ascend.core import cpp_policy

    planning_s = timing_plans(cpp_policy)
    parts_s = timing_parts(helpers.profiling_chunk_scheduler_class()) if args.parts else {}
    decodes, rows = args.decodes, []
    for count in decodes:
        for with_arrivals in args.arrivals:
            args.decodes, args.with_arrivals = count, with_arrivals
            runs = [one_run(args, helpers, FakeExecutor, parts_s, planning_s) for _ in range(args.repeats)]
            median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            rows.append(
                {
                    "decodes": count,
                    "arrivals": with_arrivals,
                    "decode_only": not with_arrivals,
                    "added_us_per_step": round(median["cpp"] - median["same"], 1),
                    "vs_same_batch": round(statistics.median(r["cpp"] / r["same"] for r in runs), 4),
                    "vs_identity": round(statistics.median(r["cpp"] / r["identity"] for r in runs), 4),
                    "set_changed_share": round(median["changed"], 4),
                }
            )
    print(f"\nCPP's cost per step, medians of {args.repeats} run(s) of {args.steps} steps (P = {args.stages}):")
    print("decodes  arrivals  added us/step  CPP/same-batch loop  CPP/identity hooks  steps with a set change")
    for row in rows:
        print(
            f"{row['decodes']:7d}  {'yes' if row['arrivals'] else 'no':>8s}  {row['added_us_per_step']:13.1f}"
            f"  {row['vs_same_batch']:19.3f}  {row['vs_identity']:18.3f}  {100 * row['set_changed_share']:22.1f}%"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
