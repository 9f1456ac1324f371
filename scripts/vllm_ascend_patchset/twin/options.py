"""The twin's options: parsing, checks that name the option, and the workloads they give.

``--workload`` takes comma-separated items: ``long:<tokens>``, ``mixed``, and
``trace:PATH[@START[:COUNT]]`` (``traces``; COUNT defaults to ``--requests``). Every
``mixed`` and ``trace`` item runs at each of the ``--load`` values (comma-separated), so
one invocation holds all of a sweep's cases. ``--slo-*`` set the goodput bounds (``slo``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from .engine import BLOCK_TOKENS, MAX_NUM_SEQS, MODEL_LEN_SLACK_TOKENS, TINY_MODEL_MAX_POSITIONS
from .slo import REFERENCE_TOKENS, Slo, default_slo
from .surface import Surface
from .surface_files import load_surface
from .traces import parse_trace_item, trace_workload
from .workloads import Workload, long_prompt, mixed

LONGEST_REQUEST_TOKENS = TINY_MODEL_MAX_POSITIONS - MODEL_LEN_SLACK_TOKENS  # prompt + output the twin's model takes

# Upper (and lower) bounds of the options that size a run, from what the twin can mean; each is checked before
# any worker starts (an unbounded value used to run for minutes and then fail with a MemoryError, or finish
# with figures not to be trusted).
MAX_STAGES = 64  # PP splits a model's layers over its stages (61 layers in DeepSeek-V3, 126 in Llama 3 405B) and
# deployments use a few dozen stages at most; past 64 a stage holds one or two layers of any model
MAX_REQUESTS = 10_000  # requests of a workload: a worker replays every one of them once per policy and swept
# chunk (about a dozen runs a case), at 20 to 40 ms a request and run on a CPU core: 10,000 take an hour or more
MAX_WORKLOAD_TOKENS = 1 << 25  # prompt + output tokens of a workload: each worker holds every prompt's token ids
# (some 50 bytes a token as vLLM's Python lists), so 32 Mi tokens are about 1.6 GB a worker, and up to three
# workers (one per tree) run side by side
REQUESTS_WHY = "every worker replays each request once per policy and swept chunk"
MAX_NOISE = 1.0  # sigma of the log-normal stage-time noise, relative: at 1 one sigma already spans 0.37x..2.7x
# of a stage's time; above it the noise, not the surface, decides every batch
MIN_LOAD = 0.01  # offered prefill load, a fraction of capacity: at 1% requests already run alone (the figures
# are those of any lower load), and far lower the arrivals grow so large that a step's ms is lost beside them
MAX_LOAD = 100.0  # at 100x capacity every request queues behind all earlier ones: a burst a higher load only
# compresses
MAX_SLO_MS = 86_400_000.0  # --slo-*-ms: a day; a bound past it admits every request a run can serve
MAX_STAGE_LAYERS = 1000  # --layers, one stage's layers: whole models have some 30 to 130; only the shares count


def parse_tokens(text: str, what: str = "token count") -> int:
    """``4096``, ``128k`` (x1024) -> tokens: a whole number > 0."""
    clean = text.strip().lower()
    factor = 1024 if clean.endswith("k") else 1
    try:
        number = float(clean[:-1] if factor > 1 else clean) * factor
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0 and number.is_integer()):
        raise ValueError(f"{what} {text!r}: give a whole number > 0, optionally with k (e.g. 4096 or 128k)")
    return int(number)


def tokens_option(text: str) -> int:
    """argparse type of a token-count option: argparse names the option in the error."""
    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_number(
    value: float, option: str, low: float, high: float = math.inf, *, low_open: bool = False, why: str = ""
) -> None:
    """``value`` is finite and in [low, high] (``low_open``: (low, high]); else a ValueError naming ``option``,
    the interval and, with ``why``, the reason for it."""
    inside = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not inside:
        interval = f"{'(' if low_open else '['}{_bound(low)}, {'inf)' if high == math.inf else f'{_bound(high)}]'}"
        raise ValueError(f"{option} must be a finite number in {interval}, got {value}" + (f" ({why})" if why else ""))


def _bound(value: float) -> str:
    """A bound as given: a whole number in full (2097152, not 2.09715e+06), else ``g``."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else f"{value:g}"


def parse_counts(text: str, option: str) -> list[int]:
    """``2,4,8`` -> [2, 4, 8]: whole numbers >= 1."""
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"{option} {text!r}: give whole numbers >= 1, comma-separated (e.g. 2,4,8)")
    return counts


def parse_stages(text: str) -> list[int]:
    """``--stages``: stage counts in [1, MAX_STAGES]."""
    counts = parse_counts(text, "--stages")
    if max(counts) > MAX_STAGES:
        raise ValueError(
            f"--stages {text}: at most {MAX_STAGES} pipeline stages (a real pipeline has a few dozen at most;"
            f" past {MAX_STAGES} a stage holds one or two layers of any model)"
        )
    return counts


