"""The completion model the service runs: the bias-aware low-rank model with a per-query
similarity slope and a namespace-level content prior (docs/design.md "The completion model").

    ŝ(q, m) = μ + [γ · cos(q, m) + w · e_m] + b_m + c_q + β_q · cos(q, m) + u_m · v_q
              clipped to [0, 1]

Why the slope: a new query's relevance is largely predicted by its embedding similarity to
each memory, and the plain model (tests/unit/completion/reference_als.py) cannot see it (its
only query-side information is the anchors' scores). With β_q in the query side, the model's
estimate for a memory without history (b_m = 0, u_m = 0) *is* the similarity calibrated on this
query's anchors, and the memory side learns what similarity misses: b_m and u_m become the
memory's offset from its calibrated similarity, learned from earlier queries. With
``similarities = 0`` everywhere and no embeddings it is exactly the plain model.

Why the content prior p(q, m) = γ·cos(q, m) + w·e_m (e_m: the memory's unit embedding): a
query's 10–40 anchors cannot pin down its own similarity slope, and a memory's few noisy
observations cannot pin down its bias. Both are shared across the namespace: the judge rates
similar-looking memories alike (fact-bearing turns vs. small talk, say), which ``w`` learns from
every observation and carries to memories never scored, and ``γ`` is the slope every query
shrinks towards. β_q, b_m and u_m are then deviations from the prior, regularised towards it.
On the LoCoMo dev data the prior is what makes completion beat the anchors alone
(docs/benchmarks.md).

Built from the per-row ridge solves of :mod:`service.completion.ridge`: the slope is one more
column of the query side's design ([1, cos, u_m]); the memory side sees c_q + β_q·cos(q, m) plus
the prior as a per-cell offset. Pure numpy, seeded, no I/O; bad input raises
:class:`~service.completion.validation.ModelFitError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion.prior import (
    ContentPrior,
    content_gram,
    content_offsets,
    solve_content_prior,
)
from service.completion.ridge import (
    INIT_SCALE,
    Ridge,
    leave_one_out_predictions,
    penalty,
    predict_scores,
    solve_rows_batch,
    solve_side,
)
from service.completion.validation import (
    check_length,
    coo_cells,
    finite_scalar,
    float_array,
    non_negative_int,
)

__all__ = [
    "CompletionModel",
    "ContentPrior",
    "QueryParameters",
    "content_offsets",
    "fit_model",
    "fold_in",
    "leave_one_out",
    "predict",
]


@dataclass(frozen=True)
class QueryParameters:
    """One query's side of the model."""

    bias: float
    slope: float
    factors: NDArray[np.float64]


def _with_similarity(
    similarities: NDArray[np.float64], factors: NDArray[np.float64]
) -> NDArray[np.float64]:
    return np.column_stack([similarities, factors])


def fold_in(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_similarities: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
    min_slope: float = 1e-3,
    factor_reg: float | None = None,
) -> QueryParameters:
    """Causal fold-in of a new query: (c_q, β_q, v_q) by ridge over its anchors, memory side fixed
    (c_q and β_q weighted ``reg``, v_q ``factor_reg``; all ``reg`` without it).

    The slope is floored at ``min_slope``: among memories the model knows nothing about, the
    estimate must never reverse the semantic order (a few noisy anchors can fit a negative slope).
    With the floor active, (c_q, v_q) are re-solved for the fixed slope. A model given no
    similarities (all 0: the plain model) has no semantic order to keep, and its slope is 0.
    """
    bias = float_array("anchor_memory_bias", anchor_memory_bias, ndim=1)
    factors = float_array("anchor_memory_factors", anchor_memory_factors, ndim=2)
    sims = float_array("anchor_similarities", anchor_similarities, ndim=1)
    check_length("anchor_similarities", sims, factors.shape[0], "anchor_memory_factors")
    rank = factors.shape[1]
    query_bias, theta = solve_side(
        mu, bias, _with_similarity(sims, factors), anchor_scores,
        penalty(reg, factor_reg, 2, rank),
    )
    slope, query_factors = float(theta[0]), theta[1:]
    if slope < min_slope and np.any(sims):
        slope = float(min_slope)
        query_bias, query_factors = solve_side(
            mu, bias + slope * sims, factors, anchor_scores, penalty(reg, factor_reg, 1, rank)
        )
    return QueryParameters(float(query_bias), slope, query_factors)


