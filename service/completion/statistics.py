"""Sufficient statistics of memory rows: the online re-solve at a cost independent of history.

With the query side fixed, memory row m's ridge problem (see :mod:`service.completion.ridge`) is

    (Σ_i x_i x_iᵀ + reg·I) θ_m = Σ_i x_i (s_i − o_i − μ),     x_i = [1, v_q(i)],

over its observed cells i, with o_i the cell's known offset (the query's bias, similarity slope
and the content prior). Both sums are additive over cells, and μ only enters through
Σ_i x_i, the Gram matrix's first column (x_i's first entry is 1). So a row keeps

    gram   = Σ_i x_i x_iᵀ          ((r+1)x(r+1), symmetric; its [0, 0] is the cell count)
    moment = Σ_i x_i (s_i − o_i)   ((r+1),)

adds each new cell's terms as it is observed, and re-solves in O(r³) whatever its history, with
the current μ. The statistics are valid while the query side they were built with stays; a full
refit (which moves every query) rebuilds them.

Stored packed: the Gram's upper triangle, row-major (``np.triu_indices``), then the moment.
Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion.validation import (
    check_length,
    finite_scalar,
    float_array,
    index_array,
    ridge_diagonal,
    side_arrays,
)

__all__ = [
    "RowObservations",
    "RowStatistics",
    "packed_length",
    "row_statistics",
    "solve_from_statistics",
]

#: Cells whose outer products are formed at once (each is (r+1)² float64): a few MB at rank 8,
#: so a refit's million cells never hold their outer products all at once.
_CHUNK_CELLS = 16_384


def packed_length(rank: int) -> int:
    """Floats per packed row: the Gram's upper triangle and the moment."""
    size = rank + 1
    return size * (size + 1) // 2 + size


@dataclass(frozen=True, eq=False)
class RowStatistics:
    """Per row: ``gram`` (n, r+1, r+1) and ``moment`` (n, r+1), as in the module docstring."""

    gram: NDArray[np.float64]
    moment: NDArray[np.float64]

    @property
    def counts(self) -> NDArray[np.int64]:
        """Cells per row (the Gram's [0, 0]: each cell adds 1·1)."""
        return np.rint(self.gram[:, 0, 0]).astype(np.int64)

    @classmethod
    def zeros(cls, n_rows: int, rank: int) -> RowStatistics:
        return cls(np.zeros((n_rows, rank + 1, rank + 1)), np.zeros((n_rows, rank + 1)))

    def __add__(self, other: RowStatistics) -> RowStatistics:
        return RowStatistics(self.gram + other.gram, self.moment + other.moment)

    def packed(self) -> NDArray[np.float64]:
        """(n, packed_length(r)) rows for storage."""
        upper = np.triu_indices(self.gram.shape[1])
        return np.hstack([self.gram[:, upper[0], upper[1]], self.moment])

    @classmethod
    def unpack(cls, packed: ArrayLike, rank: int) -> RowStatistics:
        rows = float_array("packed", packed, ndim=2)
        if rows.shape[1] != packed_length(rank):
            raise ValueError(
                f"packed statistics have {rows.shape[1]} columns; rank {rank} needs "
                f"{packed_length(rank)}"
            )
        size = rank + 1
        upper = np.triu_indices(size)
        n_upper = len(upper[0])
        gram = np.zeros((rows.shape[0], size, size))
        gram[:, upper[0], upper[1]] = rows[:, :n_upper]
        gram[:, upper[1], upper[0]] = rows[:, :n_upper]
        return cls(gram, rows[:, n_upper:].copy())


def row_statistics(
    row_idx: ArrayLike,
    n_rows: int,
    scores: ArrayLike,
    other_offsets: ArrayLike,
    other_factors: ArrayLike,
    chunk_cells: int = _CHUNK_CELLS,
) -> RowStatistics:
    """The statistics of ``n_rows`` rows from their cells: cell i lies in row ``row_idx[i]``,
    has score ``scores[i]``, offset ``other_offsets[i]`` and the other side's factor
    ``other_factors[i]``. Rows without cells get zeros. ``chunk_cells``: cells whose outer
    products are formed at once."""
    offsets, factors = side_arrays("other_offsets", other_offsets, "other_factors", other_factors)
    values = float_array("scores", scores, ndim=1)
    check_length("scores", values, factors.shape[0], "other_factors")
    rows = index_array("row_idx", row_idx, n_rows, "n_rows")
    check_length("row_idx", rows, values.shape[0], "scores")
    rank = factors.shape[1]
    result = RowStatistics.zeros(n_rows, rank)
    design = np.empty((len(values), rank + 1))
    design[:, 0] = 1.0
    design[:, 1:] = factors
    np.add.at(result.moment, rows, design * (values - offsets)[:, None])
    # Cells sorted by row, so each chunk's outer products reduce to one sum per run of a row.
    order = np.argsort(rows, kind="stable")
    for start in range(0, len(order), chunk_cells):
        chunk = order[start:start + chunk_cells]
        chunk_rows = rows[chunk]
        starts = np.flatnonzero(np.r_[True, chunk_rows[1:] != chunk_rows[:-1]])
        products = np.einsum("ij,ik->ijk", design[chunk], design[chunk])
        result.gram[chunk_rows[starts]] += np.add.reduceat(products, starts, axis=0)
    return result


def solve_from_statistics(
    mu: float, statistics: RowStatistics, reg: float | NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each row's ridge solution (bias (n,), factors (n, r)) from its statistics, with mean
    ``mu``: the same as :func:`~service.completion.ridge.solve_rows_batch` over the cells the
    statistics were built from. Rows without cells get (0, zeros)."""
    mu_ = finite_scalar("mu", mu)
    size = statistics.gram.shape[1]
    lam = np.diag(ridge_diagonal(reg, size))
    rhs = statistics.moment - mu_ * statistics.gram[:, :, 0]
    theta = np.linalg.solve(statistics.gram + lam, rhs[:, :, None])[:, :, 0]
    return theta[:, 0].astype(np.float64), theta[:, 1:].astype(np.float64)


@dataclass(frozen=True)
class RowObservations:
    """Observations of some memory rows (by memory id), each with the observing query's
    parameters: what a row's statistics are built from."""

    memory_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray
    query_bias: np.ndarray
    query_slope: np.ndarray
    query_factors: np.ndarray
    prior_offsets: np.ndarray  # the content prior's γ·cos + e_m·w of each cell

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (
            self.memory_ids, self.similarities, self.scores, self.query_bias, self.query_slope,
            self.query_factors, self.prior_offsets,
        )

    def subset(self, keep: np.ndarray) -> RowObservations:
        return RowObservations(*(np.asarray(values)[keep] for values in self._columns()))

    def join(self, other: RowObservations) -> RowObservations:
        """These observations and ``other``'s."""
        return RowObservations(
            *(np.concatenate([mine, theirs]) for mine, theirs in
              zip(self._columns(), other._columns(), strict=True))
        )

    def statistics(self, memory_ids: np.ndarray) -> RowStatistics:
        """The sufficient statistics of the rows of ``memory_ids`` (ascending, holding every
        memory observed here) from these observations: each cell's c_q + β_q·cos(q, m) +
        p(q, m) is its known offset, the query side being fixed."""
        return row_statistics(
            np.searchsorted(memory_ids, self.memory_ids),
            len(memory_ids),
            self.scores,
            self.query_bias + self.query_slope * self.similarities + self.prior_offsets,
            self.query_factors,
        )