def parse_seeds(text: str, option: str) -> list[int]:
    """``0,1,2`` -> seeds: whole numbers >= 0."""
    try:
        seeds = [int(v) for v in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise ValueError(f"{option} {text!r}: give whole numbers >= 0, comma-separated (e.g. 0,1,2)")
    return seeds


def parse_layers(text: str, stages: str) -> tuple[int, ...]:
    """``--layers``: one count per stage of every ``--stages`` value, each in [1, MAX_STAGE_LAYERS]."""
    layers = tuple(parse_counts(text, "--layers"))
    if any(p != len(layers) for p in parse_stages(stages)):
        raise ValueError(f"--layers {text}: give one positive layer count per stage for --stages {stages}")
    why = "layers of one stage; only each stage's share of the layers counts"
    for count in layers:
        check_number(count, "--layers", 1, MAX_STAGE_LAYERS, why=why)
    return layers


def check_noise(sigma: float) -> None:
    """``--noise``: a relative sigma in [0, MAX_NOISE]."""
    why = "a relative sigma of log-normal stage-time noise; above 1 the noise, not the surface, decides every batch"
    check_number(sigma, "--noise", 0.0, MAX_NOISE, why=why)


def check_chunk(tokens: int, option: str) -> int:
    """A max_num_batched_tokens the twin's vLLM config accepts."""
    if not MAX_NUM_SEQS <= tokens <= TINY_MODEL_MAX_POSITIONS:
        raise ValueError(
            f"{option} {tokens}: a chunk budget must lie in [{MAX_NUM_SEQS}, {TINY_MODEL_MAX_POSITIONS}] tokens"
            f" (vLLM needs max_num_batched_tokens >= max_num_seqs, {MAX_NUM_SEQS} in the twin)"
        )
    return tokens


def parse_chunks(text: str, option: str) -> list[int]:
    """``4k,8192`` -> chunk budgets, each checked by ``check_chunk``."""
    chunks = [check_chunk(parse_tokens(v, f"{option} item"), option) for v in text.split(",") if v.strip()]
    if not chunks:
        raise ValueError(f"{option} {text!r}: give at least one chunk size")
    return chunks


def parse_smooth_factors(text: str, option: str) -> list[float]:
    """``0.5,1`` -> CPP smooth factors, each in (0, 1]."""
    try:
        factors = [float(v) for v in text.split(",")]
    except ValueError:
        factors = []
    if not factors or not all(0 < f <= 1 for f in factors):
        raise ValueError(f"{option} {text!r}: give numbers in (0, 1], comma-separated (e.g. 0.5,0.75,1)")
    return factors


def parse_loads(text: str, option: str = "--load") -> list[float]:
    """``0.5,0.8`` -> offered loads, each in [MIN_LOAD, MAX_LOAD]."""
    try:
        loads = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(
            f"{option} {text!r}: give numbers in [{MIN_LOAD:g}, {MAX_LOAD:g}], comma-separated (e.g. 0.5,0.8,0.95)"
        ) from None
    why = "a fraction of the pipeline's prefill capacity; at 0.01 requests already run alone, 100 is a burst"
    for load in loads:
        check_number(load, option, MIN_LOAD, MAX_LOAD, why=why)
    return loads


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="long:128k",
        help="comma-separated: long:<tokens> (one prompt, e.g. long:128k), mixed (Poisson traffic), or\n"
        "trace:PATH[@START[:COUNT]] (requests START.. of a Mooncake .jsonl or Azure .csv trace; COUNT: --requests)",
    )
    p.add_argument("--requests", type=int, default=24, help="mixed: number of requests; trace: default COUNT")
    p.add_argument(
        "--load", default="0.6", help="mixed, trace: offered prefill load(s), fraction of capacity (e.g. 0.5,0.8)"
    )
    p.add_argument("--prompt-range", default="4k-64k", help="mixed: prompt lengths, log-uniform (e.g. 4k-64k)")
    p.add_argument("--prefix-hit-share", type=float, default=0.25, help="mixed: share of prefix-cache hits")
    p.add_argument("--output-range", default="16-128", help="mixed: output tokens per request")
    p.add_argument("--output-cap", type=tokens_option, default=None, help="trace: at most this many output tokens")
    for name in ("ttft", "tpot"):
        bound = f"goodput: {name.upper()} bound, ms (default: from the surface)"
        p.add_argument(f"--slo-{name}-ms", type=float, help=bound)
    p.add_argument(
        "--slo-reference",
        type=tokens_option,
        default=REFERENCE_TOKENS,
        help="goodput: reference prompt of the default bounds, tokens (docs/cpp-twin.md)",
    )


