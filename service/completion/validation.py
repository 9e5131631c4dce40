"""The completion core's input checks, shared by the model, its references and the statistics.

Every public function of the core funnels its arguments through these, so a bad value fails
loudly at the boundary (:class:`ModelFitError`, naming the argument) instead of surfacing as NaN
estimates three calls later.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "ModelFitError",
    "check_length",
    "coo_cells",
    "finite_scalar",
    "first_index",
    "float_array",
    "index_array",
    "non_negative_int",
    "positive_reg",
    "side_arrays",
    "unit_scores",
]


class ModelFitError(ValueError):
    """Input the completion core cannot use: NaN/inf, scores outside [0, 1], index out of range,
    mismatched shapes, or a non-positive regularisation weight."""

    code = "model_fit_error"


def non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise ModelFitError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def finite_scalar(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ModelFitError(f"{name} must be a real number, got {value!r}")
    result = float(value)
    if not np.isfinite(result):
        raise ModelFitError(f"{name} must be finite, got {result}")
    return result


def positive_reg(reg: object) -> float:
    value = finite_scalar("reg", reg)
    # reg > 0 is what makes every (r+1)x(r+1) system positive definite, hence solvable even for
    # a row with a single observation or all-zero factors.
    if value <= 0.0:
        raise ModelFitError(f"reg must be > 0, got {value}")
    return value


def ridge_diagonal(reg: float | ArrayLike, size: int) -> NDArray[np.float64]:
    """``reg`` as the diagonal of a ``size`` × ``size`` ridge: one value for every entry, or
    one per entry (a row's bias and factors may be penalised apart); each > 0."""
    if np.ndim(reg) == 0:
        return np.full(size, positive_reg(reg))
    diagonal = float_array("reg", reg, ndim=1)
    check_length("reg", diagonal, size, "the row's parameters")
    if not np.all(diagonal > 0.0):
        raise ModelFitError(f"reg must be > 0, got {diagonal.min()}")
    return diagonal


def first_index(mask: NDArray[np.bool_]) -> int:
    """The position of the first true entry (the caller knows there is one)."""
    return int(np.flatnonzero(mask)[0])


def float_array(name: str, values: ArrayLike, ndim: int) -> NDArray[np.float64]:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ModelFitError(f"{name} must be numeric: {exc}") from exc
    if array.ndim != ndim:
        raise ModelFitError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0]
        where = int(bad[0]) if ndim == 1 else tuple(int(b) for b in bad)
        raise ModelFitError(f"{name} contains a non-finite value at {where}")
    return array


def check_length(name: str, array: NDArray[np.generic], expected: int, other: str) -> None:
    if array.shape[0] != expected:
        raise ModelFitError(f"{name} has length {array.shape[0]} but {other} has length {expected}")


def unit_scores(name: str, values: ArrayLike) -> NDArray[np.float64]:
    """Finite scores in [0, 1], 1-D."""
    scores = float_array(name, values, ndim=1)
    outside = (scores < 0.0) | (scores > 1.0)
    if np.any(outside):
        i = first_index(outside)
        raise ModelFitError(f"{name}[{i}] = {scores[i]} is outside [0, 1]")
    return scores


def index_array(name: str, values: ArrayLike, bound: int, bound_name: str) -> NDArray[np.intp]:
    """1-D integer indices in ``0 .. bound - 1``."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ModelFitError(f"{name} must be 1-D, got shape {array.shape}")
    # An empty list arrives as float64; anything non-empty must really be integers (a float index
    # usually means columns were swapped by the caller).
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ModelFitError(f"{name} must have an integer dtype, got {array.dtype}")
    array = array.astype(np.intp, copy=False)
    outside = (array < 0) | (array >= bound)
    if np.any(outside):
        i = first_index(outside)
        raise ModelFitError(f"{name}[{i}] = {array[i]} is out of range for {bound_name}={bound}")
    return array


def coo_cells(
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    scores: ArrayLike,
    n_memories: int,
    n_queries: int,
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.float64]]:
    """Validate COO triplets (memory row, query column, score)."""
    s = unit_scores("scores", scores)
    m = index_array("memory_idx", memory_idx, n_memories, "n_memories")
    q = index_array("query_idx", query_idx, n_queries, "n_queries")
    check_length("memory_idx", m, s.shape[0], "scores")
    check_length("query_idx", q, s.shape[0], "scores")
    return m, q, s


def side_arrays(
    bias_name: str,
    bias: ArrayLike,
    factors_name: str,
    factors: ArrayLike,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate one side's (bias (n,), factors (n, r)) pair."""
    f = float_array(factors_name, factors, ndim=2)
    b = float_array(bias_name, bias, ndim=1)
    check_length(bias_name, b, f.shape[0], factors_name)
    return b, f
