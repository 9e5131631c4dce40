"""Per-row ridge solves: the building block of the completion model and its references.

With one side of the bias-aware low-rank model fixed (see :mod:`service.completion.model`), the
squared loss splits into independent ridge problems, one per row of the other side, over that
row's observed cells only: design matrix [1, other_factors], target score − μ − other_bias
(the other side's bias plus any known per-cell offset), an (r+1)x(r+1) system. The same solve
folds in a new query from its anchors with the memory side fixed ("causal" completion,
docs/design.md "Causal completion and online learning").

Pure numpy; bad input raises :class:`~service.completion.validation.ModelFitError`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion._grouped import group_rows, solve_groups
from service.completion.validation import (
    ModelFitError,
    check_length,
    finite_scalar,
    first_index,
    index_array,
    non_negative_int,
    ridge_diagonal,
    side_arrays,
    unit_scores,
)

__all__ = [
    "INIT_SCALE",
    "Ridge",
    "leave_one_out_predictions",
    "penalty",
    "predict_scores",
    "solve_rows_batch",
    "solve_side",
]

#: A row's ridge penalty: one weight for all its parameters, or one per parameter (the bias
#: first, then each column of the other side's factors), as :func:`ridge_diagonal` reads it.
Ridge = float | NDArray[np.float64]

def penalty(lead_reg: float, factor_reg: float | None, lead: int, rank: int) -> Ridge:
    """The ridge of a row whose ``lead`` first parameters (its bias, and a query's similarity
    slope) are weighted ``lead_reg`` and whose ``rank`` factors ``factor_reg``; one weight for
    all without ``factor_reg``."""
    if factor_reg is None:
        return lead_reg
    return np.concatenate([np.full(lead, lead_reg), np.full(rank, factor_reg)])


#: Standard deviation of the seeded initial factors. Small, so the first half-step is driven by
#: the biases, but non-zero: all-zero factors are a fixed point of ALS (the bias-only solution).
INIT_SCALE = 0.1


def predict_scores(
    mu: float,
    memory_bias: ArrayLike,
    memory_factors: ArrayLike,
    query_bias: float,
    query_factor: ArrayLike,
) -> NDArray[np.float64]:
    """ŝ = μ + b_m + c_q + u_m·v_q for many memories and one query, clipped to [0, 1].

    Clipping is part of the model (scores live in [0, 1]); the fit itself uses unclipped values.
    """
    b = np.asarray(memory_bias, dtype=np.float64)
    u = np.asarray(memory_factors, dtype=np.float64)
    v = np.asarray(query_factor, dtype=np.float64)
    if u.ndim != 2 or b.ndim != 1 or v.ndim != 1:
        raise ModelFitError(
            "expected memory_bias (n,), memory_factors (n, r), query_factor (r,); got "
            f"{b.shape}, {u.shape}, {v.shape}"
        )
    check_length("memory_bias", b, u.shape[0], "memory_factors")
    if v.shape[0] != u.shape[1]:
        raise ModelFitError(
            f"query_factor has rank {v.shape[0]} but memory_factors has rank {u.shape[1]}"
        )
    raw = finite_scalar("mu", mu) + finite_scalar("query_bias", query_bias) + b + u @ v
    if not np.all(np.isfinite(raw)):
        position = first_index(~np.isfinite(raw))
        raise ModelFitError(f"non-finite prediction for memory position {position}")
    return np.clip(raw, 0.0, 1.0)


def solve_side(
    mu: float,
    other_bias: ArrayLike,
    other_factors: ArrayLike,
    scores: ArrayLike,
    reg: Ridge,
) -> tuple[float, NDArray[np.float64]]:
    """Ridge solve of one row's (bias, factor) from its observed cells, the other side fixed.

    Minimises Σ_i (scores_i − μ − other_bias_i − [1, other_factors_i]·θ)² + reg·‖θ‖² over
    θ = (bias, factor) via the (r+1)x(r+1) normal equations. ``reg > 0`` keeps the system positive
    definite, so one observation, all-equal scores or all-zero factors still give a finite,
    unique answer; no observations give (0.0, zeros(r)). Serves both sides of the ALS and the
    fold-in of a new query.
    """
    mu_ = finite_scalar("mu", mu)
    b, f = side_arrays("other_bias", other_bias, "other_factors", other_factors)
    s = unit_scores("scores", scores)
    check_length("scores", s, f.shape[0], "other_factors")
    n, rank = f.shape
    lam = np.diag(ridge_diagonal(reg, rank + 1))
    if n == 0:
        return 0.0, np.zeros(rank)
    design = np.empty((n, rank + 1))
    design[:, 0] = 1.0
    design[:, 1:] = f
    target = s - mu_ - b
    theta = np.linalg.solve(design.T @ design + lam, design.T @ target)
    # astype copies (not a view of theta) and states the dtype numpy's stubs lose in
    # linalg.solve (typed floating[Any]; float64 in, float64 out).
    return float(theta[0]), theta[1:].astype(np.float64)


def leave_one_out_predictions(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_scores: ArrayLike,
    reg: Ridge,
) -> NDArray[np.float64]:
    """For each anchor, ŝ predicted by a fold-in from the *other* anchors, clipped to [0, 1].

    This is the prequential check of the completion model: each observed score is compared with
    what the model would have estimated had that cell not been scored. Closed form for ridge:
    with hat matrix H = X (XᵀX + λI)⁻¹ Xᵀ, the left-out residual is eᵢ / (1 − Hᵢᵢ), so all n
    predictions cost one (r+1)x(r+1) solve instead of n.
    """
    mu_ = finite_scalar("mu", mu)
    b, f = side_arrays(
        "anchor_memory_bias", anchor_memory_bias, "anchor_memory_factors", anchor_memory_factors
    )
    s = unit_scores("anchor_scores", anchor_scores)
    check_length("anchor_scores", s, f.shape[0], "anchor_memory_factors")
    n, rank = f.shape
    lam = np.diag(ridge_diagonal(reg, rank + 1))
    if n == 0:
        return np.zeros(0)
    design = np.empty((n, rank + 1))
    design[:, 0] = 1.0
    design[:, 1:] = f
    target = s - mu_ - b
    gram_inverse = np.linalg.inv(design.T @ design + lam)
    leverage: NDArray[np.float64] = np.einsum("ij,jk,ik->i", design, gram_inverse, design)
    residual = target - design @ (gram_inverse @ (design.T @ target))
    # λ > 0 keeps every leverage strictly below 1.
    left_out_residual = residual / (1.0 - leverage)
    return np.clip(s - left_out_residual, 0.0, 1.0)


def solve_rows_batch(
    mu: float,
    row_idx: ArrayLike,
    other_idx: ArrayLike,
    scores: ArrayLike,
    other_bias: ArrayLike,
    other_factors: ArrayLike,
    reg: Ridge,
    n_rows: int | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """:func:`solve_side` for many rows at once, vectorised (the ALS half-step).

    Cells are COO pairs (row_idx[i], other_idx[i]) with score scores[i]; ``other_idx`` indexes
    ``other_bias``/``other_factors``. Returns (bias (n_rows,), factors (n_rows, r)); rows with
    no cells get (0, zeros). ``n_rows`` defaults to max(row_idx) + 1. For an online update of the
    rows a query touched, pass those rows' full observation history with compact row ids
    (``np.unique(rows, return_inverse=True)``) and copy the results back.
    Repeated (row, other) pairs are separate observations (each adds its own squared error).
    """
    mu_ = finite_scalar("mu", mu)
    b, f = side_arrays("other_bias", other_bias, "other_factors", other_factors)
    lam = ridge_diagonal(reg, f.shape[1] + 1)
    s = unit_scores("scores", scores)
    rows_raw = np.asarray(row_idx)
    if n_rows is None:
        n = int(rows_raw.max()) + 1 if rows_raw.size else 0
    else:
        n = non_negative_int("n_rows", n_rows)
    rows = index_array("row_idx", rows_raw, max(n, 0), "n_rows")
    other = index_array("other_idx", other_idx, f.shape[0], "len(other_factors)")
    check_length("row_idx", rows, s.shape[0], "scores")
    check_length("other_idx", other, s.shape[0], "scores")
    groups = group_rows(rows, other, s - mu_, n, f.shape[0])
    return solve_groups(groups, b, f, lam)
