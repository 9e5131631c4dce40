"""The similarity-aware completion model against known truth and its plain special case."""

from __future__ import annotations

import numpy as np
import pytest

from service.completion.model import (
    QueryParameters,
    fit_model,
    fold_in,
    leave_one_out,
    predict,
)
from tests.unit.completion.reference_als import BiasedALS, fold_in_query


def synthetic(seed: int, n_memories: int = 120, n_queries: int = 80, rank: int = 3):
    """Scores = μ + b_m + c_q + β_q·cos + u_m·v_q + noise, with cos in [0, 1)."""
    rng = np.random.default_rng(seed)
    cos = rng.uniform(0.0, 0.8, size=(n_memories, n_queries))
    truth = (
        0.2
        + rng.normal(scale=0.05, size=(n_memories, 1))
        + rng.normal(scale=0.05, size=(1, n_queries))
        + rng.uniform(0.3, 0.7, size=(1, n_queries)) * cos
        + rng.normal(scale=0.3, size=(n_memories, rank))
        @ rng.normal(scale=0.3, size=(rank, n_queries))
    )
    scores = np.clip(truth + rng.normal(scale=0.02, size=truth.shape), 0.0, 1.0)
    return rng, cos, np.clip(truth, 0.0, 1.0), scores


def split(rng, shape, share):
    mask = rng.uniform(size=shape) < share
    return np.nonzero(mask), np.nonzero(~mask)


def test_similarity_model_beats_the_plain_model_on_held_out_cells() -> None:
    rng, cos, truth, scores = synthetic(0)
    (m, q), (hm, hq) = split(rng, scores.shape, 0.3)
    similar = fit_model(
        m, q, cos[m, q], scores[m, q], *scores.shape, rank=3, reg=0.1, n_iterations=15
    )
    plain = BiasedALS(rank=3, reg=0.1, n_iterations=15).fit(m, q, scores[m, q], *scores.shape)
    similar_estimate = np.clip(
        similar.mu
        + similar.memory_bias[hm]
        + similar.query_bias[hq]
        + similar.query_slope[hq] * cos[hm, hq]
        + np.einsum("ij,ij->i", similar.memory_factors[hm], similar.query_factors[hq]),
        0,
        1,
    )
    plain_estimate = np.clip(
        plain.mu
        + plain.memory_bias[hm]
        + plain.query_bias[hq]
        + np.einsum("ij,ij->i", plain.memory_factors[hm], plain.query_factors[hq]),
        0,
        1,
    )
    similar_error = np.sqrt(np.mean((similar_estimate - truth[hm, hq]) ** 2))
    plain_error = np.sqrt(np.mean((plain_estimate - truth[hm, hq]) ** 2))
    assert np.isfinite(similar_error)
    assert similar_error < 0.8 * plain_error


def test_zero_similarities_reduce_the_fold_in_to_the_plain_fold_in() -> None:
    rng = np.random.default_rng(1)
    bias, factors, scores = rng.normal(size=12), rng.normal(size=(12, 3)), rng.uniform(size=12)
    plain_bias, plain_factors = fold_in_query(0.3, bias, factors, scores, 0.5)
    query = fold_in(0.3, bias, factors, np.zeros(12), scores, 0.5, min_slope=0.0)
    assert query.slope == pytest.approx(0.0)
    assert query.bias == pytest.approx(plain_bias)
    np.testing.assert_allclose(query.factors, plain_factors)


def test_fold_in_without_history_is_a_calibrated_similarity_that_keeps_semantic_order() -> None:
    sims = np.linspace(0.1, 0.7, 20)
    scores = np.clip(0.05 + 0.9 * sims, 0, 1)
    query = fold_in(0.0, np.zeros(20), np.zeros((20, 2)), sims, scores, 0.01)
    assert query.slope > 0.5
    estimates = predict(
        0.0, np.zeros(5), np.zeros((5, 2)), np.array([0.1, 0.2, 0.3, 0.4, 0.5]), query
    )
    assert np.all(np.diff(estimates) > 0)


def test_negative_slope_is_floored_and_the_rest_refitted() -> None:
    sims = np.linspace(0.1, 0.7, 10)
    scores = 1.0 - sims  # anti-correlated anchors
    query = fold_in(
        0.0, np.zeros(10), np.zeros((10, 2)), sims, scores, 0.1, min_slope=1e-3
    )
    assert query.slope == pytest.approx(1e-3)
    assert np.isfinite(query.bias) and np.all(np.isfinite(query.factors))


def test_leave_one_out_equals_fold_ins_without_each_anchor() -> None:
    rng = np.random.default_rng(2)
    bias, factors = rng.normal(scale=0.1, size=8), rng.normal(scale=0.3, size=(8, 2))
    sims, scores = rng.uniform(0, 0.8, size=8), rng.uniform(size=8)
    loo = leave_one_out(0.2, bias, factors, sims, scores, 0.5)
    for i in range(8):
        keep = np.arange(8) != i
        query = fold_in(
            0.2, bias[keep], factors[keep], sims[keep], scores[keep], 0.5, min_slope=-np.inf
        )
        expected = predict(
            0.2, bias[i : i + 1], factors[i : i + 1], sims[i : i + 1], query
        )[0]
        assert loo[i] == pytest.approx(expected, abs=1e-10)


