"""What a folded-in query's anchors leave unknown: the predictive distribution of each
candidate's score, and the probability that it beats a score threshold.

With the memory side fixed, the fold-in (:func:`service.completion.model.fold_in`) is a ridge
regression of the anchors' scores on x_m = [1, cos(q, m), u_m] with offsets μ + b_m (+ prior).
Read as a Bayesian linear model (noise variance σ², prior θ ~ N(0, σ² Λ⁻¹), Λ the ridge
penalty) its posterior is N(θ̂, σ² A⁻¹), A = XᵀX + Λ, in closed form, and a candidate's score
is predicted with variance σ² (1 + x_mᵀ A⁻¹ x_m): one judgement's noise plus what the anchors
leave unknown of the query, larger for candidates unlike the anchors.

σ² is estimated from the anchors' residuals over the ridge's effective degrees of freedom
(n − tr H), with one pseudo-observation of a prior variance μ(1 − μ) (a score in [0, 1] with
the namespace's mean μ varies at most that much): a query whose few anchors happen to fit
exactly is not taken as certain, and one with many anchors is judged by its residuals (the
prior's pull fades as 1/(n − tr H); intervals are conservative with few anchors). What the
memory side itself does not know (a memory's bias from few observations) is not in the closed
form; it shows up in the residuals instead.

Pure numpy, no I/O; used by the plan (stop scoring) and the ranking (trust an estimate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from service.completion.model import QueryParameters
from service.completion.ridge import Ridge, penalty
from service.completion.validation import check_length, float_array, ridge_diagonal

__all__ = ["ScorePosterior", "score_posterior"]

#: Pseudo-observations (an inverse-gamma prior's ν₀) of the prior noise variance μ(1 − μ),
#: pooled with the residuals.
PRIOR_NOISE_WEIGHT = 1.0
#: The least noise variance: a score's judge is never exact.
MIN_NOISE_VARIANCE = 1e-4

_normal_tail = np.vectorize(math.erfc, otypes=[np.float64])


@dataclass(frozen=True)
class ScorePosterior:
    """Each candidate's predicted score: mean (clipped to [0, 1], as the model predicts) and
    predictive standard deviation."""

    mean: NDArray[np.float64]
    sd: NDArray[np.float64]

    def beat_probability(self, threshold: float) -> NDArray[np.float64]:
        """P(score > ``threshold``) per candidate, under a normal predictive distribution."""
        z = (threshold - self.mean) / self.sd
        probability: NDArray[np.float64] = 0.5 * _normal_tail(z / math.sqrt(2.0))
        return probability

    def quantile(self, level: float) -> NDArray[np.float64]:
        """Each candidate's predictive quantile at ``level`` in (0, 1): the score it beats with
        probability 1 − ``level`` (a lower bound below 0.5, an upper one above; the mean at
        0.5)."""
        bound: NDArray[np.float64] = self.mean + NormalDist().inv_cdf(level) * self.sd
        return bound


@dataclass(frozen=True)
class _Design:
    """The fold-in's regression: rows [1, cos, u_m], offsets μ + b_m, and its penalty."""

    rows: NDArray[np.float64]
    offsets: NDArray[np.float64]
    ridge: Ridge

    @classmethod
    def of(
        cls, mu: float, memory_bias: NDArray[np.float64], memory_factors: NDArray[np.float64],
        similarities: NDArray[np.float64], reg: float, factor_reg: float | None,
    ) -> _Design:
        rows = np.column_stack([np.ones(len(similarities)), similarities, memory_factors])
        rank = memory_factors.shape[1]
        return cls(rows, mu + memory_bias, penalty(reg, factor_reg, 2, rank))


def score_posterior(
    mu: float,
    anchors: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]],
    anchor_scores: NDArray[np.float64],
    query: QueryParameters,
    candidates: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]],
    reg: float,
    factor_reg: float | None = None,
) -> ScorePosterior:
    """The predictive distribution of the ``candidates``' scores for a query folded in from
    its ``anchors`` as ``query``. ``anchors`` and ``candidates`` are each (memory offsets
    b_m (+ content prior), memory factors (n, r), similarities); ``reg`` and ``factor_reg``
    are the fold-in's."""
    anchor_design = _Design.of(mu, *_memory_side(anchors), reg, factor_reg)
    candidate_design = _Design.of(mu, *_memory_side(candidates), reg, factor_reg)
    scores = float_array("anchor_scores", anchor_scores, ndim=1)
    check_length("anchor_scores", scores, len(anchor_design.rows), "anchors")
    theta = np.concatenate([[query.bias, query.slope], query.factors])
    rows = anchor_design.rows
    n, width = rows.shape
    gram_inverse = np.linalg.inv(
        rows.T @ rows + np.diag(ridge_diagonal(anchor_design.ridge, width))
    )
    residuals = scores - anchor_design.offsets - rows @ theta
    effective_dof = float(np.einsum("ij,jk,ik->", rows, gram_inverse, rows))
    prior_variance = max(mu * (1.0 - mu), MIN_NOISE_VARIANCE)
    noise_variance = max(
        (float(residuals @ residuals) + PRIOR_NOISE_WEIGHT * prior_variance)
        / (max(n - effective_dof, 0.0) + PRIOR_NOISE_WEIGHT),
        MIN_NOISE_VARIANCE,
    )
    unknown = np.einsum("ij,jk,ik->i", candidate_design.rows, gram_inverse, candidate_design.rows)
    mean = np.clip(candidate_design.offsets + candidate_design.rows @ theta, 0.0, 1.0)
    return ScorePosterior(mean, np.sqrt(noise_variance * (1.0 + unknown)))


def _memory_side(
    side: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]],
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    offsets, factors, similarities = side
    offsets_ = float_array("memory_offsets", offsets, ndim=1)
    factors_ = float_array("memory_factors", factors, ndim=2)
    similarities_ = float_array("similarities", similarities, ndim=1)
    check_length("similarities", similarities_, factors_.shape[0], "memory_factors")
    check_length("memory_offsets", offsets_, factors_.shape[0], "memory_factors")
    return offsets_, factors_, similarities_
