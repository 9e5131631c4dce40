"""Similarity-aware completion: the bias-aware low-rank model with a per-query similarity slope
and a namespace-level content prior.

    ŝ(q, m) = μ + [γ · cos(q, m) + w · e_m] + b_m + c_q + β_q · cos(q, m) + u_m · v_q
              clipped to [0, 1]

Why the extra term: a new query's relevance is largely predicted by its embedding similarity to
each memory, and the plain model cannot see it (its only query-side information is the anchors'
scores). With β_q in the query side, the model's estimate for a memory without history
(b_m = 0, u_m = 0) *is* the similarity calibrated on this query's anchors, and the memory side
learns what similarity misses: b_m and u_m become the memory's offset from its calibrated
similarity, learned from earlier queries. With ``similarities = 0`` everywhere it is exactly the
plain model of :mod:`service.completion.model`.

Why the content prior p(q, m) = γ·cos(q, m) + w·e_m (e_m: the memory's unit embedding): a
query's 10–40 anchors cannot pin down its own similarity slope, and a memory's few noisy
observations cannot pin down its bias. Both are shared across the namespace: the judge rates
similar-looking memories alike (fact-bearing turns vs. small talk, say), which ``w`` learns from
every observation and carries to memories never scored, and ``γ`` is the slope every query
shrinks towards. β_q, b_m and u_m are then deviations from the prior, regularised towards it.
On the LoCoMo dev data the prior is what makes completion beat the anchors alone
(docs/benchmarks.md).

Built from the plain model's solvers: the slope is one more column of the query side's design
([1, cos, u_m]); the memory side sees c_q + β_q·cos(q, m) as a per-cell offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion.model import (
    INIT_SCALE,
    _cells,
    _count,
    _finite_scalar,
    _float_array,
    _length,
    leave_one_out_predictions,
    predict_scores,
    solve_rows_batch,
    solve_side,
)

__all__ = [
    "ContentPrior",
    "content_offsets",
    "QueryParameters",
    "SimilarityFactorModel",
    "fit_with_similarity",
    "fold_in_with_similarity",
    "leave_one_out_with_similarity",
    "predict_with_similarity",
]


@dataclass(frozen=True)
class QueryParameters:
    """One query's side of the model."""

    bias: float
    slope: float
    factors: NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class ContentPrior:
    """The namespace-level term γ·cos(q, m) + w·e_m, a known per-cell offset to everything
    per-query or per-memory. ``weights`` is empty before the first refit (no prior)."""

    slope: float
    weights: NDArray[np.float64]  # (d,) or (0,)

    @classmethod
    def empty(cls) -> ContentPrior:
        return cls(0.0, np.zeros(0))

    def offsets(self, similarities: ArrayLike, content_scores: ArrayLike) -> NDArray[np.float64]:
        return content_offsets(self.slope, similarities, content_scores)


def content_offsets(
    slope: float, similarities: ArrayLike, content_scores: ArrayLike
) -> NDArray[np.float64]:
    """p(q, m) = γ·cos(q, m) + e_m·w per cell, from each cell's cosine and its memory's e_m·w
    (``content_scores``, computed where the embeddings are, e.g. in SQL)."""
    return slope * np.asarray(similarities, dtype=np.float64) + np.asarray(
        content_scores, dtype=np.float64
    )


def solve_content_prior(
    memory_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    residuals: NDArray[np.float64],
    gram_factor: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64],
) -> ContentPrior:
    """Ridge solve of (γ, w) against per-cell residuals, given the factorised normal matrix of
    :func:`content_gram` (it does not change across ALS iterations)."""
    n_m = memory_embeddings.shape[0]
    rhs = np.concatenate(
        [[similarities @ residuals], memory_embeddings.T @ np.bincount(memory_idx, residuals, n_m)]
    )
    theta = np.linalg.solve(gram_factor.T, np.linalg.solve(gram_factor, rhs))
    # No copy (copy=False): only states the dtype numpy's stubs lose in linalg.solve
    # (typed floating[Any]; float64 in, float64 out).
    return ContentPrior(float(theta[0]), theta[1:].astype(np.float64, copy=False))


