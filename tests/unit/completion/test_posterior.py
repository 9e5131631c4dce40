"""The fold-in's posterior (service.completion.posterior): its mean is the fold-in's estimate,
its spread is the dense Bayesian linear model's, and its intervals cover what they claim on
data drawn from that model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.completion import fold_in, predict
from service.completion.posterior import PRIOR_NOISE_WEIGHT, ScorePosterior, score_posterior

MU, REG, FACTOR_REG, RANK = 0.4, 1.0, 4.0, 3


def _memories(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        rng.normal(0.0, 0.05, n), rng.normal(0.0, 0.2, (n, RANK)), rng.uniform(0.1, 0.6, n)
    )


def _scores(
    rng: np.random.Generator, memories: tuple[np.ndarray, np.ndarray, np.ndarray],
    theta: np.ndarray, noise: float,
) -> np.ndarray:
    offsets, factors, sims = memories
    rows = np.column_stack([np.ones(len(sims)), sims, factors])
    return np.clip(MU + offsets + rows @ theta + rng.normal(0.0, noise, len(sims)), 0.0, 1.0)


def _posterior(
    anchors: tuple[np.ndarray, np.ndarray, np.ndarray], scores: np.ndarray,
    candidates: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> tuple[ScorePosterior, np.ndarray]:
    query = fold_in(MU, *anchors, scores, REG, factor_reg=FACTOR_REG)
    estimates = predict(MU, candidates[0], candidates[1], candidates[2], query)
    return score_posterior(MU, anchors, scores, query, candidates, REG, FACTOR_REG), estimates


def test_the_posterior_mean_is_the_fold_ins_estimate() -> None:
    rng = np.random.default_rng(0)
    anchors, candidates = _memories(rng, 30), _memories(rng, 50)
    theta = np.array([0.05, 0.3, 0.2, -0.1, 0.0])
    posterior, estimates = _posterior(anchors, _scores(rng, anchors, theta, 0.05), candidates)
    np.testing.assert_allclose(posterior.mean, estimates, atol=1e-12)


def test_the_spread_is_the_dense_bayesian_linear_models() -> None:
    """Reference: the ridge as a Bayesian model written out densely, the prior as extra rows
    of an augmented least-squares problem, its covariance from the pseudo-inverse."""
    rng = np.random.default_rng(1)
    anchors, candidates = _memories(rng, 25), _memories(rng, 10)
    theta = np.array([0.0, 0.4, 0.1, 0.1, -0.2])
    scores = _scores(rng, anchors, theta, 0.08)
    posterior, _ = _posterior(anchors, scores, candidates)

    def rows(side: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        return np.column_stack([np.ones(len(side[2])), side[2], side[1]])

    prior_rows = np.diag(np.sqrt([REG, REG] + [FACTOR_REG] * RANK))
    augmented = np.vstack([rows(anchors), prior_rows])
    covariance = np.linalg.pinv(augmented.T @ augmented)
    fitted = np.linalg.lstsq(
        augmented, np.concatenate([scores - MU - anchors[0], np.zeros(2 + RANK)]), rcond=None
    )[0]
    residuals = scores - MU - anchors[0] - rows(anchors) @ fitted
    hat_trace = np.trace(rows(anchors) @ covariance @ rows(anchors).T)
    noise = (residuals @ residuals + PRIOR_NOISE_WEIGHT * MU * (1 - MU)) / (
        len(scores) - hat_trace + PRIOR_NOISE_WEIGHT
    )
    expected_sd = np.sqrt(noise * (1 + np.sum(rows(candidates) @ covariance * rows(candidates),
                                              axis=1)))
    np.testing.assert_allclose(posterior.sd, expected_sd, rtol=1e-9)


def test_candidates_unlike_the_anchors_are_less_certain() -> None:
    rng = np.random.default_rng(2)
    anchors = _memories(rng, 20)
    near = (np.zeros(1), anchors[1][:1], anchors[2][:1])
    far = (np.zeros(1), anchors[1][:1] * 0 + 3.0, np.array([0.9]))
    scores = _scores(rng, anchors, np.array([0.0, 0.3, 0.1, 0.0, 0.1]), 0.05)
    candidates = tuple(np.concatenate([a, b]) for a, b in zip(near, far, strict=True))
    posterior, _ = _posterior(anchors, scores, candidates)  # type: ignore[arg-type]
    assert posterior.sd[1] > 1.5 * posterior.sd[0]


def _coverage(n_anchors: int, seed: int) -> float:
    """The share of fresh scores inside the 95% intervals, for queries drawn from the prior
    with a known noise."""
    rng = np.random.default_rng(seed)
    inside, total = 0, 0
    for _ in range(100):
        anchors, candidates = _memories(rng, n_anchors), _memories(rng, 20)
        theta = rng.normal(0.0, 1.0, 2 + RANK) * np.sqrt(
            0.05**2 / np.array([REG, REG] + [FACTOR_REG] * RANK)
        )
        posterior, _ = _posterior(anchors, _scores(rng, anchors, theta, 0.05), candidates)
        fresh = _scores(rng, candidates, theta, 0.05)
        inside += int(np.sum(np.abs(fresh - posterior.mean) <= 1.96 * posterior.sd))
        total += len(fresh)
    return inside / total


def test_with_many_anchors_the_intervals_cover_what_they_claim() -> None:
    """The prior noise's pull has faded at 400 anchors (it adds ~10% to the sd here)."""
    assert 0.93 <= _coverage(400, 3) <= 0.985


def test_with_few_anchors_the_intervals_err_wide() -> None:
    """Twelve anchors, five parameters: the prior noise μ(1 − μ) still weighs, so the
    intervals are wider than the noise needs, never narrower."""
    assert _coverage(12, 5) >= 0.97


def test_a_few_anchors_that_fit_exactly_are_not_taken_as_certain() -> None:
    """Three anchors and five parameters fit to a zero residual; the prior noise μ(1 − μ)
    keeps the spread wide."""
    rng = np.random.default_rng(4)
    anchors = _memories(rng, 3)
    posterior, _ = _posterior(anchors, np.array([0.0, 1.0, 0.0]), _memories(rng, 5))
    assert np.all(posterior.sd > 0.3)


def test_the_probability_to_beat_a_threshold_is_the_normal_tail() -> None:
    posterior = ScorePosterior(np.array([0.0, 0.5, 0.2]), np.array([1.0, 0.1, 0.05]))
    probability = posterior.beat_probability(0.5)
    assert probability[0] == pytest.approx(0.5 * math.erfc(0.5 / math.sqrt(2)))
    assert probability[1] == pytest.approx(0.5)
    assert probability[2] == pytest.approx(0.5 * math.erfc(6 / math.sqrt(2)))


def test_a_quantile_is_the_score_beaten_with_the_complementary_probability() -> None:
    posterior = ScorePosterior(np.array([0.3, 0.6]), np.array([0.1, 0.2]))
    lower, upper = posterior.quantile(0.1), posterior.quantile(0.9)
    np.testing.assert_allclose(posterior.beat_probability(float(lower[0]))[0], 0.9)
    np.testing.assert_allclose(posterior.beat_probability(float(upper[1]))[1], 0.1)
    np.testing.assert_allclose(posterior.quantile(0.5), posterior.mean)
    assert np.all(lower < posterior.mean) and np.all(upper > posterior.mean)