def validate_workload_args(args: argparse.Namespace) -> None:
    parse_loads(args.load)
    check_number(args.prefix_hit_share, "--prefix-hit-share", 0.0, 1.0)
    if not 1 <= args.requests <= MAX_REQUESTS:
        raise ValueError(f"--requests must be in [1, {MAX_REQUESTS}], got {args.requests} ({REQUESTS_WHY})")
    for value, option in ((args.slo_ttft_ms, "--slo-ttft-ms"), (args.slo_tpot_ms, "--slo-tpot-ms")):
        if value is not None:
            check_number(value, option, 0.0, MAX_SLO_MS, low_open=True, why="ms; a day at most")
    longest = f"tokens; the twin's model takes requests of at most {LONGEST_REQUEST_TOKENS} (prompt + output)"
    if args.output_cap is not None:
        check_number(args.output_cap, "--output-cap", 1, LONGEST_REQUEST_TOKENS, why=longest)
    check_number(args.slo_reference, "--slo-reference", 1, LONGEST_REQUEST_TOKENS, why=longest)


def slo_for(args: argparse.Namespace, surface: Surface, num_stages: int) -> Slo:
    """The goodput bounds of a case at ``num_stages``: the flags', else the surface's defaults."""
    return default_slo(surface, num_stages, args.slo_reference, args.slo_ttft_ms, args.slo_tpot_ms)


def _range(text: str, what: str) -> tuple[int, int]:
    try:
        low, high = (parse_tokens(v) for v in text.split("-"))
    except ValueError:
        raise ValueError(f"--{what} expects LOW-HIGH, whole numbers > 0 (e.g. 4k-64k), got {text!r}") from None
    if low > high:
        raise ValueError(f"--{what} {text!r}: LOW must not exceed HIGH")
    return low, high


def _mixed(args: argparse.Namespace, surface_spec: str, num_stages: int, load: float) -> Workload:
    low, high = _range(args.prompt_range, "prompt-range")
    out_low, out_high = _range(args.output_range, "output-range")
    return mixed(
        load_surface(surface_spec),
        num_stages,
        seed=args.seed,
        num_requests=args.requests,
        load=load,
        min_prompt_tokens=low,
        max_prompt_tokens=high,
        prefix_hit_share=args.prefix_hit_share,
        min_output_tokens=out_low,
        max_output_tokens=out_high,
        reference_chunk_tokens=args.chunk,
    )


def build_workloads(args: argparse.Namespace, surface_spec: str, num_stages: int) -> list[Workload]:
    """The ``--workload`` items in order, each ``mixed``/``trace`` item once per ``--load``."""
    loads = parse_loads(args.load)
    out = []
    for item in args.workload.split(","):
        item = item.strip()
        if item.startswith("long:"):
            made = [long_prompt(parse_tokens(item.split(":", 1)[1], f"--workload {item!r}: token count"))]
        elif item == "mixed":
            made = [_mixed(args, surface_spec, num_stages, load) for load in loads]
            if len(loads) > 1:  # one name per load; a single load keeps the plain name
                named = zip(made, loads, strict=True)
                made = [dataclasses.replace(w, name=f"{w.name}-load{load:g}") for w, load in named]
        elif item.startswith("trace:"):
            trace = parse_trace_item(item.split(":", 1)[1], args.requests, MAX_REQUESTS)
            surface = load_surface(surface_spec)
            made = [
                trace_workload(
                    surface,
                    num_stages,
                    trace,
                    load,
                    reference_chunk_tokens=args.chunk,
                    cache_block_tokens=BLOCK_TOKENS,
                    max_request_tokens=LONGEST_REQUEST_TOKENS,
                    output_cap=args.output_cap,
                )
                for load in loads
            ]
        else:
            raise ValueError(
                f"--workload item {item!r}: use long:<tokens> (e.g. long:128k), mixed, or trace:PATH[@START[:COUNT]]"
            )
        for workload in made:
            if workload.max_request_tokens > LONGEST_REQUEST_TOKENS:
                source = "--prompt-range/--output-range" if item == "mixed" else f"--workload {item}"
                raise ValueError(
                    f"{source}: a request of {workload.max_request_tokens} tokens (prompt + output) is longer than"
                    f" the twin's model takes ({LONGEST_REQUEST_TOKENS})"
                )
            if workload.total_tokens > MAX_WORKLOAD_TOKENS:
                source, fewer = (
                    ("--requests/--prompt-range", "fewer --requests or a shorter --prompt-range")
                    if item == "mixed"
                    else (f"--workload {item}", "a shorter slice (COUNT)")
                )
                raise ValueError(
                    f"{source}: {len(workload.requests)} requests of {workload.total_tokens} tokens in all (prompt +"
                    f" output); a run holds at most {MAX_WORKLOAD_TOKENS} (each worker keeps every prompt's token"
                    f" ids): give {fewer}"
                )
        out += made
    return out
