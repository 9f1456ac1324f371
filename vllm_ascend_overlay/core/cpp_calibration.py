"""Online calibration of the CPP latency model from timed steps.

The start-up profile measures single requests on dummy inputs; real steps mix
requests, carry decodes and run on real data. Timed steps (the slowest stage's compute,
the same quantity the profile measures) go into a window; every ``refit_every``
records, if the current model is off by more than 5% on the window, it is refitted two
ways, on the profile rows plus the window and on the window alone, and a candidate is
adopted only if it halves the current model's error on the window and keeps the
reference time (a full chunk without history) within ``max_shift`` of the current one.
A window whose steps are all of about one size (a series of health checks, one prompt
length) is not refitted on: it cannot tell the fixed cost from the per-token ones.
Without an accepted profile nothing is adopted. Rows carry their source (``profile`` or ``step``).
Pure numpy; logging through vLLM.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from vllm.logger import init_logger
from vllm_ascend.core.cpp_latency_model import MIN_FIT_POINTS, NUM_FEATURES, FitError, LatencyModel, batch_features

logger = init_logger(__name__)

PROFILE, STEP = "profile", "step"
CALIBRATED_ERROR = 0.05  # a model within this mean error on the window is not refitted
MIN_WINDOW_SPREAD = 2.0  # a refit needs steps whose token counts, or histories, differ by this factor


@dataclass(frozen=True)
class CalibrationRow:
    features: np.ndarray  # [1, sum C, sum H, sum C^2, sum C*H]
    measured_ms: float
    source: str  # PROFILE or STEP


class OnlineCalibration:
    """A window of timed steps that refines an accepted latency model (see the module docstring)."""

    def __init__(
        self,
        model: LatencyModel,
        profile_samples: Iterable[Sequence[float]],
        *,
        reference_chunk_tokens: int,
        window_size: int = 30,
        refit_every: int = 8,
        max_shift: float = 0.25,
    ) -> None:
        self.model = model
        self.reference_chunk_tokens = int(reference_chunk_tokens)
        self.refit_every = max(1, int(refit_every))
        self.max_shift = float(max_shift)
        self.profile_rows = [
            CalibrationRow(batch_features([(int(c), int(h))]), float(ms), PROFILE) for c, h, ms in profile_samples
        ]
        self.window: deque[CalibrationRow] = deque(maxlen=max(MIN_FIT_POINTS, int(window_size)))
        self.refits_adopted = 0
        self._since_refit = 0

    def rows(self) -> list[CalibrationRow]:
        """Every row a refit may use, tagged by source."""
        return [*self.profile_rows, *self.window]

    def record(self, pairs: Sequence[tuple[int, int]], measured_ms: float) -> LatencyModel | None:
        """One timed step as its (chunk_tokens, history_tokens) pairs; the new model if one was adopted."""
        features = batch_features(pairs)
        if not (math.isfinite(measured_ms) and measured_ms > 0) or not features[1] > 0:
            return None
        if not np.all(np.isfinite(features)):
            return None
        self.window.append(CalibrationRow(features, float(measured_ms), STEP))
        self._since_refit += 1
        if self._since_refit < self.refit_every or len(self.window) < MIN_FIT_POINTS:
            return None
        self._since_refit = 0
        tokens = [row.features[1] for row in self.window]
        histories = [row.features[2] for row in self.window]
        if max(tokens) < MIN_WINDOW_SPREAD * min(tokens) and max(histories) <= MIN_WINDOW_SPREAD * min(histories):
            return None  # steps of about one size (health checks, one prompt length) say too little
        return self._refit()

    def window_error(self, model: LatencyModel) -> float:
        """Mean relative error of ``model`` on the window's steps."""
        rows = np.array([row.features for row in self.window]).reshape(-1, NUM_FEATURES)
        measured = np.array([row.measured_ms for row in self.window])
        return float(np.mean(np.abs(model.features_time_ms(rows) - measured) / measured))

    def _refit(self) -> LatencyModel | None:
        current = self.model
        reference_ms = current.time_ms(self.reference_chunk_tokens, 0)
        best, best_error = current, self.window_error(current)
        if best_error <= CALIBRATED_ERROR:
            return None  # the model already predicts these steps: a refit could only overfit them
        for sources in ((PROFILE, STEP), (STEP,)):
            rows = [row for row in self.rows() if row.source in sources]
            try:
                candidate = LatencyModel.fit_features(
                    np.array([row.features for row in rows]), [row.measured_ms for row in rows]
                )
            except FitError as error:
                logger.debug("[CPP] online refit on %s rows rejected: %s", "+".join(sources), error)
                continue
            shift = candidate.time_ms(self.reference_chunk_tokens, 0) / reference_ms - 1.0
            if abs(shift) > self.max_shift:
                logger.debug(
                    "[CPP] online refit on %s rows would move the model by %+.0f%%", "+".join(sources), 100 * shift
                )
                continue
            error = self.window_error(candidate)
            if error < best_error and error < self.window_error(current) / 2:
                best, best_error = candidate, error
        if best is current:
            return None
        self.model = best
        self.refits_adopted += 1
        logger.debug("[CPP] online refit adopted: c=%s, window error %.1f%%", best.coefficients, 100 * best_error)
        return best
