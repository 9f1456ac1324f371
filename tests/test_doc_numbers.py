"""A number a doc states that the code holds is the code's: each test builds the doc's sentence from the
code's constants and defaults, and fails when the doc says something else (then fix the doc, or the code).

The config tables are checked the same way by test_config_tables.py.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import re
import sys

import pytest
from vllm_ascend.core import (
    cpp_acceptance,
    cpp_calibration,
    cpp_chunk_rule,
    cpp_falls,
    cpp_planner,
    cpp_policy,
    cpp_profile_store,
    cpp_profiling,
    cpp_samples,
    cpp_step_budget,
    cpp_traffic,
)
from vllm_ascend.core.cpp_config import parse_cpp_config
from vllm_ascend.core.cpp_profile_plan import history_levels_for
from vllm_ascend_patchset.e2e import bench as e2e_bench
from vllm_ascend_patchset.e2e import ds_bench, ds_smoke, trace_args, trace_figures, trace_replay
from vllm_ascend_patchset.e2e import run as e2e_run
from vllm_ascend_patchset.e2e import servers as e2e_servers
from vllm_ascend_patchset.e2e import smoke as e2e_smoke
from vllm_ascend_patchset.e2e.model import TINY_QWEN3
from vllm_ascend_patchset.paths import BENCH_DIR, CPU_SURFACE, DATA_DIR, OVERLAY_DIR, ROOT
from vllm_ascend_patchset.python_source import class_def, parse_file
from vllm_ascend_patchset.results_tables import policy, surface_of, table_rows, trace_summary
from vllm_ascend_patchset.twin import engine, optimum, slo, stress, surface, workloads
from vllm_ascend_patchset.twin.command import build_parser as twin_parser
from vllm_ascend_patchset.twin.policies import ours as ours_policy
from vllm_ascend_patchset.twin.surface_files import load_surface
from vllm_ascend_patchset.twin.traces import cached_prefix_tokens, read_trace

WORDS = {1: "once", 2: "two"}  # how the docs write small counts in prose
SHARES = {0.5: "half"}


def says(doc: str, phrase: str) -> None:
    """``doc`` holds ``phrase`` (white space folded, as docs wrap lines anywhere)."""
    text = " ".join((ROOT / doc).read_text().split())
    assert " ".join(phrase.split()) in text, f"{doc} should say: {phrase}"


def profile_runs(base_chunk_tokens: int, points: int, repeats: int, history_points: int) -> tuple[int, int, int, int]:
    """(sizes, history lengths, grid points too large for the deepest length, probe runs, runs) of one profiling
    round, as ``profile_plan`` makes it."""
    ladder = cpp_profiling.chunk_ladder(base_chunk_tokens, points)
    lengths = len(history_levels_for(base_chunk_tokens, 16 * base_chunk_tokens, history_points))
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=base_chunk_tokens,
        points=points,
        repeats=repeats,
        history_points=history_points,
        max_history_tokens=16 * base_chunk_tokens,
    )
    grid = {(c, h) for c, h in plan if c in ladder}
    probe = len(plan) // repeats - len(grid)
    return len(ladder), lengths, len(ladder) * lengths - len(grid), probe, len(plan)


# ----------------------------------------------------------------------------- docs/cpp.md


def test_the_profile_the_cpp_doc_counts_is_the_default_plan():
    defaults = parse_cpp_config({})
    points, repeats, history = defaults.profile_points, defaults.profile_repeats, defaults.profile_history_points
    sizes, lengths, unfit, probe, runs = profile_runs(8192, points, repeats, history)
    ladder = cpp_profiling.chunk_ladder(8192, points)
    probed = {size for size, _ in cpp_profiling.tile_probe(8192)}
    on_ladder = [size for size in probed if size in ladder]
    says(
        "docs/cpp.md",
        f"At a base chunk of 8192 and the default settings that is {sizes} sizes x {lengths} lengths, less "
        f"{WORDS[unfit]} at the deepest, + {probe} probe runs (each S is on the ladder), in {repeats} passes: {runs} "
        f"runs after the {cpp_profiling.WARMUP_RUNS} warm-up runs",
    )
    assert len(probed) == 2 * len(on_ladder) == 2 * len(cpp_acceptance.TILE_CANDIDATES)
    says(
        "vllm_ascend_overlay/core/cpp_profiling.py",
        f"{sizes} sizes x {lengths} lengths, less {WORDS[unfit]} at the deepest, + {probe} probe runs (each S is on "
        f"the ladder), {repeats} passes: {runs} runs after {cpp_profiling.WARMUP_RUNS} warm-up runs",
    )
    says("docs/cpp.md", f"each {cpp_profiling.PROBE_REPEATS} times a pass (S counting its run on the ladder)")
    says("docs/cpp.md", f"runs real forward passes: {WORDS[cpp_profiling.WARMUP_RUNS]} warm-up runs (dropped)")
    says("docs/cpp.md", f"the 1-1.5-2 ladder: {', '.join(map(str, ladder[:8]))}, ... up to the base chunk")
    tiles = cpp_acceptance.TILE_CANDIDATES
    says("docs/cpp.md", f"each candidate tile ({min(tiles)} to {max(tiles)} tokens), without history")


def test_the_cpp_docs_cost_of_the_profile_is_the_default_plans():
    d = parse_cpp_config({})
    ladder = cpp_profiling.chunk_ladder(8192, d.profile_points)
    plan = cpp_profiling.profile_plan(
        base_chunk_tokens=8192,
        points=d.profile_points,
        repeats=d.profile_repeats,
        history_points=d.profile_history_points,
        max_history_tokens=16 * 8192,
    )
    one_pass = plan[: len(plan) // d.profile_repeats]
    levels = history_levels_for(8192, 16 * 8192, d.profile_history_points)
    grid = [(c, h) for h in levels for c in ladder if c + h <= 17 * 8192]
    probe = one_pass[len(grid) :]
    assert one_pass[: len(grid)] == grid
    passes = sum(ladder) / 8192
    deepest = sum(c for c, h in grid if h == levels[-1]) / 8192
    top, small = ladder[-4:], [c for c in ladder if c <= 512]
    assert round(sum(top) / sum(ladder), 2) == 0.75
    says(
        "docs/design-cpp.md",
        f"the default ladder adds up to {sum(ladder):,} tokens, {passes:.1f} base chunks, three quarters of them in "
        f"its four largest sizes ({top[0]} to {top[-1]})",
    )
    says(
        "docs/design-cpp.md",
        f"the ladder's {len(small)} sizes of 512 tokens or less hold {sum(small):,} tokens and the tile probe's "
        f"{len(probe)} runs a pass {sum(c for c, _ in probe):,}",
    )
    per_pass = round(passes, 1)
    says(
        "docs/cpp.md",
        f"x {per_pass:g} forward passes of the base chunk at each length ({deepest:.1f} at the deepest), from no "
        f"history to the deepest ({(d.profile_history_points * passes + deepest) * d.profile_repeats:.0f} at the "
        f"defaults), plus {len(plan)} steps' fixed cost",
    )
    share, every = cpp_profiling.PROGRESS_SHARE, cpp_profiling.PROGRESS_EVERY_S
    assert share == 0.1
    says("docs/cpp.md", f"(at most one every tenth of the runs and every {every:g} s: a quick profile logs none)")


def test_the_cpp_docs_thresholds_are_the_codes():
    a, c = cpp_acceptance, cpp_calibration
    says("docs/cpp.md", f"histories from none to at least {SHARES[cpp_profile_store.CACHED_HISTORY_COVERAGE]} of what")
    f = cpp_falls
    says("docs/cpp.md", f"A fall by more than {f.FALL_SIGMAS:g} standard errors of")
    says("docs/cpp.md", f"(from the scatter between repeats of one point) and more than {f.ODD_MIN_FALL:.0%} is kept")
    says("docs/cpp.md", f"each has at least {f.CONFIRM_SAMPLES} runs (a median of three outvotes one bad run)")
    assert f.CONFIRM_SAMPLES == 3
    says("docs/cpp.md", f"its two points only, within the {cpp_profiling.LOCATE_RUNS} runs after the rounds")
    says("docs/cpp.md", f"more than {a.UNSTABLE_LOSS:.0%} slower than the full model's own, the same runs are measured")
    says("docs/cpp.md", f"are measured {WORDS[cpp_profiling.EXTRA_ROUNDS]} more")
    says("docs/design-cpp.md", f"by more than {a.FALL_SIGMAS:g} standard errors of the two medians")
    says("docs/design-cpp.md", f"by more than {a.STEP_TOKENS} tokens' worth at the steeper slope measured to the sizes")
    says("docs/cpp.md", f"({cpp_chunk_rule.DEFAULT_FLOOR_TOKENS} tokens by default, rounded up to a measured tile)")
    says("docs/cpp.md", "T minimises the predicted mean end-to-end latency of the requests in flight")
    says(
        "docs/cpp.md",
        f"(the ratio nine in ten of the latest {cpp_policy.PACE_WINDOW} reach; steps over "
        f"{cpp_policy.MAX_PACE_FACTOR:g}x their prediction left out while a minority: stalls)",
    )
    assert cpp_policy.PACE_QUANTILE_TENTHS == 9
    says("docs/design-cpp.md", f"The first {cpp_planner.PLAN_MAX_PREFILLS} prefills are planned one by one")
    says("docs/design-cpp.md", f"a plan not back within {cpp_policy.PLAN_TIMEOUT_S:g} s is a fault")
    says("docs/design-cpp.md", f"one behind it is still admitted; at most {cpp_step_budget.PASS_OVER_LIMIT} per step")
    says("docs/cpp.md", f"the first {cpp_step_budget.PASS_OVER_LIMIT} waiting requests (from their prefix-cache hits")
    says("docs/cpp.md", f"latest prefills is within {cpp_planner.TUNED_CHUNK_SLACK:.0%} of the least")
    window, fewest = cpp_traffic.TRAFFIC_WINDOW, cpp_traffic.MIN_ARRIVALS
    says("docs/design-cpp.md", f"the arrival rate over the latest {window} arrivals (none before {fewest})")
    says("docs/design-cpp.md", f"the sizes of the latest {cpp_traffic.TRAFFIC_WINDOW} prefills")
    refit_every = inspect.signature(c.OnlineCalibration).parameters["refit_every"].default
    max_shift = inspect.signature(c.OnlineCalibration).parameters["max_shift"].default
    says("docs/cpp.md", f"Every {refit_every} timed steps, if the model is off by more than {c.CALIBRATED_ERROR:.0%}")
    says("docs/design-cpp.md", f"differ in size by {c.MIN_WINDOW_SPREAD:g}x or more")
    says("docs/design-cpp.md", f"shrunk towards the profile by {WORDS[int(c.PRIOR_WEIGHT)]} steps' worth of trust")
    assert c.PRIOR_WEIGHT == int(c.PRIOR_WEIGHT)
    says("docs/design-cpp.md", f"no point moves by more than {max_shift:.0%}")
    says(
        "docs/design-cpp.md",
        f"halves the window's error or lowers it by over {c.CALIBRATED_ERROR:.0%}".replace("%", " points"),
    )
    says(
        "docs/cpp.md",
        f"halves the error on the window or lowers it by over {c.CALIBRATED_ERROR:.0%}".replace("%", " points"),
    )
    assert cpp_samples.MIN_LATENCY_MS == 1e-3 and 3600e3 <= cpp_samples.MAX_LATENCY_MS <= 24 * 3600e3
    says("docs/cpp.md", "a latency outside a microsecond to hours")


def test_the_cpp_docs_step_placing_is_the_codes():
    a, p, d = cpp_acceptance, cpp_profiling, parse_cpp_config({})
    *_, runs = profile_runs(8192, d.profile_points, d.profile_repeats, d.profile_history_points)
    says("docs/cpp.md", f"{runs} runs after the {p.WARMUP_RUNS} warm-up runs, and up to")
    says("docs/design-cpp.md", f"to within {a.LOCATE_TOKENS} tokens, the optimum's grid")
    says("docs/design-cpp.md", f"a run within {WORDS[int(p.LOCATE_UNSURE)]} scatters of it is measured once more")
    says("docs/design-cpp.md", f"a run at it and one {a.LOCATE_TOKENS} tokens past it")
    says("docs/design-cpp.md", f"a step when at least {SHARES[a.PAIR_SHARE]} of that segment's growth")
    says("docs/design-cpp.md", f"one token past twice it, {p.PROBE_REPEATS} times each")
    after = p.after_rounds_budget([None] * runs)
    assert runs // p.AFTER_ROUNDS_SHARE == after and runs + after == 218  # the budget at the defaults
    says("docs/design-cpp.md", f"All of this takes at most {p.LOCATE_RUNS} runs, and")
    says("docs/design-cpp.md", f"at most {after}, so the default profile stays within {runs + after}")
    says("docs/cpp.md", f"and up to {after} more in all (a sixteenth of a round's): up to {p.LOCATE_RUNS} to")
    says("docs/cpp.md", f"profile stays within {runs + after} runs, odd points included")
    assert max(1, d.profile_repeats // 2) == 1
    says("docs/cpp.md", "(once, half the repeats, within the")
    says("docs/cpp.md", f"departs from its size's neighbours by more than {cpp_falls.ODD_MIN_FALL:.0%}")


def test_the_overhead_bench_runs_the_workload_the_cpp_doc_describes():
    """scripts/bench/cpp_sched_overhead.py: its default decodes, and the long prompt it adds every so many steps."""
    tree = parse_file(BENCH_DIR / "cpp_sched_overhead.py")
    source = ast.unparse(tree)
    decodes = re.search(r"'--decodes', type=positive_list, default=\[(\d+), (\d+), (\d+)\]", source).groups()
    every = re.search(r"'--every', type=int, default=(\d+)", source).group(1)
    length = re.search(r"start_id \+ (\d+) // \(k \+ 1\)", source).group(1)
    counts = f"{decodes[0]}, {decodes[1]} and {decodes[2]}"
    says(
        "docs/design-cpp.md",
        f"{counts} decodes (`--decodes`), with a {length}-token prompt every {every} steps and without",
    )
    device_ms = float(re.search(r"'--device-ms', type=float, default=([\d.]+)", source).group(1))
    says("docs/design-cpp.md", f"a {device_ms:g} ms untimed wait on the device between steps (`--device-ms`)")


# ----------------------------------------------------------------------------- docs/cpp-twin.md


def test_the_twin_docs_numbers_are_the_codes():
    says("docs/cpp-twin.md", f"one id per {workloads.TRACE_BLOCK_TOKENS}-token block")
    says("docs/cpp-twin.md", f"in its own {engine.BLOCK_TOKENS}-token blocks")
    says("docs/cpp-twin.md", f"`--slo-reference` tokens ({slo.REFERENCE_TOKENS // 1024}k")
    says("docs/cpp-twin.md", f"TTFT <= {slo.TTFT_FACTOR:g} x the reference prompt's TTFT alone")
    says("docs/cpp-twin.md", f"an accelerator-like quadratic with a {surface.SYNTHETIC.fixed_ms:g} ms per-step cost")
    says("docs/cpp-twin.md", f"any chunking of the prompt on a {optimum.GRID_TOKENS}-token grid")
    rel_tol = inspect.signature(optimum.optimum).parameters["rel_tol"].default
    says("docs/cpp-twin.md", f"until the result is certified to {rel_tol:.0e}".replace("e-0", "e-"))
    says("docs/cpp-twin.md", f"sin(2 pi k / {surface.StageTimer.DRIFT_PERIOD_CALLS})")
    says("docs/cpp-twin.md", f"COUNT to `--requests` ({twin_parser().parse_args([]).requests})")
    defaults = parse_cpp_config({})
    *_, runs = profile_runs(8192, defaults.profile_points, defaults.profile_repeats, defaults.profile_history_points)
    warm_up = cpp_profiling.WARMUP_RUNS
    says("docs/cpp-twin.md", f"ours: {runs + warm_up} profiling runs; latency model from profiled ({runs} runs after")
    says("docs/cpp-twin.md", f"({runs} runs after {warm_up} warm-up in ")
    names = sorted(set(re.findall(r"`stress:([\w-]+)`", (ROOT / "docs/cpp-twin.md").read_text())))
    assert names == sorted(stress.STRESS_SURFACES)
    assert cpp_samples.MAX_TOKENS == 2**30
    says("docs/cpp-twin.md", "whole token counts up to 2^30")


def test_the_default_goodput_bounds_the_twin_doc_quotes_are_the_codes():
    bounds = {
        name: [slo.default_slo(load_surface(spec), stages, slo.REFERENCE_TOKENS) for stages in (2, 4)]
        for name, spec in (("synthetic", "synthetic"), ("cpu", str(CPU_SURFACE)))
    }
    ttft = {name: [f"{b.ttft_ms / 1000:.2f} s" for b in pair] for name, pair in bounds.items()}
    tpot = {name: [f"{b.tpot_ms:.0f} ms" for b in pair] for name, pair in bounds.items()}
    says(
        "docs/cpp-twin.md",
        f"On the synthetic surface: {ttft['synthetic'][0]} at P = 2, {ttft['synthetic'][1]} at P = 4; on the CPU "
        f"surface {ttft['cpu'][0]} and {ttft['cpu'][1]}.",
    )
    says(
        "docs/cpp-twin.md",
        f"Synthetic: {tpot['synthetic'][0]} (P = 2), {tpot['synthetic'][1]} (P = 4); CPU: {tpot['cpu'][0]}, "
        f"{tpot['cpu'][1]}.",
    )


def test_the_prefix_hits_of_the_bench_slices_are_what_the_twin_doc_counts():
    records = read_trace(DATA_DIR / "traces" / "mooncake.jsonl", 96)
    counted = {}
    for start in (0, 32, 64):
        part = records[start : start + 32]
        hits = cached_prefix_tokens(part, engine.BLOCK_TOKENS)
        counted[start] = (sum(1 for h in hits if h), sum(hits) / sum(r.input_tokens for r in part))
    names = {0: "none", 1: "one", 2: "two"}
    says(
        "docs/cpp-twin.md",
        f"`@32:32` has {names[counted[32][0]]} hits ({counted[32][1]:.0%} of its prompt tokens), `@64:32` "
        f"{names[counted[64][0]]}, `@0:32` {names[counted[0][0]]}.",
    )


def test_the_trace_section_of_make_bench_is_what_the_twin_doc_describes():
    makefile = (ROOT / "Makefile").read_text()
    sweep = re.search(r"--sweep ([\d,]+)", makefile).group(1).split(",")
    loads = re.search(r"--load ([\d.,]+)", makefile).group(1).split(",")
    stages = re.search(r"--stages ([\d,]+) --sweep", makefile).group(1).split(",")
    chunk = twin_parser().parse_args([]).chunk
    says("docs/cpp-twin.md", f"a **shorter sweep, {' and '.join(sweep)}** (and `--chunk`, {chunk})")
    says("docs/cpp-twin.md", f"loads {', '.join(loads[:-1])} and {loads[-1]}, P = {' and '.join(stages)}")


# ----------------------------------------------------------------------------- docs/e2e.md


def test_the_e2e_docs_profile_runs_are_what_the_servers_ask_for():
    chunk = e2e_bench_defaults().chunk
    profile = e2e_servers.OURS_PROFILE
    points, repeats, history = profile["profile_points"], profile["profile_repeats"], profile["profile_history_points"]
    sizes, lengths, unfit, probe, runs = profile_runs(chunk, points, repeats, history)
    defaults = parse_cpp_config({})
    *_, default_runs = profile_runs(chunk, defaults.profile_points, defaults.profile_repeats, history)
    says(
        "docs/e2e.md",
        f"`profile_points {points}`, `profile_repeats {repeats}`, `profile_history_points {history}`: at the base "
        f"chunk of {chunk} that is {sizes} sizes x {lengths} lengths, less {WORDS[unfit]} at the deepest, + {probe} "
        f"probe runs in {repeats} passes, "
        f"{runs} runs after the warm-up (the defaults would make {default_runs})",
    )
    smoke_points = e2e_smoke.SMOKE_PROFILE_POINTS
    ladder = cpp_profiling.chunk_ladder(chunk, smoke_points)
    *_, smoke_runs = profile_runs(chunk, smoke_points, repeats, history)
    assert smoke_runs == runs, "the smoke and the bench profile the same runs, as the doc says"
    says(
        "docs/e2e.md",
        f"It passes `profile_points` {smoke_points} where the bench passes {points}; at the base chunk of {chunk} "
        f"the ladder has {len(ladder)} sizes ({ladder[0]} to {ladder[-1]} tokens), so both make the same {runs} runs",
    )
    assert ours_policy(chunk).additional_config["profiling_chunk_config"]["enabled"]


def e2e_bench_defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    e2e_bench.add_arguments(parser)
    return parser.parse_args([])


def test_the_e2e_docs_settings_are_the_servers_and_the_benchs():
    smoke = e2e_run.build_parser().parse_args(["smoke"])
    context = smoke.prompt_tokens + e2e_smoke.SMOKE_CONTEXT_SLACK
    says(
        "docs/e2e.md",
        f"The smoke serves with `--max-model-len` {context} (its {smoke.prompt_tokens // 1024}k prompt plus "
        f"{e2e_smoke.SMOKE_CONTEXT_SLACK // 1024}k)",
    )
    says("docs/e2e.md", f"Serve a {smoke.prompt_tokens // 1024}k-token prompt")
    command = e2e_servers.serve_command(e2e_servers.fixed(512), ROOT, 1, ROOT)
    seqs = command[command.index("--max-num-seqs") + 1]
    says("docs/e2e.md", f"`--max-num-seqs {seqs}`, `--max-model-len {e2e_servers.MAX_MODEL_LEN}`")
    says("docs/e2e.md", f"`VLLM_CPU_KVCACHE_SPACE={e2e_servers.server_env()['VLLM_CPU_KVCACHE_SPACE']}` (GiB)")
    says("docs/e2e.md", f"SIGKILL after {e2e_servers.STOP_GRACE_S:g} s")
    says(
        "docs/e2e.md", f"({e2e_servers.READY_TIMEOUT_S:g} s to ready, {e2e_servers.REQUEST_TIMEOUT_S:g} s per request)"
    )
    bench = e2e_bench_defaults()
    says("docs/e2e.md", f"fixed chunks (`--fixed`, default {bench.fixed})")
    says("docs/e2e.md", f"ours (base chunk `--chunk` {bench.chunk})")
    first, second = (int(v) for v in bench.prompts.split(","))
    says("docs/e2e.md", f"(default {first} and {second})")


def test_the_e2e_docs_model_is_the_one_made():
    m = TINY_QWEN3
    says(
        "docs/e2e.md",
        f"a Qwen3 with {m['num_hidden_layers']} layers ({m['num_hidden_layers'] // 2} per stage), hidden size "
        f"{m['hidden_size']}, {m['num_attention_heads']} query and {m['num_key_value_heads']} KV heads of "
        f"{m['head_dim']}, vocabulary {m['vocab_size']}",
    )
    says("docs/e2e.md", f"`max_position_embeddings` {m['max_position_embeddings']}")


def test_the_e2e_docs_dual_stream_settings_are_the_smokes_and_the_benchs():
    lens = ds_smoke.PROMPT_LENS
    count = {4: "Four", 6: "Six", 8: "Eight"}.get(len(lens), str(len(lens)))  # the doc opens a sentence with it
    says(
        "docs/e2e.md",
        f"{count} prompts of {min(lens)} to {max(lens)} tokens go in one request (greedy, "
        f"{ds_smoke.MAX_TOKENS} tokens each) with a {ds_smoke.BUDGET}-token budget",
    )
    says("docs/e2e.md", f"`length_threshold` is {ds_smoke.LENGTH_THRESHOLD}, so which steps split")
    cpp_lens = ds_smoke.CPP_PROMPT_LENS
    assert len(cpp_lens) == 12 and len(cpp_lens) <= 16  # --max-num-seqs 16: all of them in the batch
    says("docs/e2e.md", f"measured on the host as it is: twelve prompts of {min(cpp_lens)} to {max(cpp_lens)} tokens")
    cpp_split = ds_smoke.CPP_DUAL_STREAM
    says(
        "docs/e2e.md",
        f"by request count (`split_strategy: {cpp_split['split_strategy']}`) and takes any split "
        f"(`length_threshold: {cpp_split['length_threshold']}`)",
    )
    parser = argparse.ArgumentParser()
    ds_bench.add_arguments(parser)
    bench = parser.parse_args([])
    says(
        "docs/e2e.md",
        f"make bench-e2e-ds # TP = 2, {bench.prompts} x {bench.prompt_tokens}-token prompts per batch, "
        f"{bench.alpha_us:g} us / {bench.beta_gbps:g} GB/s",
    )


def test_the_e2e_trace_mode_the_doc_describes_is_the_codes():
    bench = e2e_run.build_parser().parse_args(["bench", "--trace", str(DATA_DIR / "traces" / "mooncake.jsonl")])
    trace_args.check_trace_args(bench)  # the trace mode's defaults
    says("docs/e2e.md", f"COUNT {trace_replay.DEFAULT_COUNT} when left out")
    says("docs/e2e.md", f"than the servers' `--max-model-len` {e2e_servers.MAX_MODEL_LEN} is skipped")
    says("docs/e2e.md", f"at most `--output-cap` (default {bench.output_cap})")
    says("docs/e2e.md", f"at `--load` (default {bench.load:g})")
    says("docs/e2e.md", f"the `--fixed-pick` (default {bench.fixed_pick})")
    flags = trace_replay.server_args()
    block, seqs = flags[flags.index("--block-size") + 1], flags[flags.index("--max-num-seqs") + 1]
    assert "--enable-prefix-caching" in flags and "--enable-prompt-tokens-details" in flags
    says("docs/e2e.md", f"`--enable-prefix-caching --block-size {block} --max-num-seqs {seqs}`")
    says("docs/e2e.md", f"one {len(trace_replay.WARM_UP_IDS)}-token warm-up request")
    says("docs/e2e.md", f"each {workloads.TRACE_BLOCK_TOKENS}-token block")
    says("docs/e2e.md", f"(ids below {workloads.VOCAB_TOKENS}")
    says("docs/e2e.md", f"twin/real mean TTFT within 1 +/- {trace_figures.FIDELITY_GOAL:g} for every policy")
    assert trace_figures.STANDARD_ERRORS == 2
    says("docs/e2e.md", "more than two standard errors")
    says("docs/e2e.md", f"ours' TPOT P99 at most {trace_figures.TPOT_P99_GOAL:g} x the best fixed chunk's")


def test_the_e2e_trace_slice_is_what_the_doc_says():
    records = read_trace(DATA_DIR / "traces" / "mooncake.jsonl", 400)
    limit, count = e2e_servers.MAX_MODEL_LEN, trace_replay.DEFAULT_COUNT
    cap = trace_args.TRACE_DEFAULTS["output_cap"]
    shares = {}
    for start in range(len(records) - count + 1):
        window = records[start : start + count]
        if all(r.input_tokens + min(max(r.output_tokens, 1), cap) <= limit for r in window):
            hits = cached_prefix_tokens(window, trace_replay.CACHE_BLOCK_TOKENS)
            shares[start] = sum(hits) / sum(r.input_tokens for r in window)
    ranked = sorted(shares, key=shares.get, reverse=True)
    assert ranked[0] == 42
    says("docs/e2e.md", f"of the {len(shares)} windows of {count} requests of the committed Mooncake head")
    says("docs/e2e.md", f"largest share of prefix hits (the next has {shares[ranked[1]]:.0%})")
    window = records[42 : 42 + count]
    hits = cached_prefix_tokens(window, trace_replay.CACHE_BLOCK_TOKENS)
    lengths = [r.input_tokens for r in window]
    says(
        "docs/e2e.md",
        f"prompts of {min(lengths)} to {max(lengths)} tokens, {sum(lengths)} in all, {sum(hits)} of them "
        f"({sum(hits) / sum(lengths):.1%}) expected hits: request 49 repeats {hits[49 - 42]} tokens of request 42's "
        f"prompt, request 61 {hits[61 - 42]} of request 57's",
    )
    assert [i + 42 for i, h in enumerate(hits) if h] == [49, 61]
    assert window[49 - 42].block_ids[:10] == window[0].block_ids[:10]
    assert window[61 - 42].block_ids[:10] == window[57 - 42].block_ids[:10]
    rest = [n for i, n in enumerate(lengths) if i + 42 not in (42, 49)]
    short, long = [n for n in rest if n < 10000], [n for n in rest if n >= 10000]
    says("docs/e2e.md", f"short chat turns ({min(short)} to {max(short)} tokens)")
    says("docs/e2e.md", f"long documents ({min(long)} to {max(long)})")


# ----------------------------------------------------------------------------- docs/dual-stream.md


def test_the_dual_stream_doc_lists_the_four_events_of_the_code():
    """``EventKind`` in dual_stream/streams.py, read from source (the module imports torch)."""
    kinds = class_def(parse_file(OVERLAY_DIR / "dual_stream" / "streams.py"), "EventKind")
    members = [t.id for node in kinds.body if isinstance(node, ast.Assign) for t in node.targets]
    documented = re.findall(r"^\| `([A-Z_]+)` \|", (ROOT / "docs/dual-stream.md").read_text(), re.M)
    assert documented == members
    says("docs/dual-stream.md", f"{['One', 'Two', 'Three', 'Four'][len(members) - 1]} events per layer and micro-batch")


@pytest.mark.parametrize("doc", ["docs/cpp.md", "docs/cpp-twin.md", "docs/e2e.md", "docs/dual-stream.md"])
def test_says_finds_a_phrase_across_a_line_break_and_nothing_else(doc):
    text = (ROOT / doc).read_text()
    first_line = next(line for line in text.splitlines() if len(line.split()) > 4)
    says(doc, first_line.replace(" ", "\n  ", 1))
    with pytest.raises(AssertionError, match="should say"):
        says(doc, first_line + " and a sentence no doc holds")


# ----------------------------------------------------------------------------- docs/results.md and its quotes


@pytest.fixture(scope="module")
def results():
    """scripts/bench/results.py, and the saved bench outputs docs/results.md is rendered from."""
    spec = importlib.util.spec_from_file_location("results", BENCH_DIR / "results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["results"] = module
    spec.loader.exec_module(module)
    return module, module.load(module.SAVED)


def test_the_results_pages_are_what_the_saved_bench_outputs_render(results):
    module, saved = results
    texts = {page: page.read_text() for page in module.PAGES}
    module.check_markers(texts)  # every source's table is on one of them
    for page, text in texts.items():
        assert module.rewrite(text, saved) == text, f"{page.name} is stale; run: make results"


def test_the_twin_figures_the_readme_and_the_cpp_doc_quote_are_the_results_pages(results):
    saved = results[1]
    (case,) = [c for c in saved["twin-long"]["output"] if surface_of(c) == "cpu_surface" and c["stages"] == 4
               and c["workload"] == "long-128k"]  # fmt: skip
    ours, upstream, fixed, tuned = (
        policy(case, name)["ttft_mean_ms"] for name in ("ours", "upstream-cpp", "vllm-fixed-8192", "tuned-fixed")
    )
    assert abs(ours / tuned - 1) < 0.005  # "level with"
    long_prompt = (
        f"{1 - ours / upstream:.0%} less time to first token than upstream's CPP, {1 - ours / fixed:.0%} less than "
        f"vLLM's fixed 8192, within {ours / case['optimum']['best_ms'] - 1:.1%} of the optimum and level with the "
        "best fixed chunk"
    )
    cpu, syn = (trace_summary(saved["twin-traces"], s) for s in ("cpu_surface", "synthetic"))
    traces = (
        f"{cpu['cases'] + syn['cases']} cases (3 slices, loads 0.5-0.95, P = 2 and 4, two surfaces): mean TTFT "
        f"{cpu['ttft']:.2f}x (CPU surface) and {syn['ttft']:.2f}x (synthetic) the tuned fixed chunk's, mean "
        f"end-to-end {cpu['e2e']:.2f}x and {syn['e2e']:.2f}x, goodput {cpu['goodput']:.0f}% and "
        f"{syn['goodput']:.0f}% against {cpu['tuned_goodput']:.0f}% and {syn['tuned_goodput']:.0f}%"
    )
    over, worst = cpu["tpot_tail_cases"] + syn["tpot_tail_cases"], max(cpu["tpot_worst"], syn["tpot_worst"])
    cases = cpu["cases"] + syn["cases"]
    tail = (
        f"its P99 over 1.10x the tuned chunk's in {over} of the {cases} cases (at most {worst:.2f}x)"
        if over
        else f"TPOT P99 within 1.10x the tuned chunk's in all {cases} cases (at most {worst:.2f}x)"
    )
    for phrase in (long_prompt, traces, tail):
        says("README.md", phrase)
        says("docs/cpp.md", phrase)


def test_the_cpu_engine_and_dual_stream_figures_the_readme_quotes_are_the_results_pages(results):
    saved = results[1]
    faster = sorted(1 - float(r["vs upstream"]) for r in table_rows(saved["e2e-prompt"]) if r["policy"] == "ours")
    repeats = {r["prompt"]: r for r in table_rows(saved["e2e-repeats"]) if r["policy"] == "ours"}
    ratio = {k: [float(v) for v in r["ours / fixed-1024 (mean, ± 2 s.e.)"].split("±")] for k, r in repeats.items()}
    assert abs(ratio["16k"][0] - 1) < 0.005 and abs(ratio["32k"][0] - 1) < ratio["32k"][1]  # level; within 2 s.e.
    says(
        "README.md",
        f"{100 * faster[0]:.1f}-{100 * faster[-1]:.1f}% faster than upstream's CPP; against the best fixed chunk, "
        f"level at 16k and {1 - ratio['32k'][0]:.1%} faster at 32k, within twice the standard error",
    )
    runs: dict[str, dict[str, dict[str, str]]] = {}
    for row in table_rows(saved["e2e-trace"]):
        runs.setdefault(row["run"], {})[row["policy"]] = row
    ttft, tpot = [], []
    for rows in runs.values():
        best = min((r for name, r in rows.items() if name.startswith("fixed-")), key=lambda r: float(r["TTFT mean"]))
        ttft.append(float(rows["ours"]["TTFT mean"]) / float(best["TTFT mean"]))
        tpot.append(float(rows["ours"]["TPOT P99"]) / float(best["TPOT P99"]))
    says(
        "README.md",
        f"{len(runs)} runs: mean TTFT {min(ttft):.2f}-{max(ttft):.2f}x the best fixed chunk's with TPOT P99 "
        f"{min(tpot):.2f}-{max(tpot):.2f}x it",
    )
    (comm35,) = [r for r in table_rows(saved["ds-bench"]) if r["link"] == "comm35"]
    dual = comm35["2600-token prompts, 5.2k / 15.6k tokens: dual/single, eff"].split(",")[0]
    says("README.md", f"a link emulated at 35% of the time in communication), 2600-token prompts: {dual}x the single")
    printed = saved["cpp-sched-overhead"]["output"]["stdout"].splitlines()  # the bench's closing table
    (cost,) = [line.split() for line in printed if line.split()[:2] == ["128", "yes"]]
    same, hooks = float(cost[3]), float(cost[4])
    says(
        "README.md",
        f"with 128 decodes and prompts arriving, {hooks:.2f}x the CPU time of upstream's loop with "
        f"identity hooks at P = 4 ({same:.2f}x the loop making the same batches)",
    )


def test_the_cpp_docs_gains_are_the_results_pages(results):
    cases = results[1]["twin-long"]["output"]
    to_optimum = max(policy(c, "ours")["ttft_mean_ms"] / c["optimum"]["best_ms"] for c in cases)
    to_tuned = max(policy(c, "ours")["ttft_mean_ms"] / policy(c, "tuned-fixed")["ttft_mean_ms"] for c in cases)
    says(
        "docs/cpp.md",
        f"over the {len(cases)} cases of 32k to 256k tokens, P = 2 to 8 and both surfaces, within "
        f"{to_optimum - 1:.1%} of the optimum and at most {to_tuned - 1:.1%} behind the best fixed chunk",
    )
