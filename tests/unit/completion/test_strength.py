"""The factors' weight (service.completion.strength): balanced weights learn interaction that the
unbalanced ones shrink away, and the per-namespace choice by causal error takes them where the
scores hold interaction and keeps the bias-only model where they hold none. Known truth,
held-out cells only; no database."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from service.completion import fit_model
from service.completion.ridge import penalty, solve_side
from service.completion.strength import MIN_QUERIES, FitOptions, choose_factor_reg

#: The service's defaults (Settings: rank, reg, memory_reg, content_reg, als_iterations).
DEFAULTS = FitOptions(rank=8, reg=1.0, memory_reg=1000.0, content_reg=100.0, n_iterations=10)
N_MEMORIES, N_QUERIES, PER_QUERY, HELD_PER_QUERY, DIM = 600, 400, 35, 20, 16


@dataclass(frozen=True)
class Stream:
    memory_idx: np.ndarray
    query_idx: np.ndarray
    scores: np.ndarray
    embeddings: np.ndarray
    held_memory: np.ndarray  # cells never observed, to measure on
    held_query: np.ndarray
    held_scores: np.ndarray


def stream(seed: int, interaction: float, n_queries: int = N_QUERIES) -> Stream:
    """Scores μ + b_m + c_q + interaction·(u_m·v_q) (rank 2) + noise, each query observing 35
    memories (a retrieve's anchors) and 20 more held out."""
    rng = np.random.default_rng(seed)
    u = rng.normal(scale=0.25, size=(N_MEMORIES, 2))
    v = rng.normal(scale=0.25, size=(n_queries, 2))
    truth = (
        0.2 + rng.normal(scale=0.05, size=(N_MEMORIES, 1))
        + rng.normal(scale=0.05, size=(1, n_queries)) + interaction * (u @ v.T)
    )
    scores = np.clip(truth + rng.normal(scale=0.05, size=truth.shape), 0.0, 1.0)
    picks = np.stack([rng.choice(N_MEMORIES, PER_QUERY + HELD_PER_QUERY, replace=False)
                      for _ in range(n_queries)])
    observed, held = picks[:, :PER_QUERY].ravel(), picks[:, PER_QUERY:].ravel()
    queries = np.arange(n_queries)
    observed_q, held_q = np.repeat(queries, PER_QUERY), np.repeat(queries, HELD_PER_QUERY)
    embeddings = rng.normal(size=(N_MEMORIES, DIM))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return Stream(observed, observed_q, scores[observed, observed_q], embeddings,
                  held, held_q, scores[held, held_q])


def fitted(data: Stream, factor_reg: float | None) -> tuple[float, float]:
    """Held-out RMSE of the model fitted at ``factor_reg``, and its mean |memory factor|."""
    model = fit_model(
        data.memory_idx, data.query_idx, np.zeros(len(data.scores)), data.scores,
        N_MEMORIES, int(data.query_idx.max()) + 1, rank=DEFAULTS.rank, reg=DEFAULTS.reg,
        n_iterations=DEFAULTS.n_iterations, memory_reg=DEFAULTS.memory_reg,
        factor_reg=factor_reg,
    )
    m, q = data.held_memory, data.held_query
    estimates = np.clip(
        model.mu + model.memory_bias[m] + model.query_bias[q]
        + np.einsum("ij,ij->i", model.memory_factors[m], model.query_factors[q]), 0.0, 1.0,
    )
    return (float(np.sqrt(np.mean((estimates - data.held_scores) ** 2))),
            float(np.abs(model.memory_factors).mean()))


def choose(data: Stream) -> float | None:
    return choose_factor_reg(
        data.memory_idx, data.query_idx, np.zeros(len(data.scores)), data.scores,
        data.embeddings, options=DEFAULTS,
    ).factor_reg


def test_unbalanced_weights_shrink_every_factor_away_and_balanced_ones_learn_interaction() -> None:
    data = stream(0, interaction=1.0)
    unbalanced_error, unbalanced_factors = fitted(data, None)
    balanced_error, balanced_factors = fitted(data, 1.0)
    assert unbalanced_factors < 1e-3  # the collapse: a trace norm of 2·√(1000·1) ≈ 63
    assert balanced_factors > 0.02
    assert balanced_error < 0.85 * unbalanced_error


@pytest.mark.parametrize("seed", [0, 1])
def test_on_low_rank_scores_the_choice_learns_factors_that_beat_the_bias_only_model(
    seed: int,
) -> None:
    data = stream(seed, interaction=1.0)
    chosen = choose(data)
    assert chosen is not None
    chosen_error, chosen_factors = fitted(data, chosen)
    bias_only_error, _ = fitted(data, None)
    assert chosen_factors > 0.02
    assert chosen_error < 0.8 * bias_only_error


def test_on_scores_without_interaction_or_memory_effects_the_choice_keeps_the_bias_only_model(
) -> None:
    rng = np.random.default_rng(3)
    query_idx = np.repeat(np.arange(N_QUERIES), PER_QUERY)
    memory_idx = np.concatenate([rng.choice(N_MEMORIES, PER_QUERY, replace=False)
                                 for _ in range(N_QUERIES)])
    # near-binary: a 10% chance of relevance, independent of the memory and the query
    scores = (rng.uniform(size=len(query_idx)) < 0.1).astype(np.float64)
    embeddings = rng.normal(size=(N_MEMORIES, DIM))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    choice = choose_factor_reg(memory_idx, query_idx, np.zeros(len(scores)), scores, embeddings,
                               options=DEFAULTS)
    assert choice.factor_reg is None
    assert choice.held_out_cells > 0
    assert choice.errors[None] == min(choice.errors.values())


def test_a_young_namespace_keeps_the_unbalanced_weights_without_trial_fits() -> None:
    data = stream(0, interaction=1.0, n_queries=MIN_QUERIES - 1)
    choice = choose_factor_reg(
        data.memory_idx, data.query_idx, np.zeros(len(data.scores)), data.scores,
        data.embeddings, options=DEFAULTS,
    )
    assert choice.factor_reg is None and choice.errors == {}


def test_a_ridge_with_a_weight_per_parameter_solves_the_dense_normal_equations() -> None:
    rng = np.random.default_rng(0)
    factors = rng.normal(size=(12, 3))
    scores = rng.uniform(size=12)
    other_bias = rng.normal(scale=0.1, size=12)
    diagonal = penalty(5.0, 0.5, 1, 3)
    bias, solved = solve_side(0.3, other_bias, factors, scores, diagonal)
    design = np.column_stack([np.ones(12), factors])
    expected = np.linalg.solve(design.T @ design + np.diag([5.0, 0.5, 0.5, 0.5]),
                               design.T @ (scores - 0.3 - other_bias))
    np.testing.assert_allclose(np.r_[bias, solved], expected, atol=1e-12)
    assert penalty(5.0, None, 1, 3) == 5.0  # one weight for all without a factor weight
