"""Start-up profile for dynamic chunked pipeline parallelism: cached, or measured once.

``initialise_profile`` gives the scheduler a latency model (core/cpp_latency_model.py),
or, when the data cannot give one, the fixed chunk to run instead:

1. A cached profile whose fingerprint matches (core/cpp_profile_store.py), measured as a
   fresh one is (chunks from 1 token to the base chunk, histories from none to at least
   half of what this engine will use: the model continues beyond what was measured) and
   holding no more than a fresh one makes (``fresh_profile_size``), is adopted when its
   samples pass the same judgement as a fresh profile (core/cpp_acceptance.py).
2. Otherwise the workers run real forward passes: ``WARMUP_RUNS`` runs first (dropped),
   then a grid of chunk sizes by history lengths (``profile_plan``), in rounds: each
   round ``profile_repeats`` passes over every point, so a host whose speed drifts
   spreads the drift over every point instead of a few measured during a slow spell.
   If the judgement says the profile is too noisy to decide well, one more round is
   measured and the judgement repeated on all of them: a noisy host pays a longer
   start-up, a quiet one nothing. Where a time falls beyond the noise as the chunk or the
   history grows and its runs disagree, only those points are measured again
   (``Verdict.remeasure``, core/cpp_falls.py), and a fall that repeats is kept. A few INFO lines
   tell how far it got and what is left (``Progress``); the verdict, how long it took.
3. Each sample is the slowest worker's time (a run where any worker's answer is not a
   measurement is dropped: ``measure_with_executor``). Under pipeline parallelism every
   stage runs its own layers on dummy inputs and times only its own compute; the slowest
   stage sets the pipeline's pace, so that is what a chunk costs the pipeline. Timed
   steps report the same quantity (worker/cpp_timing.py).
4. An accepted profile is saved for the next start.

The grid, where the decisions are made: chunk sizes of the 1-1.5-2 ladder (1, 32, 64,
96, 128, 192, 256, ... up to the base chunk, ``max_num_batched_tokens``), so a device's
bends, knees and tile steps between 32 tokens and the base chunk are measured at sizes
that sit on tile boundaries, and C = 1 measures what a decode costs; every size at
every history length it fits (0 and ``profile_history_points`` lengths evenly up to the
deepest history the scheduler will see), so the efficient chunk and the chunk for a time are
read from measurements, at small chunks too; and a tile probe, pairs of sizes S and
S + 1 without history at the first boundary of each candidate tile (64 to 512 tokens),
``PROBE_REPEATS`` times each a pass, which tells whether time steps at tile boundaries
(core/cpp_acceptance.py; the plan is core/cpp_profile_plan.py). For the default base
chunk of 8192: 17 sizes x 5 lengths, less two at the deepest, + 20 probe runs (each S is on
the ladder), 2 passes: 206 runs after 2 warm-up runs. After the rounds, a sixteenth of a
round's runs more at most (``after_rounds_budget``; 12 at the defaults: at most 218 in all):
up to ``LOCATE_RUNS`` measure falls again and, where the grid shows time jumping between
two sizes (a step), bisect the segment to place the jump (``locate_runs``); what is left
measures how far odd points reach in history, once each (core/cpp_odd_reach.py).

Any exception (a worker failing, a timeout) ends in one warning naming the cause and
fixed chunking for the rest of the run; serving goes on.

Executor interface (also what the pipeline twin simulator implements):
``model_executor.collective_rpc("profile_prefill_latency", args=(chunk_tokens,
history_tokens))`` returns one latency in ms per worker (a list), or a single number.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from time import monotonic
from typing import Any

from vllm_ascend.core.cpp_acceptance import LOCATE_TOKENS, Verdict, flat_side, judge, untried_tile
from vllm_ascend.core.cpp_chunk_rule import ChunkLimits
from vllm_ascend.core.cpp_latency_model import LatencyModel
from vllm_ascend.core.cpp_odd_reach import reach_runs
from vllm_ascend.core.cpp_profile_plan import (  # noqa: F401 - the plan's names, as before
    PROBE_REPEATS,
    SMALLEST_LADDER_CHUNK,
    chunk_ladder,
    history_levels,
    profile_plan,
    tile_probe,
)
from vllm_ascend.core.cpp_profile_store import ProfileCacheError, cache_file, check_cached, load_profile, save_profile
from vllm_ascend.core.cpp_samples import SampleError, admitted, check_latency
from vllm_ascend.log_adapter import get_logger

logger = get_logger(__name__)

PROFILE_RPC = "profile_prefill_latency"
WARMUP_RUNS = 2
PROFILE_RPC_TIMEOUT_S = 300.0
EXTRA_ROUNDS = 1  # rounds of the same runs added when the profile is too noisy to decide well
LOCATE_RUNS = 8  # runs at most after the rounds measuring falls again and placing steps' jumps
AFTER_ROUNDS_SHARE = 16  # all runs after the rounds: at most this share of a round's (or LOCATE_RUNS)
LOCATE_UNSURE = 2.0  # a size within this many scatters of a jump's middle is measured once more
PROGRESS_SHARE = 0.1  # a progress line at most every tenth of the planned runs ...
PROGRESS_EVERY_S = 10.0  # ... and at most one every 10 s: a profile of a few seconds logs none

MeasureFn = Callable[[int, int], float]


def measure_with_executor(model_executor: Any, timeout_s: float = PROFILE_RPC_TIMEOUT_S) -> MeasureFn:
    """A ``measure(chunk_tokens, history_tokens) -> ms`` that asks every worker and keeps the slowest.

    Every worker's answer is checked as it came (core/cpp_samples.py ``check_latency``: an int
    or a float, never a bool, a string or None, within a microsecond to hours) before anything
    converts it. A run where any worker's answer is not a measurement is not one either,
    whichever worker it is: it gives NaN, which the judgement drops and counts (the first
    such answer is logged once). Otherwise the run's time is the slowest worker's.
    """
    kwargs: dict = {}
    try:
        if "timeout" in inspect.signature(model_executor.collective_rpc).parameters:
            kwargs["timeout"] = timeout_s
    except (TypeError, ValueError):
        pass

    logged: list = []

    def measure(chunk_tokens: int, history_tokens: int) -> float:
        result = model_executor.collective_rpc(PROFILE_RPC, args=(int(chunk_tokens), int(history_tokens)), **kwargs)
        values = result if isinstance(result, list | tuple) else [result]
        if not values:
            raise RuntimeError(f"{PROFILE_RPC} returned no latency ({result!r})")
        try:
            return max(check_latency(value) for value in values)
        except SampleError as error:
            if not logged:
                logged.append(error)
                logger.info("[CPP] a profiling run whose workers answered %.80r is dropped: %s", result, error)
            return math.nan

    return measure


def locate_runs(measure: MeasureFn, model: LatencyModel, repeats: int, budget: int = LOCATE_RUNS) -> list:
    """Runs that place each step's jump (``model.steps``, lowest first): a bisection of its segment.

    A step right after a size smaller than the tile probe tries (96 tokens) may be that
    size's tile: one token past it and past twice it are measured ``PROBE_REPEATS`` times
    each, and the judgement takes it as the granule when time jumps at both.

    Between a step's two profiled sizes the jump may lie anywhere (a wave of tiles over 20
    cores every 2560 tokens falls between 2048 and 3072): each run without history at the
    middle of what is left tells on which side of it the jump is (``flat_side``, the rule
    ``locate_steps`` applies to the samples), measured again, up to ``repeats`` times, when
    it is within ``LOCATE_UNSURE`` scatters of the jump's middle. At most ``budget`` runs
    in all, to within ``LOCATE_TOKENS`` tokens; a jump left unplaced stays after the
    lower size (the conservative reading). A wave placed inside its segment recurs at its
    multiples (the same tiles over the same cores); where one falls between profiled sizes,
    a run at it and one ``LOCATE_TOKENS`` past it tell whether time jumps there, which the
    grid cannot tell from growth where the segments beside it hold jumps too.
    """
    samples: list = []
    nodes, row = model.chunk_tokens, model.step_ms[0]
    unsure = math.log1p(LOCATE_UNSURE * model.scatter)
    period = 0
    for i in model.steps:  # a step right after a size smaller than the probe tries may be its tile
        tile = nodes[i]
        if untried_tile(tile) and 2 * tile in nodes and len(samples) + 2 * PROBE_REPEATS <= budget:
            samples += [(c, 0, measure(c, 0)) for c in (tile + 1, 2 * tile + 1) * PROBE_REPEATS]
    for i in model.steps:
        flat, past = nodes[i], nodes[i + 1]
        middle_ms = math.sqrt(row[i] * row[i + 1])
        while past - flat > LOCATE_TOKENS and len(samples) < budget:
            size = flat + (past - flat) // 2 // LOCATE_TOKENS * LOCATE_TOKENS
            if size <= flat:
                break
            times = [measure(size, 0)]
            while abs(math.log(statistics.median(times) / middle_ms)) < unsure and len(times) < repeats:
                if len(samples) + len(times) >= budget:
                    break
                times.append(measure(size, 0))
            samples += [(size, 0, ms) for ms in times]
            if flat_side(row[i], row[i + 1], statistics.median(times)):
                flat = size
            else:
                past = size
        period = period or (flat if flat > nodes[i] else 0)
    bisected = [(nodes[i], nodes[i + 1]) for i in model.steps]
    for size in range(2 * period, nodes[-1] - LOCATE_TOKENS, period) if period else range(0):
        if len(samples) + 2 > budget:
            break
        if not {size, size + LOCATE_TOKENS} & set(nodes) and not any(a < size < b for a, b in bisected):
            samples += [(c, 0, measure(c, 0)) for c in (size, size + LOCATE_TOKENS)]
    return samples


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds) // 60} min {int(seconds) % 60} s"


class Progress:
    """The start-up profile at INFO while it runs: runs done of planned, the time so far and what is
    left at the pace so far; at most one line every ``PROGRESS_SHARE`` of the planned runs and every
    ``PROGRESS_EVERY_S`` seconds, so a profile of minutes logs a few lines, never one a run."""

    def __init__(self, planned: int) -> None:
        self.planned, self.done, self.started, self.last_line = 0, 0, monotonic(), monotonic()
        self.paced_from: float | None = None  # the first counted run's start: warm-up is not the pace
        self.plan(planned)

    def plan(self, runs: int) -> None:
        """``runs`` more planned (a second round); the next line a share of all of them from here."""
        self.planned += runs
        self.next_line = self.done + math.ceil(PROGRESS_SHARE * self.planned)

    def elapsed(self) -> str:
        return _duration(monotonic() - self.started)

    def counted(self, measure: MeasureFn) -> MeasureFn:
        def run(chunk_tokens: int, history_tokens: int) -> float:
            if self.paced_from is None:
                self.paced_from = monotonic()
            latency_ms = measure(chunk_tokens, history_tokens)
            self.done += 1
            now = monotonic()
            if self.next_line <= self.done < self.planned and now - self.last_line >= PROGRESS_EVERY_S:
                self.plan(0)
                self.last_line = now
                left = (now - self.paced_from) / self.done * (self.planned - self.done)
                logger.info(
                    "[CPP] start-up profile: %d of %d runs done in %s, about %s left at this pace",
                    self.done, self.planned, _duration(now - self.started), _duration(left),
                )  # fmt: skip
            return latency_ms

        return run


@dataclass(frozen=True)
class StartUp:
    """What start-up gives the scheduler: a verdict, the samples behind it and where they came from."""

    verdict: Verdict
    samples: list
    source: str | None


def _no_model(reason: str) -> StartUp:
    return StartUp(Verdict(None, None, False, reason), [], None)


def after_rounds_budget(plan: Sequence[tuple[int, int]]) -> int:
    """Runs at most after the rounds (falls measured again, steps placed, odd points' reach): a sixteenth
    of a round's, at least ``LOCATE_RUNS``. A reach run is read against its levels' line, which the rounds
    measured with every repeat: one run each (half the repeats, at the defaults) places the odd point's
    end as well as two did on every stress surface's gate, and the default profile stays within 218 runs."""
    return max(LOCATE_RUNS, len(plan) // AFTER_ROUNDS_SHARE)


def fresh_profile_size(plan: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The most samples a fresh profile of ``plan`` makes, and the most runs of any one point: every round
    (the plan and ``EXTRA_ROUNDS`` more) and every run placing steps (a cached one may hold no more)."""
    rounds = 1 + EXTRA_ROUNDS
    most = len(plan) * rounds + after_rounds_budget(plan)
    return most, max(Counter(plan).values(), default=0) * rounds + LOCATE_RUNS


def initialise_profile(
    config: Any,
    limits: ChunkLimits,
    num_stages: int,
    *,
    fingerprint: dict,
    measure: MeasureFn | None,
    max_history_tokens: int,
) -> StartUp:
    """The verdict for this engine: a cached profile that passes ``judge``, or a fresh one (see the module doc).

    ``config`` is the CppConfig; ``limits`` and ``num_stages`` are what the profile is judged for.
    """
    base_chunk_tokens = limits.cap_tokens
    plan = profile_plan(
        base_chunk_tokens=base_chunk_tokens,
        points=config.profile_points,
        repeats=config.profile_repeats,
        history_points=config.profile_history_points,
        max_history_tokens=max_history_tokens,
    )
    path = cache_file(config.cache_path, fingerprint) if config.cache_path else None
    if path is not None:
        try:
            cached = load_profile(path, fingerprint=fingerprint, base_chunk_tokens=base_chunk_tokens)
            if cached is not None:
                check_cached(cached, base_chunk_tokens, max_history_tokens, *fresh_profile_size(plan))
                verdict = judge(cached, limits, num_stages, max_history_tokens=max_history_tokens, last_round=True)
                if verdict.model is None:
                    raise ProfileCacheError(verdict.reason)
                return StartUp(verdict, cached, f"cache {path}")
        except ProfileCacheError as error:
            logger.warning("[CPP] ignoring cached profile %s (%s); profiling again", path, error)
    if measure is None:
        return _no_model("no model executor to profile with")
    samples: list = []
    progress = Progress(len(plan))
    logger.info(
        "[CPP] start-up profile: %d runs over %d points after %d warm-up runs (%d more if too noisy to decide, "
        "up to %d to measure falls again, place steps and odd points' reach)", len(plan), len(set(plan)),
        WARMUP_RUNS, len(plan) * EXTRA_ROUNDS, after_rounds_budget(plan),
    )  # fmt: skip
    counted = progress.counted(measure)
    budget = LOCATE_RUNS
    for attempt in range(1 + EXTRA_ROUNDS):
        last_round = attempt == EXTRA_ROUNDS
        try:
            for _ in range(WARMUP_RUNS if attempt == 0 else 0):
                measure(base_chunk_tokens, 0)
            samples += [(chunk, history, counted(chunk, history)) for chunk, history in plan]
            verdict = judge(
                samples, limits, num_stages, max_history_tokens=max_history_tokens, last_round=last_round,
                remeasure_budget=budget,
            )  # fmt: skip
            if not verdict.noisy and verdict.model is not None and verdict.remeasure:
                budget -= len(verdict.remeasure)
                verdict = _remeasured(verdict, samples, counted, limits, num_stages, max_history_tokens, last_round)
        except Exception as error:  # a worker failed or timed out: degrade, never take the server down
            failed = f"{type(error).__name__}: {error}; {progress.done} runs in {progress.elapsed()}"
            return _no_model(f"start-up profiling failed ({failed})")
        if not verdict.noisy:
            break
        progress.plan(len(plan))
        logger.info(
            "[CPP] start-up profile: a second round, the same %d runs once more (%d of %d done in %s), because %s",
            len(plan), progress.done, progress.planned, progress.elapsed(), verdict.reason,
        )  # fmt: skip
    try:
        located = locate_runs(counted, verdict.model, config.profile_repeats, budget) if verdict.model else []
        left = after_rounds_budget(plan) - (LOCATE_RUNS - budget) - len(located)  # (what falls and steps took)
        repeats = max(1, config.profile_repeats // 2)
        reach = reach_runs(verdict.model, repeats, left) if verdict.model else []
        located += [(chunk, history, counted(chunk, history)) for chunk, history in reach]
    except Exception as error:  # as above
        return _no_model(f"start-up profiling failed ({type(error).__name__}: {error})")
    if located:
        samples += located
        verdict = judge(samples, limits, num_stages, max_history_tokens=max_history_tokens, last_round=True)
    took = f"{len(samples)} runs after {WARMUP_RUNS} warm-up in {progress.elapsed()}"
    source = f"profiled ({took})"
    if verdict.model is None:  # (its line names the reason only)
        verdict = replace(verdict, reason=f"{verdict.reason}; profiled: {took}")
    if verdict.model is not None and path is not None:
        try:
            kept, _ = admitted(samples)  # (a run that was not a measurement would make the file unreadable)
            save_profile(path, fingerprint=fingerprint, base_chunk_tokens=base_chunk_tokens, samples=kept)
            source += f", saved to {path}"
        except (OSError, ValueError) as error:
            logger.warning(
                "[CPP] could not save the profile to %s: %s; the next start profiles again (set "
                'profiling_chunk_config.cache_dir to a folder the server can write, or "" to keep none)', path, error,
            )  # fmt: skip
    return StartUp(verdict, samples, source)


def _remeasured(
    verdict: Verdict, samples: list, measure: MeasureFn, limits: ChunkLimits, num_stages: int, max_history: int,
    last_round: bool,
) -> Verdict:  # fmt: skip
    """The verdict once the points of the falls it doubts are measured again (added to ``samples``). A fall
    that then does not repeat was noise on this host: before the last round, the profile is too noisy to
    decide on (the runs around it may be off too, unseen)."""
    asked = verdict.remeasure
    logger.info(
        "[CPP] start-up profile: %d point(s) where time fell as the chunk or history grew, measured again",
        len(set(asked)),
    )
    samples += [(chunk, history, measure(chunk, history)) for chunk, history in asked]
    again = judge(samples, limits, num_stages, max_history_tokens=max_history, last_round=last_round)
    noise = again.model is not None and not set(asked) <= set(again.model.odd_points)
    if noise and not last_round and not again.noisy:
        again = replace(again, noisy=True, reason=f"a fall beyond the noise did not repeat ({again.reason})")
    return again


def wrap_engine_core_init(engine_core_cls: type) -> bool:
    """Make ``engine_core_cls.__init__`` start CPP once the workers are up; False if already done.

    After the original ``__init__`` the model executor is ready; a scheduler that has
    ``run_profiling_chunk_init`` (ProfilingChunkScheduler) then gets its profile.
    """
    original_init = engine_core_cls.__init__
    if getattr(original_init, "_cpp_wrapped", False):
        return False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        start = getattr(self.scheduler, "run_profiling_chunk_init", None)
        if start is not None:
            start(self.model_executor)

    __init__._cpp_wrapped = True  # type: ignore[attr-defined]
    engine_core_cls.__init__ = __init__
    return True