def test_predict_is_the_formula_clipped() -> None:
    query = QueryParameters(bias=0.1, slope=0.5, factors=np.array([1.0, -1.0]))
    bias = np.array([0.0, 0.2, 2.0])
    factors = np.array([[0.1, 0.0], [0.0, 0.1], [0.0, 0.0]])
    sims = np.array([0.4, 0.2, 0.9])
    estimates = predict(0.05, bias, factors, sims, query)
    np.testing.assert_allclose(
        estimates, [0.05 + 0.1 + 0.2 + 0.1, 0.05 + 0.2 + 0.1 + 0.1 - 0.1, 1.0]
    )


def test_fit_model_is_seeded_and_finite_on_degenerate_input() -> None:
    empty = fit_model([], [], [], [], 3, 2, rank=2, reg=1.0, n_iterations=3)
    assert empty.mu == 0.0 and np.all(empty.memory_bias == 0) and np.all(empty.query_slope == 0)
    one = fit_model([0], [0], [0.5], [1.0], 1, 1, rank=4, reg=1.0, n_iterations=3)
    assert all(
        np.all(np.isfinite(a)) for a in (one.memory_factors, one.query_factors, one.query_slope)
    )
    rng, cos, _, scores = synthetic(3, 20, 10)
    (m, q), _ = split(rng, scores.shape, 0.5)
    first = fit_model(
        m, q, cos[m, q], scores[m, q], 20, 10, rank=2, reg=1.0, n_iterations=4, seed=5
    )
    second = fit_model(
        m, q, cos[m, q], scores[m, q], 20, 10, rank=2, reg=1.0, n_iterations=4, seed=5
    )
    np.testing.assert_array_equal(first.memory_factors, second.memory_factors)


def content_synthetic(seed: int, n_memories: int = 300, n_queries: int = 60, dim: int = 16):
    """Scores driven by a shared content direction: 0.1 + 0.3·cos + e_m·w + noise."""
    rng = np.random.default_rng(seed)
    embeddings = rng.normal(size=(n_memories, dim))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    weights = 0.4 * rng.normal(size=dim) / np.sqrt(dim)
    cos = rng.uniform(0.0, 0.8, size=(n_memories, n_queries))
    truth = 0.1 + 0.3 * cos + (embeddings @ weights)[:, None]
    scores = np.clip(truth + rng.normal(scale=0.1, size=truth.shape), 0.0, 1.0)
    return rng, embeddings, weights, cos, np.clip(truth, 0.0, 1.0), scores


def test_content_prior_carries_what_observed_memories_taught_to_memories_never_observed() -> None:
    rng, embeddings, weights, cos, truth, scores = content_synthetic(0)
    seen = 200  # memories 200.. have no observation at all
    (m, q), _ = split(rng, (seen, scores.shape[1]), 0.2)

    def fit(memory_embeddings):
        return fit_model(
            m, q, cos[m, q], scores[m, q], seen, scores.shape[1], rank=2, reg=1.0,
            n_iterations=8, memory_embeddings=memory_embeddings, content_reg=10.0,
        )

    def cold_error(model) -> float:
        cold = np.arange(seen, scores.shape[0])
        content = embeddings[cold] @ model.prior.weights if len(model.prior.weights) else 0.0
        estimate = [
            predict(
                model.mu,
                np.zeros(len(cold)) + model.prior.slope * cos[cold, j] + content,
                np.zeros((len(cold), 2)),
                cos[cold, j],
                QueryParameters(model.query_bias[j], model.query_slope[j], model.query_factors[j]),
            )
            for j in range(scores.shape[1])
        ]
        return float(np.sqrt(np.mean((np.array(estimate).T - truth[cold]) ** 2)))

    with_prior = fit(embeddings[:seen])
    assert cold_error(with_prior) < 0.6 * cold_error(fit(None))
    # The learned direction is the true one.
    assert np.corrcoef(with_prior.prior.weights, weights)[0, 1] > 0.9


def test_without_embeddings_the_model_has_no_content_prior() -> None:
    _, _, _, cos, _, scores = content_synthetic(1, n_memories=30, n_queries=10)
    (m, q), _ = split(np.random.default_rng(0), scores.shape, 0.5)
    model = fit_model(
        m, q, cos[m, q], scores[m, q], *scores.shape, rank=2, reg=1.0, n_iterations=3
    )
    assert model.prior.slope == 0.0
    assert len(model.prior.weights) == 0
    assert np.all(model.prior.offsets(cos[:, 0], np.zeros(30)) == 0.0)


def test_memory_reg_shrinks_only_the_memory_side() -> None:
    rng, cos, _, scores = synthetic(2)
    (m, q), _ = split(rng, scores.shape, 0.3)
    loose = fit_model(
        m, q, cos[m, q], scores[m, q], *scores.shape, rank=3, reg=0.1, n_iterations=5
    )
    tight = fit_model(
        m, q, cos[m, q], scores[m, q], *scores.shape,
        rank=3, reg=0.1, n_iterations=5, memory_reg=1e4,
    )
    assert np.abs(tight.memory_bias).max() < 0.01 < np.abs(loose.memory_bias).max()
    assert np.abs(tight.query_bias).max() > 0.01
