"""Online calibration of the CPP latency model from timed steps: the measured table, refined where steps ran.

The start-up profile measures single requests on dummy inputs; real steps mix requests,
carry decodes and run on real data. Timed steps (the slowest stage's compute, the same
quantity the profile measures) go into a window of the last ``window_size``. Every
``refit_every`` records, if the current model is off by more than ``CALIBRATED_ERROR``
(mean relative error) on the window, a corrected table is made from each step's error,
log(measured / predicted):

1. the fixed cost is split into what a step pays once and what each request pays at
   least, from steps of different request counts (``shared_fixed_ms``): the profile
   times one request per step and cannot tell the two apart;
2. the whole table moves by the median error, when the window's steps differ in size by
   at least ``MIN_WINDOW_SPREAD`` or in history by at least one interval between the
   profile's history levels (a device slower than its profile, as real data often makes
   it): steps of about one size, or within one interval of history, cannot speak for the
   whole table (there the error may be the interpolation's between two levels);
3. what is left of each step's error is laid on the four grid points around its largest
   request (bilinear weights in log C and H), and every grid point moves by the weighted
   mean of what it received, shrunk towards no change by ``PRIOR_WEIGHT`` steps' worth
   of trust in the profile.

Every point moves by at most ``max_shift``, and the table is made monotone again. So a
series of odd steps (health checks) moves only the few points around them. The
corrected table is adopted only if it halves the current model's error on the window (a
table fitted to the window always lowers its error there a little, by its noise); or, when
the window's median error is beyond what one refit may move by more than three of its
standard errors (a device several times slower or faster than its profile, which the
halving cannot pass), if it lowers the error by more than ``CALIBRATED_ERROR``: so such a
device gets there over a few refits. Within ``CALIBRATED_ERROR`` only the split is tried
(a correction of grid points could only chase noise there).
Pure Python and numpy: no vLLM, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from vllm_ascend.core.cpp_latency_model import LatencyModel, batch_features, monotone_grid
from vllm_ascend.core.cpp_samples import MAX_LATENCY_MS, MIN_LATENCY_MS, SampleError, check_sample
from vllm_ascend.log_adapter import get_logger

logger = get_logger(__name__)

CALIBRATED_ERROR = 0.05  # a model within this mean error on the window is not corrected
PRIOR_WEIGHT = 2.0  # a grid point trusts its profiled value as much as this many steps
MIN_WINDOW_SPREAD = 2.0  # the whole table moves only on steps whose sizes or histories differ by this factor
MIN_WINDOW = 8  # steps in the window before the first correction
MIN_SPLIT_STEPS = 4  # steps of another request count than the window's usual one before the fixed cost is split
MAX_SPLIT_FACTOR = 2.0  # one refit moves the fixed cost by at most this factor
MAX_WINDOW = 4096


def _costliest(model: LatencyModel, pairs: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """A step's request of the largest own cost: the one its error is laid on."""
    return max(pairs, key=lambda pair: model.request_ms(*pair))


def _other_history(model: LatencyModel, pairs: Sequence[tuple[int, int]]) -> float:
    """The history a step's requests other than its costliest one attend to (tokens)."""
    return float(sum(history for _, history in pairs) - _costliest(model, pairs)[1])


@dataclass(frozen=True)
class StepRow:
    pairs: tuple[tuple[int, int], ...]  # the step's (chunk_tokens, history_tokens)
    measured_ms: float