def content_gram(
    memory_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64],
    slope_reg: float,
    content_reg: float,
) -> NDArray[np.float64]:
    """Lower Cholesky factor of the ridge normal matrix of the features [cos, e_m] over all cells,
    built per memory (Σ_cells e_m e_mᵀ = Eᵀ diag(n_m) E), never per cell."""
    n_m, d = memory_embeddings.shape
    counts = np.bincount(memory_idx, minlength=n_m).astype(np.float64)
    gram = np.empty((d + 1, d + 1))
    gram[0, 0] = similarities @ similarities + slope_reg
    gram[0, 1:] = gram[1:, 0] = memory_embeddings.T @ np.bincount(memory_idx, similarities, n_m)
    gram[1:, 1:] = (memory_embeddings.T * counts) @ memory_embeddings + content_reg * np.eye(d)
    return np.linalg.cholesky(gram)


def _with_similarity(similarities: NDArray[np.float64], factors: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.column_stack([similarities, factors])


def fold_in_with_similarity(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_similarities: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
    min_slope: float = 1e-3,
) -> QueryParameters:
    """Causal fold-in of a new query: (c_q, β_q, v_q) by ridge over its anchors, memory side fixed.

    The slope is floored at ``min_slope``: among memories the model knows nothing about, the
    estimate must never reverse the semantic order (a few noisy anchors can fit a negative slope).
    With the floor active, (c_q, v_q) are re-solved for the fixed slope.
    """
    bias = _float_array("anchor_memory_bias", anchor_memory_bias, ndim=1)
    factors = _float_array("anchor_memory_factors", anchor_memory_factors, ndim=2)
    sims = _float_array("anchor_similarities", anchor_similarities, ndim=1)
    _length("anchor_similarities", sims, factors.shape[0], "anchor_memory_factors")
    query_bias, theta = solve_side(mu, bias, _with_similarity(sims, factors), anchor_scores, reg)
    slope, query_factors = float(theta[0]), theta[1:]
    if slope < min_slope:
        slope = float(min_slope)
        query_bias, query_factors = solve_side(mu, bias + slope * sims, factors, anchor_scores, reg)
    return QueryParameters(float(query_bias), slope, query_factors)


def predict_with_similarity(
    mu: float,
    memory_bias: ArrayLike,
    memory_factors: ArrayLike,
    similarities: ArrayLike,
    query: QueryParameters,
) -> NDArray[np.float64]:
    """ŝ for many memories and one query, clipped to [0, 1]."""
    bias = _float_array("memory_bias", memory_bias, ndim=1)
    sims = _float_array("similarities", similarities, ndim=1)
    _length("similarities", sims, bias.shape[0], "memory_bias")
    return predict_scores(mu, bias + query.slope * sims, memory_factors, query.bias, query.factors)


def leave_one_out_with_similarity(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_similarities: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
) -> NDArray[np.float64]:
    """Each anchor's estimate from a fold-in over the other anchors (unfloored slope)."""
    factors = _float_array("anchor_memory_factors", anchor_memory_factors, ndim=2)
    sims = _float_array("anchor_similarities", anchor_similarities, ndim=1)
    return leave_one_out_predictions(
        mu, anchor_memory_bias, _with_similarity(sims, factors), anchor_scores, reg
    )


@dataclass(frozen=True, eq=False)
class SimilarityFactorModel:
    mu: float
    memory_bias: NDArray[np.float64]
    memory_factors: NDArray[np.float64]
    query_bias: NDArray[np.float64]
    query_slope: NDArray[np.float64]
    query_factors: NDArray[np.float64]
    prior: ContentPrior


# Over 60 lines on purpose: checks, initialisation and one ALS loop over shared arrays, read top
# to bottom like the module (issue #13 keeps completion/ a leaf, unchanged but for this note).
def fit_with_similarity(
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    similarities: ArrayLike,
    scores: ArrayLike,
    n_memories: int,
    n_queries: int,
    *,
    rank: int,
    reg: float,
    n_iterations: int,
    seed: int = 0,
    memory_embeddings: ArrayLike | None = None,
    content_reg: float = 100.0,
    memory_reg: float | None = None,
) -> SimilarityFactorModel:
    """Full refit by ALS over observed cells (COO triplets with each cell's cosine similarity).

    Each half-step is the exact ridge minimiser of its block, solved per observation with
    :func:`solve_rows_batch` (the other side's parameters enter per cell, because the
    similarity term differs per cell). The query side is solved last, so every stored query's
    parameters match the final memory side. Seeded, so a refit is reproducible.

    With ``memory_embeddings`` ((n_memories, d) unit vectors) each iteration first solves the
    content prior (γ, w) against what the rest of the model leaves unexplained (γ penalised by
    ``reg``, w by ``content_reg``); without, the prior stays empty. The memory side (b_m, u_m)
    is regularised by ``memory_reg`` (default ``reg``).
    """
    n_m = _count("n_memories", n_memories)
    n_q = _count("n_queries", n_queries)
    m, q, s = _cells(memory_idx, query_idx, scores, n_m, n_q)
    sims = _float_array("similarities", similarities, ndim=1)
    _length("similarities", sims, s.shape[0], "scores")
    reg_ = _finite_scalar("reg", reg)
    memory_reg_ = reg_ if memory_reg is None else _finite_scalar("memory_reg", memory_reg)
    mu = float(s.mean()) if s.size else 0.0
    cells = np.arange(s.shape[0])
    rng = np.random.default_rng(seed)
    memory_bias = np.zeros(n_m)
    memory_factors = INIT_SCALE * rng.standard_normal((n_m, rank))
    query_bias, query_slope, query_factors = np.zeros(n_q), np.zeros(n_q), np.zeros((n_q, rank))
    prior = ContentPrior.empty()
    offsets = np.zeros(s.shape[0])
    if memory_embeddings is not None:
        embeddings = _float_array("memory_embeddings", memory_embeddings, ndim=2)
        _length("memory_embeddings", embeddings, n_m, "n_memories")
        gram_factor = content_gram(
            m, sims, embeddings, reg_, _finite_scalar("content_reg", content_reg)
        )

    def solve_queries() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return solve_rows_batch(
            mu,
            q,
            cells,
            s,
            memory_bias[m] + offsets,
            _with_similarity(sims, memory_factors[m]),
            reg_,
            n_rows=n_q,
        )

    for _ in range(n_iterations):
        if memory_embeddings is not None:
            explained = (
                memory_bias[m]
                + query_bias[q]
                + query_slope[q] * sims
                + np.einsum("ij,ij->i", memory_factors[m], query_factors[q])
            )
            prior = solve_content_prior(m, sims, s - mu - explained, gram_factor, embeddings)
            offsets = prior.offsets(sims, (embeddings @ prior.weights)[m])
        query_bias, theta = solve_queries()
        query_slope, query_factors = theta[:, 0], theta[:, 1:]
        memory_bias, memory_factors = solve_rows_batch(
            mu,
            m,
            cells,
            s,
            query_bias[q] + query_slope[q] * sims + offsets,
            query_factors[q],
            memory_reg_,
            n_rows=n_m,
        )
    query_bias, theta = solve_queries()
    return SimilarityFactorModel(
        mu=mu,
        memory_bias=memory_bias,
        memory_factors=memory_factors,
        query_bias=query_bias,
        query_slope=theta[:, 0],
        query_factors=theta[:, 1:],
        prior=prior,
    )
