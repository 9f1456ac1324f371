"""The traffic CPP plans for: what is measured of it, and the fixed chunk a user would tune for it.

- ``Traffic`` keeps the latest arrival times and the sizes of the latest prefills, each
  bounded, O(1) per request; ``Traffic.load()`` makes a ``Load`` of them: the arrival
  rate over the latest ``TRAFFIC_WINDOW`` arrivals, its relative standard error, the
  steady rate over ``STEADY_WINDOWS`` times as many, and those sizes as the sample of
  what arrives.
- ``queue_wait_ms``: the mean wait of arrivals queueing for the pipeline as at one server.
- ``tuned_fixed_chunk``: of the profiled sizes, the fixed chunk whose predicted mean TTFT
  under a load is least (the chunk a user would tune by hand), or with a slack the smallest
  chunk within that share of the least down the least's own basin;
  ``chunk_for_decodes``: between those two, the chunk that gives the decodes (``decode_pace``)
  a larger share than it takes of TTFT (the planner asks at the steady rate), and
  ``fixed_chunk_batch_ms``: the mean batch that chunk makes of the prefills held. The
  planner bounds the batch time by it while requests decode.

Prompts are integrated over their length with Simpson's rule (``PROMPT_NODES``,
``PROMPT_WEIGHTS``), here and in the planner. Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from vllm_ascend.core.cpp_chunk_rule import ChunkRule
from vllm_ascend.core.cpp_latency_model import LatencyModel

__all__ = [
    "MIN_ARRIVALS",
    "MIN_ROOM",
    "NO_LOAD",
    "PACE_GRID",
    "PROMPT_NODES",
    "PROMPT_WEIGHTS",
    "STEADY_WINDOWS",
    "TRAFFIC_WINDOW",
    "Load",
    "Traffic",
    "chunk_for_decodes",
    "decode_pace",
    "fixed_chunk_batch_ms",
    "fixed_chunk_ttft_ms",
    "prompt_work_ms",
    "queue_wait_ms",
    "tuned_fixed_chunk",
]

TRAFFIC_WINDOW = 16  # arrivals and prefill sizes the traffic is estimated from
STEADY_WINDOWS = 8  # the steady rate is measured over this many windows of arrivals
MIN_ARRIVALS = 4  # fewer arrivals give no rate
MIN_ROOM = 0.05  # the queue's wait is never taken closer to saturation than this
PROMPT_PANELS = 6  # Simpson panels per prefill
PROMPT_NODES = np.linspace(0.0, 1.0, 2 * PROMPT_PANELS + 1)  # Simpson nodes over a prefill's remaining tokens
PROMPT_WEIGHTS = np.array([1.0] + [4.0, 2.0] * (PROMPT_PANELS - 1) + [4.0, 1.0]) / (6.0 * PROMPT_PANELS)
PACE_GRID = 9  # rule 4's chunk: sizes weighed between the slack's chunk and the least's (besides profiled ones)


@dataclass(frozen=True)
class Load:
    """The traffic the plan expects: arrivals per ms, that rate's relative standard error, and
    (history, tokens) of the latest prefills as the sample of what arrives."""

    arrivals_per_ms: float = 0.0
    rate_error: float = 1.0
    jobs: tuple[tuple[int, int], ...] = ()
    steady_per_ms: float | None = None  # the rate over the latest STEADY_WINDOWS windows, and its error
    steady_error: float = 1.0

    def steady(self) -> Load:
        """The same traffic at its steady rate (over many more arrivals): what a user tunes a fixed chunk for."""
        if self.steady_per_ms is None:
            return self
        return Load(self.steady_per_ms, self.steady_error, self.jobs)


NO_LOAD = Load()


class Traffic:
    """The latest arrivals and the sizes of the latest prefills, each bounded; O(1) per request."""

    def __init__(self, window: int = TRAFFIC_WINDOW) -> None:
        self._arrivals: deque[float] = deque(maxlen=window * STEADY_WINDOWS)  # arrival times (s)
        self._jobs: OrderedDict[str, tuple[int, int]] = OrderedDict()  # request -> (history, tokens) when first held
        self._window = window

    def arrived(self, arrival_s: float) -> None:
        self._arrivals.append(float(arrival_s))

    def held(self, request_id: str, history_tokens: int, remaining_tokens: int) -> None:
        """A prefill held for a plan: its size counts once, as first seen (prefix-cache hits excluded)."""
        if request_id in self._jobs:
            return
        self._jobs[request_id] = (int(history_tokens), int(remaining_tokens))
        if len(self._jobs) > self._window:
            self._jobs.popitem(last=False)

    def load(self) -> Load:
        """The arrival rate over the latest ``window`` arrivals (none while too few to tell), its
        relative standard error (one over the square root of the gaps it is measured over), the
        latest prefills' sizes, oldest first, and the steady rate: the same over the latest
        ``STEADY_WINDOWS`` windows of arrivals."""
        jobs = tuple(job for job in self._jobs.values() if job[1] > 0)
        arrivals = sorted(self._arrivals)
        steady, steady_error = _rate(arrivals)
        latest, error = _rate(arrivals[-self._window :])
        if steady is None or latest is None:
            return Load(jobs=jobs)
        return Load(latest, error, jobs, steady, steady_error)


def _rate(arrivals: list[float]) -> tuple[float | None, float]:
    """Arrivals per ms over sorted arrival times (s), and its relative error; None while too few to tell."""
    if len(arrivals) < MIN_ARRIVALS or arrivals[-1] <= arrivals[0]:
        return None, 1.0
    gaps = len(arrivals) - 1
    return gaps / ((arrivals[-1] - arrivals[0]) * 1000.0), 1.0 / math.sqrt(gaps)


def prompt_work_ms(
    model: LatencyModel, starts: np.ndarray, histories: np.ndarray, chunk: np.ndarray, tokens: np.ndarray
) -> np.ndarray:
    """A prompt's own time (ms) with ``chunk`` the chunk covering each of its Simpson nodes
    (``histories``, from ``starts``, over ``tokens``): the time per token of the chunk covering
    position H, which starts at about H - C/2 (not before the prompt's start), integrated
    over the prompt. Arrays broadcast; the node axis is the last."""
    covering = np.maximum(starts, histories - chunk / 2)
    return (model.request_ms_many(chunk, covering) / chunk @ PROMPT_WEIGHTS) * tokens


def queue_wait_ms(load: Load, service_ms: np.ndarray) -> np.ndarray:
    """The mean wait of arrivals queueing for jobs of ``service_ms`` (rows: candidates; columns: a
    sample of jobs) at one server (Pollaczek-Khinchine: ``rate E[S^2] / (2 (1 - rate E[S]))``).

    The rate is known only to within its relative error, so the room below saturation is
    never taken as less than that error (nor than ``MIN_ROOM``): a few bursty arrivals do
    not make a queue the model would amplify without bound, and past saturation the wait
    stays finite and still grows with the work the jobs take, so the candidate closest to
    keeping up wins."""
    rate = load.arrivals_per_ms
    mean_ms, square_ms = service_ms.mean(axis=-1), (service_ms**2).mean(axis=-1)
    room = np.maximum(1.0 - rate * mean_ms, max(load.rate_error, MIN_ROOM))
    return rate * square_ms / (2.0 * room)


def tuned_fixed_chunk(rule: ChunkRule, load: Load, fixed_ms: float, pending: int = 1, slack: float = 0.0) -> float:
    """The fixed chunk a user would tune by hand for this traffic: the profiled size of the least
    predicted mean TTFT; with ``slack``, the smallest chunk, walking down from the least, whose
    predicted mean TTFT is within that share of it, where the curve through the profiled sizes
    crosses that bound (linear in the log of the size between the last size above it and the
    first within it, rounded up to whole tokens, tiles, or the end of the model's step it falls
    in, as far as that first size).
    A curve flat near its least crosses the bound at a small angle: taking the first ladder size
    within it would turn a change of a percent in the model into a chunk half as large again,
    and the batches decodes wait for with it. The smaller sizes are those of the least's own
    basin, as a user walks down from the best size until the TTFT passes the bound: a basin
    beyond a hump is another regime, not the flat bottom, and its prediction is no sharper (on
    a measured surface 256 tokens were predicted 3% over the least at 768, 512 21% over it;
    the replay measured 5% and 44%). A curve with no finite least is an error.

    ``load``'s jobs are the sample of what arrives. For each profiled size from the floor
    to the cap, a job chunked at that size takes its own time plus a batch's fixed cost per
    chunk's worth of its tokens (a fixed chunk packs short prompts into one batch), and its
    first token comes P - 1 of its last batches later (the drain). The engine keeps at most
    P batches in flight, so where the batches shorten at a job's end the next job's batches
    restart behind its last one and pay their own rise to their deepest batch again: in a
    busy pipeline a job holds it for its time plus P - 1 times the rise from a job's first
    batch to its last. Arrivals queue for that (``queue_wait_ms``); of the ``pending``
    prefills there now, one waits for half the others on average. The more load, the more
    a chunk's tokens per millisecond count against the fill and drain it costs, and the
    more a large chunk's rise at depth, paid once per job, counts against it.
    """
    return _tuned_range(rule, load, fixed_ms, pending, slack)[0]


def chunk_for_decodes(rule: ChunkRule, load: Load, fixed_ms: float, pending: int, slack: float) -> float:
    """Rule 4's chunk while requests decode: of the chunks from ``tuned_fixed_chunk`` with ``slack``
    up to the least predicted mean TTFT's, the one of the least product of the predicted mean TTFT
    and the decodes' pace (``decode_pace``).

    A smaller chunk shortens the batches decodes wait for and lengthens the prompts' TTFT; it is
    taken only where it shortens a decode's time per token by a larger share than it lengthens
    TTFT. Where a batch's fixed cost dominates it (a chunk's tokens add little to a step) or
    prefills take little of the time, the decodes gain little and the chunk stays near the least;
    where a chunk's tokens are most of a batch on a busy pipeline, it goes down to the slack.
    Until the arrival rate is measured the decodes count as beside prefills throughout (the held
    ones), so the chunk moves up once it is, where prefills turn out to take little of the time.
    The candidates are the profiled sizes between, and sizes between them on a geometric grid
    (whole tiles, a model step's end), so a small change in the model moves the chunk a little.
    """
    lowest, least = _tuned_range(rule, load, fixed_ms, pending, slack)
    if lowest >= least:
        return lowest
    between = [c for c in rule.model.chunk_tokens if lowest < c < least]
    grid = {lowest, least, *between}
    for tokens in np.geomspace(lowest, least, PACE_GRID)[1:-1]:
        above = min([c for c in (*between, least) if c >= tokens])
        grid.add(max(lowest, _whole(rule, tokens, above)))
    sizes = np.array(sorted(grid), dtype=np.float64)
    _check_pace(load, fixed_ms, sizes)
    times = _job_times(rule, load, fixed_ms, sizes)  # one pass over the jobs for both factors
    cost = _ttft_ms(rule, load, pending, times) * _pace(rule, load, fixed_ms, sizes, times[0])
    return float(sizes[int(np.argmin(cost))])


def decode_pace(rule: ChunkRule, load: Load, fixed_ms: float, sizes: np.ndarray) -> np.ndarray:
    """The decodes' mean time per token under a fixed chunk of each of ``sizes``, over their time in
    batches of decodes alone (``fixed_ms``).

    A decode's tokens are short against a long prompt's prefill, so most decodes fall beside
    prefills or beside none: a share ``u`` of them (the share of time the pipeline spends on
    prefills, the arrival rate times a job's time at that chunk, at most 1) waits for the mean
    batch the chunk makes of the load's jobs (``fixed_chunk_batch_ms``), the rest for ``fixed_ms``;
    the mean over requests is 1 + u (B / fixed_ms - 1). While the rate is unknown, ``u`` is 1:
    the decodes in flight see the prefills held now in every step.
    """
    _check_pace(load, fixed_ms, sizes)
    return _pace(rule, load, fixed_ms, sizes, _job_times(rule, load, fixed_ms, sizes)[0])


def _check_pace(load: Load, fixed_ms: float, sizes: np.ndarray) -> None:
    if fixed_ms <= 0 or not load.jobs or min(n for _, n in load.jobs) <= 0 or np.min(sizes) <= 0:
        raise ValueError(f"a decode pace needs fixed_ms > 0, jobs of > 0 tokens and sizes > 0: {fixed_ms}, {load.jobs}")


def _pace(rule: ChunkRule, load: Load, fixed_ms: float, sizes: np.ndarray, job_ms: np.ndarray) -> np.ndarray:
    """``decode_pace`` from the jobs' times at each size (``_job_times``)."""
    work_ms = job_ms.mean(axis=1)
    busy = np.minimum(1.0, load.arrivals_per_ms * work_ms) if load.arrivals_per_ms > 0 else np.ones_like(work_ms)
    batch_ms = _batch_ms_many(rule, load.jobs, np.asarray(sizes, dtype=np.float64), fixed_ms)
    return 1.0 + busy * (batch_ms / fixed_ms - 1.0)


def _tuned_range(rule: ChunkRule, load: Load, fixed_ms: float, pending: int, slack: float) -> tuple[float, float]:
    """``tuned_fixed_chunk`` with ``slack``, and the profiled size of the least predicted mean TTFT."""
    model, limits = rule.model, rule.limits
    sizes = np.array(
        [c for c in model.chunk_tokens if limits.floor_tokens <= c <= limits.cap_tokens] or [limits.cap_tokens],
        dtype=np.float64,
    )
    ttft_ms = fixed_chunk_ttft_ms(rule, load, fixed_ms, pending, sizes)
    least = int(np.argmin(ttft_ms))
    bound = float(ttft_ms[least]) * (1.0 + max(0.0, slack))
    if not math.isfinite(bound):
        raise ValueError(f"the predicted mean TTFT of a fixed chunk is not finite: {ttft_ms.tolist()}")
    first = least
    while first > 0 and ttft_ms[first - 1] <= bound:  # down the least's own basin, never across a hump
        first -= 1
    if first == 0 or slack <= 0.0 or not math.isfinite(ttft_ms[first - 1]):
        return float(sizes[first]), float(sizes[least])
    above, within = float(ttft_ms[first - 1]), float(ttft_ms[first])
    share = (above - bound) / (above - within)  # in (0, 1]: above > bound >= within
    crossing = math.ceil(sizes[first - 1] * (sizes[first] / sizes[first - 1]) ** share - 1e-9)
    return float(max(sizes[first - 1], _whole(rule, crossing, float(sizes[first])))), float(sizes[least])


def _whole(rule: ChunkRule, tokens: float, above: float) -> float:
    """``tokens`` rounded up to whole tiles, or to the end of the model's step it falls in, at most ``above``
    (the next profiled size): a part of a tile costs a whole tile, a part of a step the whole step."""
    granule, tokens = rule.limits.granule_tokens, math.ceil(tokens - 1e-9)
    ends = [s for s in rule.model.step_lowers() if s >= tokens and s % granule == 0]
    whole = min(ends) if ends and min(ends) <= above else -(-tokens // granule) * granule
    return float(min(above, whole))


def _job_times(rule: ChunkRule, load: Load, fixed_ms: float, sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per size and job of ``load``: its time under a fixed chunk of that size, its first batch and its last."""
    model = rule.model
    starts = np.array([float(h) for h, _ in load.jobs])[:, None]
    tokens = np.array([float(n) for _, n in load.jobs])
    histories = starts + tokens[:, None] * PROMPT_NODES[None, :]
    chunk = np.minimum(sizes[:, None, None], tokens[None, :, None])
    own_ms = prompt_work_ms(model, starts[None, :, :], histories[None, :, :], chunk, tokens)  # (sizes, jobs)
    # A fixed chunk packs prefills into its batches: a job pays the fixed cost per chunk's worth of tokens.
    work_ms = own_ms + fixed_ms * tokens[None, :] / sizes[:, None]
    first_ms = fixed_ms + model.request_ms_many(chunk[:, :, 0], starts[None, :, 0])  # (sizes, jobs)
    last_ms = fixed_ms + model.request_ms_many(chunk[:, :, 0], histories[None, :, -1] - chunk[:, :, 0])
    return work_ms, first_ms, last_ms


def fixed_chunk_ttft_ms(rule: ChunkRule, load: Load, fixed_ms: float, pending: int, sizes: np.ndarray) -> np.ndarray:
    """The predicted mean TTFT under a fixed chunk of each of ``sizes``: ``tuned_fixed_chunk``'s curve."""
    return _ttft_ms(rule, load, pending, _job_times(rule, load, fixed_ms, sizes))


def _ttft_ms(rule: ChunkRule, load: Load, pending: int, times: tuple[np.ndarray, ...]) -> np.ndarray:
    """``fixed_chunk_ttft_ms`` from the jobs' times, first and last batches at each size (``_job_times``)."""
    work_ms, first_ms, last_ms = times
    stalls = rule.num_stages - 1
    held_ms = work_ms + stalls * np.maximum(last_ms - first_ms.mean(axis=1, keepdims=True), 0.0)
    alone_ms = (work_ms + stalls * last_ms).mean(axis=1)
    return queue_wait_ms(load, held_ms) + held_ms.mean(axis=1) * (max(1, pending) - 1) / 2 + alone_ms


def fixed_chunk_batch_ms(
    rule: ChunkRule, held: Sequence[tuple[int, int]], chunk_tokens: float, fixed_ms: float, queued_tokens: int = 0
) -> float:
    """The mean time of the batches a fixed chunk makes of ``held`` and ``queued_tokens`` more.

    A fixed chunk packs the prefills' tokens into batches of that many (vLLM's token budget
    spans requests), so a batch holds the chunk, or all the tokens there are if fewer. A
    token costs what its prefill's chunks cost per token over its remaining prompt (their
    time rises with the history; a prefill's chunks start from its history to its end less
    one chunk); queued tokens cost the held ones' mean.
    """
    return float(_batch_ms_many(rule, held, np.array([float(chunk_tokens)]), fixed_ms, queued_tokens)[0])


def _batch_ms_many(
    rule: ChunkRule, held: Sequence[tuple[int, int]], sizes: np.ndarray, fixed_ms: float, queued_tokens: int = 0
) -> np.ndarray:
    """``fixed_chunk_batch_ms`` for each of ``sizes``, in one call of the model."""
    starts = np.array([float(h) for h, _ in held])[None, :, None]
    remaining = np.array([float(r) for _, r in held])
    chunk = np.minimum(sizes[:, None], remaining[None, :])[:, :, None]  # (sizes, held, 1)
    histories = starts + (remaining[None, :, None] - chunk) * PROMPT_NODES[None, None, :]
    mean_ms = rule.model.request_ms_many(np.broadcast_to(chunk, histories.shape), histories) @ PROMPT_WEIGHTS
    token_ms = (mean_ms * (remaining[None, :] / chunk[:, :, 0])).sum(axis=1) / remaining.sum()
    return fixed_ms + token_ms * np.minimum(sizes, remaining.sum() + max(0, queued_tokens))