class OnlineCalibration:
    """A window of timed steps that refines an accepted latency model (see the module docstring)."""

    def __init__(
        self,
        model: LatencyModel,
        *,
        window_size: int = 30,
        refit_every: int = 8,
        max_shift: float = 0.25,
    ) -> None:
        self.model = model
        self.refit_every = max(1, int(refit_every))
        self.max_shift = float(max_shift)
        self.window: deque[StepRow] = deque(maxlen=min(MAX_WINDOW, max(MIN_WINDOW, int(window_size))))
        self.refits_adopted = 0
        self._since_refit = 0

    def record(self, pairs: Sequence[tuple[int, int]], measured_ms: float) -> LatencyModel | None:
        """One timed step as its (chunk_tokens, history_tokens) pairs; the new model if one was adopted."""
        if not (isinstance(measured_ms, int | float) and MIN_LATENCY_MS <= measured_ms <= MAX_LATENCY_MS):
            return None
        try:
            for chunk, history in pairs:
                check_sample((chunk, history, measured_ms))
        except (SampleError, TypeError, ValueError):
            return None
        row = StepRow(batch_features(pairs), float(measured_ms))
        if not row.pairs:
            return None
        self.window.append(row)
        self._since_refit += 1
        if self._since_refit < self.refit_every or len(self.window) < MIN_WINDOW:
            return None
        self._since_refit = 0
        return self._refit()

    def window_error(self, model: LatencyModel) -> float:
        """Mean relative error of ``model`` on the window's steps."""
        errors = [abs(model.batch_time_ms(row.pairs) / row.measured_ms - 1.0) for row in self.window]
        return float(np.mean(errors)) if errors else 0.0

    def shared_fixed_ms(self, model: LatencyModel) -> float:
        """The part of ``model.fixed_ms`` the window's steps pay once, not once per request.

        The profile times one request per step, so what a step costs once and what every
        request costs at least (a tile of its own, a kernel launch per sequence) add up
        to its fixed cost and cannot be told apart there. Steps of several requests tell
        them apart: fit ``measured = g * (predicted + f * (requests - 1))`` (least squares
        on relative errors; g absorbs a device slower or faster than its profile) and
        move f from the step's fixed cost to every request's own cost. The history the
        other requests attend to rises with their count, so it has its own term (an error
        in what decodes cost at depth is not a floor). The split stays as it is unless at
        least ``MIN_SPLIT_STEPS`` steps differ in request count from the window's most
        common one (one odd step cannot set it), and one refit moves the fixed cost by at
        most a factor ``MAX_SPLIT_FACTOR``.
        """
        extra = np.array([len(row.pairs) - 1 for row in self.window], dtype=np.float64)
        counts = np.unique(extra, return_counts=True)[1]
        if len(counts) < 2 or len(extra) - counts.max() < MIN_SPLIT_STEPS:
            return model.fixed_ms
        measured = np.array([row.measured_ms for row in self.window])
        predicted = np.array([model.batch_time_ms(row.pairs) for row in self.window])
        depth = np.array([_other_history(model, row.pairs) for row in self.window]) / 1000.0
        design = np.column_stack([predicted / measured, extra / measured, depth / measured])
        (scale, per_request, _), *_ = np.linalg.lstsq(design, np.ones_like(measured), rcond=None)
        if not (scale > 0 and math.isfinite(per_request)):
            return model.fixed_ms
        low, high = model.fixed_ms / MAX_SPLIT_FACTOR, model.fixed_ms * MAX_SPLIT_FACTOR
        return min(max(model.fixed_ms - per_request / scale, low), high, model.step_ms[0][0])

    def split(self) -> LatencyModel:
        """The current model with its fixed cost split as the window shows (``shared_fixed_ms``)."""
        model = self.model
        fixed_ms = self.shared_fixed_ms(model)
        if fixed_ms == model.fixed_ms:
            return model
        return replace(model, fixed_ms=fixed_ms)

    def corrected(self) -> LatencyModel:
        """The current model with its fixed cost split and its grid points moved by the window's errors."""
        model = self.split()
        nodes = np.log(np.array(model.chunk_tokens, dtype=np.float64))
        levels = np.array(model.history_tokens, dtype=np.float64)
        evidence = np.zeros((len(levels), len(nodes)))
        weight = np.zeros_like(evidence)
        errors = [math.log(row.measured_ms / model.batch_time_ms(row.pairs)) for row in self.window]
        bound = math.log1p(self.max_shift)
        whole = min(max(float(np.median(errors)), -bound), bound) if self._spread() else 0.0
        for row, log_error in zip(self.window, errors, strict=True):
            chunk, history = _costliest(model, row.pairs)
            x = min(max(math.log(max(chunk, 1)), nodes[0]), nodes[-1])
            i = min(int(np.searchsorted(nodes, x, side="right")) - 1, len(nodes) - 2)
            wx = (x - nodes[i]) / (nodes[i + 1] - nodes[i])
            if len(levels) == 1:
                wy, rows = 0.0, (0, 0)
            else:
                y = min(max(float(history), levels[0]), levels[-1])
                j = min(int(np.searchsorted(levels, y, side="right")) - 1, len(levels) - 2)
                wy = (y - levels[j]) / (levels[j + 1] - levels[j])
                rows = (j, j + 1)
            for level, w_level in ((rows[0], 1.0 - wy), (rows[1], wy)):
                for node, w_node in ((i, 1.0 - wx), (i + 1, wx)):
                    evidence[level, node] += w_level * w_node * (log_error - whole)
                    weight[level, node] += w_level * w_node
        shift = np.clip(whole + evidence / (weight + PRIOR_WEIGHT), -bound, bound)
        grid = (np.array(model.step_ms) * np.exp(shift)).tolist()
        # (the odd points a profile kept stay odd: a correction moves them, it does not average them away)
        kept = [(model.history_tokens.index(h), model.chunk_tokens.index(c)) for c, h in model.odd_points]
        rows = monotone_grid(grid, [[1.0] * len(nodes) for _ in levels], kept)
        fixed_ms = min(model.fixed_ms, rows[0][0])
        return LatencyModel(
            model.chunk_tokens,
            model.history_tokens,
            tuple(tuple(r) for r in rows),
            fixed_ms,
            scatter=model.scatter,
            num_points=model.num_points,
            steps=model.steps,
            odd_points=model.odd_points,
            reach=model.reach,
        )

    def _spread(self) -> bool:
        """Whether the window's steps reach across the table: sizes ``MIN_WINDOW_SPREAD`` apart, or histories
        at least one interval between the profile's levels apart. The table is linear in history between
        two levels, so the first steps of a prompt (histories from 0 to a few thousand, of one size) may
        all show the error that interpolation makes there, which says nothing of the rest of the table."""
        tokens = [sum(chunk for chunk, _ in row.pairs) for row in self.window]
        histories = [max(history for _, history in row.pairs) for row in self.window]
        levels = self.model.history_tokens
        interval = min((b - a for a, b in zip(levels, levels[1:], strict=False)), default=math.inf)
        return max(tokens) >= MIN_WINDOW_SPREAD * min(tokens) or max(histories) - min(histories) >= interval

    def _beyond_reach(self) -> bool:
        """Whether the window's median error is beyond what one refit may move (``max_shift``) by more than
        three of its standard errors (from the errors' own scatter): a device that far from its model, not
        noise, which around an unbiased model moves the median of a window that far only by chance."""
        errors = np.array([math.log(row.measured_ms / self.model.batch_time_ms(row.pairs)) for row in self.window])
        median = float(np.median(errors))
        scatter = 1.4826 * float(np.median(np.abs(errors - median)))  # (the errors' sigma, robust to stalls)
        return abs(median) - 3.0 * 1.2533 * scatter / math.sqrt(len(errors)) > math.log1p(self.max_shift)

    def _refit(self) -> LatencyModel | None:
        current_error = self.window_error(self.model)
        # Within CALIBRATED_ERROR moving grid points could only chase noise; the split, one
        # number fitted over every step of the window, is still taken if it halves the error.
        candidate = self.corrected() if current_error > CALIBRATED_ERROR else self.split()
        if candidate is self.model:
            return None
        error = self.window_error(candidate)
        if not (error <= current_error / 2 or (error < current_error - CALIBRATED_ERROR and self._beyond_reach())):
            logger.debug(
                "[CPP] online correction not adopted: window error %.1f%% -> %.1f%%", 100 * current_error, 100 * error
            )
            return None
        self.model = candidate
        self.refits_adopted += 1
        logger.debug("[CPP] online correction adopted: window error %.1f%% -> %.1f%%", 100 * current_error, 100 * error)
        return candidate