def predict(
    mu: float,
    memory_bias: ArrayLike,
    memory_factors: ArrayLike,
    similarities: ArrayLike,
    query: QueryParameters,
) -> NDArray[np.float64]:
    """ŝ for many memories and one query, clipped to [0, 1]."""
    bias = float_array("memory_bias", memory_bias, ndim=1)
    sims = float_array("similarities", similarities, ndim=1)
    check_length("similarities", sims, bias.shape[0], "memory_bias")
    return predict_scores(mu, bias + query.slope * sims, memory_factors, query.bias, query.factors)


def leave_one_out(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_similarities: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
    factor_reg: float | None = None,
) -> NDArray[np.float64]:
    """Each anchor's estimate from a fold-in over the other anchors (unfloored slope)."""
    factors = float_array("anchor_memory_factors", anchor_memory_factors, ndim=2)
    sims = float_array("anchor_similarities", anchor_similarities, ndim=1)
    return leave_one_out_predictions(
        mu, anchor_memory_bias, _with_similarity(sims, factors), anchor_scores,
        penalty(reg, factor_reg, 2, factors.shape[1]),
    )


@dataclass(frozen=True, eq=False)
class CompletionModel:
    """A namespace's fitted model (memories and queries by dense index)."""

    mu: float
    memory_bias: NDArray[np.float64]
    memory_factors: NDArray[np.float64]
    query_bias: NDArray[np.float64]
    query_slope: NDArray[np.float64]
    query_factors: NDArray[np.float64]
    prior: ContentPrior



@dataclass(frozen=True, eq=False)
class _Cells:
    """A fit's validated observations, one entry per cell."""

    memory_idx: NDArray[np.intp]
    query_idx: NDArray[np.intp]
    similarities: NDArray[np.float64]
    scores: NDArray[np.float64]
    n_memories: int
    n_queries: int
    mu: float
    # 0 .. n-1: each cell's per-cell design row in solve_rows_batch (the other side's
    # parameters enter per cell, because the similarity term differs per cell)
    positions: NDArray[np.intp]


@dataclass(frozen=True, eq=False)
class _ContentFit:
    embeddings: NDArray[np.float64]  # (n_memories, d) unit vectors
    inverse_factor: NDArray[np.float64]  # of content_gram: fixed for the whole fit


@dataclass(eq=False)
class _Sides:
    """The parameters an ALS iteration updates in place of the previous ones."""

    memory_bias: NDArray[np.float64]
    memory_factors: NDArray[np.float64]
    query_bias: NDArray[np.float64]
    query_slope: NDArray[np.float64]
    query_factors: NDArray[np.float64]
    prior: ContentPrior
    offsets: NDArray[np.float64]  # the prior's offset per cell


def fit_model(
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
    factor_reg: float | None = None,
) -> CompletionModel:
    """Full refit by ALS over observed cells (COO triplets with each cell's cosine similarity).

    Each half-step is the exact ridge minimiser of its block, solved per observation with
    :func:`~service.completion.ridge.solve_rows_batch`. The query side is solved last, so every
    stored query's parameters match the final memory side. Seeded, so a refit is reproducible.

    With ``memory_embeddings`` ((n_memories, d) unit vectors) each iteration first solves the
    content prior (γ, w) against what the rest of the model leaves unexplained (γ penalised by
    ``reg``, w by ``content_reg``); without, the prior stays empty. The memory side (b_m, u_m)
    is regularised by ``memory_reg`` (default ``reg``). ``factor_reg`` weights both sides'
    factors (u_m, v_q) alike: unbalanced weights act on the product u_m·v_q like a trace norm
    of 2·√(memory_reg·reg), which at a large ``memory_reg`` shrinks every factor to zero.
    """
    cells = _observed_cells(memory_idx, query_idx, similarities, scores, n_memories, n_queries)
    lead_reg = finite_scalar("reg", reg)
    bias_reg = lead_reg if memory_reg is None else finite_scalar("memory_reg", memory_reg)
    factors_reg = None if factor_reg is None else finite_scalar("factor_reg", factor_reg)
    query_reg = penalty(lead_reg, factors_reg, 2, rank)
    memory_reg_ = penalty(bias_reg, factors_reg, 1, rank)
    sides = _initial_sides(cells, rank, seed)
    content = (
        None
        if memory_embeddings is None
        else _content_fit(cells, memory_embeddings, lead_reg, content_reg)
    )
    for _ in range(n_iterations):
        if content is not None:
            sides.prior, sides.offsets = _solve_prior(cells, content, sides)
        sides.query_bias, sides.query_slope, sides.query_factors = _solve_queries(
            cells, sides, query_reg
        )
        sides.memory_bias, sides.memory_factors = _solve_memories(cells, sides, memory_reg_)
    query_bias, query_slope, query_factors = _solve_queries(cells, sides, query_reg)
    return CompletionModel(
        mu=cells.mu,
        memory_bias=sides.memory_bias,
        memory_factors=sides.memory_factors,
        query_bias=query_bias,
        query_slope=query_slope,
        query_factors=query_factors,
        prior=sides.prior,
    )


