"""Slow, obvious dense ALS: the yardstick the fast ``BiasedALS`` (reference_als.py) and the
service's batched ridge solves are tested against.

Deliberately written differently from the fast path: dense masked matrices instead of COO cells,
one Python loop iteration per row, and each ridge problem solved as an ordinary least-squares
problem on the augmented system [X; √reg·I] θ ≈ [y; 0] with ``np.linalg.lstsq`` (no normal
equations, no padding, no batching). Agreement of the two therefore checks the grouping, the
padding and the batched normal-equation solves, not just a re-run of the same code.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.completion.ridge import INIT_SCALE
from tests.unit.completion.reference_als import BiasedALS, FactorModel

__all__ = ["dense_als", "dense_ridge"]


def dense_ridge(
    other_factors: NDArray[np.float64], target: NDArray[np.float64], reg: float
) -> tuple[float, NDArray[np.float64]]:
    """argmin_θ ‖[1, F] θ − y‖² + reg‖θ‖², via lstsq on the augmented system; θ = (bias, factor)."""
    n, rank = other_factors.shape
    design = np.hstack([np.ones((n, 1)), other_factors])
    augmented = np.vstack([design, np.sqrt(reg) * np.eye(rank + 1)])
    rhs = np.concatenate([target, np.zeros(rank + 1)])
    theta = np.linalg.lstsq(augmented, rhs, rcond=None)[0]
    return float(theta[0]), theta[1:]


def dense_als(
    memory_idx: NDArray[np.intp],
    query_idx: NDArray[np.intp],
    scores: NDArray[np.float64],
    n_memories: int,
    n_queries: int,
    als: BiasedALS,
    start: FactorModel | None = None,
) -> FactorModel:
    """Dense ALS with the hyperparameters (rank, reg, iterations, seed), initialisation and
    update order of ``als``.

    Cold start draws memory then query factors as INIT_SCALE * default_rng(seed).standard_normal;
    ``start`` overrides that with an explicit starting model (its μ is ignored: μ is the mean of
    the scores). Each (memory, query) pair may appear at most once (a dense matrix has one cell).
    """
    rank, reg = als.rank, als.reg
    observed = np.zeros((n_memories, n_queries), dtype=bool)
    matrix = np.zeros((n_memories, n_queries))
    for m, q, s in zip(memory_idx, query_idx, scores, strict=True):
        if observed[m, q]:
            raise ValueError(f"duplicate cell ({m}, {q}): the dense reference needs distinct cells")
        observed[m, q] = True
        matrix[m, q] = s
    mu = float(np.mean(scores)) if len(scores) else 0.0

    if start is None:
        rng = np.random.default_rng(als.seed)
        memory_factors = INIT_SCALE * rng.standard_normal((n_memories, rank))
        query_factors = INIT_SCALE * rng.standard_normal((n_queries, rank))
        memory_bias = np.zeros(n_memories)
        query_bias = np.zeros(n_queries)
    else:
        memory_factors = start.memory_factors.copy()
        query_factors = start.query_factors.copy()
        memory_bias = start.memory_bias.copy()
        query_bias = start.query_bias.copy()

    for _ in range(als.n_iterations):
        for m in range(n_memories):
            cols = np.flatnonzero(observed[m])
            target = matrix[m, cols] - mu - query_bias[cols]
            memory_bias[m], memory_factors[m] = dense_ridge(query_factors[cols], target, reg)
        for q in range(n_queries):
            rows = np.flatnonzero(observed[:, q])
            target = matrix[rows, q] - mu - memory_bias[rows]
            query_bias[q], query_factors[q] = dense_ridge(memory_factors[rows], target, reg)

    return FactorModel(
        mu=mu,
        memory_bias=memory_bias,
        memory_factors=memory_factors,
        query_bias=query_bias,
        query_factors=query_factors,
    )
