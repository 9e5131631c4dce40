"""Similarity calibrated on one query's anchors: the estimate of the policies that do not run
the completion model (``observed``, ``full``), and the yardstick of the model's cold start.

Pure numpy; bad input raises :class:`~service.completion.validation.ModelFitError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion.validation import (
    ModelFitError,
    check_length,
    finite_scalar,
    float_array,
    unit_scores,
)

__all__ = ["SimilarityCalibration", "calibrate_similarity"]


@dataclass(frozen=True)
class SimilarityCalibration:
    """score ≈ intercept + slope · similarity, fitted per query on its anchors.

    Gives memories without history (cold rows) an estimate on the same scale as observed and
    completed scores. ``slope`` is never below the ``min_slope`` it was fitted with (> 0 by
    default), so the estimate preserves the semantic order, except for ties where it is clipped.
    """

    intercept: float
    slope: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "intercept", finite_scalar("intercept", self.intercept))
        object.__setattr__(self, "slope", finite_scalar("slope", self.slope))

    def estimate(self, similarities: ArrayLike) -> NDArray[np.float64]:
        """Calibrated scores for ``similarities``, clipped to [0, 1]."""
        sims = float_array("similarities", similarities, ndim=1)
        return np.clip(self.intercept + self.slope * sims, 0.0, 1.0)


def calibrate_similarity(
    similarities: ArrayLike,
    scores: ArrayLike,
    reg: float = 1.0,
    min_slope: float = 1e-3,
) -> SimilarityCalibration:
    """Ridge fit of score ≈ intercept + slope · similarity over one query's anchors.

    Only the slope is penalised: minimising Σ(s − a − β·x)² + reg·β² gives
    β = cov(x, s) / (var(x) + reg / n) and a = mean(s) − β·mean(x), so with few anchors the slope
    shrinks toward 0 (the estimate toward the anchors' mean score) and with many it is the plain
    least-squares slope. β is then floored at ``min_slope``: a negative slope (noise, or a query
    whose relevant memories happen to be less similar) would rank cold memories in reverse
    semantic order, which is never a better bet than the embedding's own order.

    Degenerate inputs, all finite: one anchor or constant similarities give slope ``min_slope``
    through the anchors' mean; no anchors give intercept 0 and slope ``min_slope``, i.e.
    estimates ≈ 0 that only keep the semantic order (no evidence for any level).
    """
    sims = float_array("similarities", similarities, ndim=1)
    s = unit_scores("scores", scores)
    check_length("similarities", sims, s.shape[0], "scores")
    lam = finite_scalar("reg", reg)
    floor = finite_scalar("min_slope", min_slope)
    if lam < 0.0:
        raise ModelFitError(f"reg must be >= 0, got {lam}")
    if floor < 0.0:
        raise ModelFitError(f"min_slope must be >= 0, got {floor}")
    n = sims.shape[0]
    if n == 0:
        return SimilarityCalibration(intercept=0.0, slope=floor)
    sim_mean = float(sims.mean())
    score_mean = float(s.mean())
    centred = sims - sim_mean
    var = float(np.mean(centred**2))
    cov = float(np.mean(centred * (s - score_mean)))
    denom = var + lam / n
    slope = cov / denom if denom > 0.0 else 0.0  # reg = 0 with constant similarities: no slope info
    slope = max(slope, floor)
    return SimilarityCalibration(intercept=score_mean - slope * sim_mean, slope=slope)