def _observed_cells(
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    similarities: ArrayLike,
    scores: ArrayLike,
    n_memories: int,
    n_queries: int,
) -> _Cells:
    n_m = non_negative_int("n_memories", n_memories)
    n_q = non_negative_int("n_queries", n_queries)
    m, q, s = coo_cells(memory_idx, query_idx, scores, n_m, n_q)
    sims = float_array("similarities", similarities, ndim=1)
    check_length("similarities", sims, s.shape[0], "scores")
    mu = float(s.mean()) if s.size else 0.0
    return _Cells(m, q, sims, s, n_m, n_q, mu, np.arange(s.shape[0]))


def _initial_sides(cells: _Cells, rank: int, seed: int) -> _Sides:
    """Biases and the query side 0, the memory factors drawn from ``seed``: all-zero factors
    are a fixed point of ALS (the bias-only solution)."""
    rng = np.random.default_rng(seed)
    return _Sides(
        memory_bias=np.zeros(cells.n_memories),
        memory_factors=INIT_SCALE * rng.standard_normal((cells.n_memories, rank)),
        query_bias=np.zeros(cells.n_queries),
        query_slope=np.zeros(cells.n_queries),
        query_factors=np.zeros((cells.n_queries, rank)),
        prior=ContentPrior.empty(),
        offsets=np.zeros(cells.scores.shape[0]),
    )


def _content_fit(
    cells: _Cells, memory_embeddings: ArrayLike, slope_reg: float, content_reg: float
) -> _ContentFit:
    embeddings = float_array("memory_embeddings", memory_embeddings, ndim=2)
    check_length("memory_embeddings", embeddings, cells.n_memories, "n_memories")
    inverse_factor = content_gram(
        cells.memory_idx,
        cells.similarities,
        embeddings,
        slope_reg,
        finite_scalar("content_reg", content_reg),
    )
    return _ContentFit(embeddings, inverse_factor)


def _solve_prior(
    cells: _Cells, content: _ContentFit, sides: _Sides
) -> tuple[ContentPrior, NDArray[np.float64]]:
    """The content prior against what the rest of the model leaves unexplained, and its offset
    per cell."""
    m, q, sims = cells.memory_idx, cells.query_idx, cells.similarities
    explained = (
        sides.memory_bias[m]
        + sides.query_bias[q]
        + sides.query_slope[q] * sims
        + np.einsum("ij,ij->i", sides.memory_factors[m], sides.query_factors[q])
    )
    prior = solve_content_prior(
        m, sims, cells.scores - cells.mu - explained, content.inverse_factor, content.embeddings
    )
    return prior, prior.offsets(sims, (content.embeddings @ prior.weights)[m])


def _solve_queries(
    cells: _Cells, sides: _Sides, reg: Ridge
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Every query's (c_q, β_q, v_q), the memory side and the prior fixed."""
    m = cells.memory_idx
    query_bias, theta = solve_rows_batch(
        cells.mu,
        cells.query_idx,
        cells.positions,
        cells.scores,
        sides.memory_bias[m] + sides.offsets,
        _with_similarity(cells.similarities, sides.memory_factors[m]),
        reg,
        n_rows=cells.n_queries,
    )
    return query_bias, theta[:, 0], theta[:, 1:]


def _solve_memories(
    cells: _Cells, sides: _Sides, reg: Ridge
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Every memory's (b_m, u_m), the query side and the prior fixed."""
    q = cells.query_idx
    return solve_rows_batch(
        cells.mu,
        cells.memory_idx,
        cells.positions,
        cells.scores,
        sides.query_bias[q] + sides.query_slope[q] * cells.similarities + sides.offsets,
        sides.query_factors[q],
        reg,
        n_rows=cells.n_memories,
    )
