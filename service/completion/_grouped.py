"""Batched ridge solves for one side of the ALS: every row's (bias, factor) in a few numpy calls.

Why this layout: one ALS half-step needs, for every row i with observed cells C_i,

    (X_iᵀ X_i + reg·I) θ_i = X_iᵀ y_i,     X_i = [1, other_factors[C_i]],  y_i = target over C_i

Summing per-cell outer products with ``np.bincount``/``np.add.reduceat`` moves ~(r+1)²/2 floats per
cell through memory and is several times slower than letting BLAS do it. So cells are grouped by
row once per fit, rows of similar length are padded to a common width and stacked into chunks, and
each chunk's Gram matrices come from one batched ``matmul``. Padding cells point at an all-zero
sentinel column of the other side and carry a zero target, so they add exactly nothing to XᵀX or
Xᵀy: the result is the same as an unpadded solve, not an approximation. Chunks are capped at a
few tens of thousands of cells so the working set stays in cache and the scratch buffer is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Padded cells per chunk. ~32k cells x (rank + 2) float64 is a few MB: cache-resident for rank 8.
#: Read at call time (not bound as a default) so tests can shrink it to exercise chunk splitting.
CHUNK_CELLS = 32_768

#: Rows whose cell counts lie within lo .. lo + lo // _WIDTH_SLACK share one padded width, so
#: padding wastes at most ~25% (counts below 4 are never padded at all).
_WIDTH_SLACK = 4


@dataclass(frozen=True)
class _Chunk:
    rows: NDArray[np.intp]  # (B,) the rows this chunk solves
    other: NDArray[np.intp]  # (B, L) other-side index per slot; padding -> sentinel n_other
    ones: NDArray[np.float64]  # (B, L) the design's bias column: 1 for a real cell, 0 for padding
    centred: NDArray[np.float64]  # (B, L) score - mu per slot; 0 for padding


@dataclass(frozen=True)
class RowGroups:
    """Cells of one side grouped by row, padded and chunked; static for a whole fit."""

    n_rows: int
    n_other: int
    chunks: tuple[_Chunk, ...]
    max_chunk_cells: int


def group_rows(
    row_idx: NDArray[np.intp],
    other_idx: NDArray[np.intp],
    centred: NDArray[np.float64],
    n_rows: int,
    n_other: int,
    chunk_cells: int | None = None,
) -> RowGroups:
    """Group validated COO cells by ``row_idx`` into padded chunks (see module docstring).

    ``centred`` is score − μ per cell: μ is fixed for a fit, so it is folded in once here and each
    iteration only subtracts the other side's current bias.
    """
    cap = CHUNK_CELLS if chunk_cells is None else chunk_cells
    # Sort by row, then by the other index, so a row's gathers from the other side walk memory
    # in increasing order (better locality when the other side is large).
    if n_rows * (n_other + 1) < 2**62:
        # One int64 key sorts several times faster than lexsort on two keys.
        order = np.argsort(row_idx.astype(np.int64) * (n_other + 1) + other_idx)
    else:  # pragma: no cover - only for astronomically large index spaces
        order = np.lexsort((other_idx, row_idx))
    other_sorted = other_idx[order]
    centred_sorted = centred[order]
    counts = np.bincount(row_idx, minlength=n_rows)
    starts = np.zeros(n_rows + 1, dtype=np.intp)
    np.cumsum(counts, out=starts[1:])

    present = np.flatnonzero(counts)
    by_count = present[np.argsort(counts[present], kind="stable")]
    sorted_counts = counts[by_count]

    chunks: list[_Chunk] = []
    max_cells = 0
    i = 0
    while i < by_count.size:
        lo = int(sorted_counts[i])
        j = int(np.searchsorted(sorted_counts, lo + lo // _WIDTH_SLACK, side="right"))
        width = int(sorted_counts[j - 1])
        per_chunk = max(1, cap // width)
        slot = np.arange(width, dtype=np.intp)
        for s in range(i, j, per_chunk):
            rows = by_count[s : min(j, s + per_chunk)]
            real = slot[None, :] < counts[rows][:, None]
            # Padding slots read position 0 (any valid cell) and are then overwritten/masked.
            pos = np.where(real, starts[rows][:, None] + slot[None, :], 0)
            chunks.append(
                _Chunk(
                    rows=rows,
                    other=np.where(real, other_sorted[pos], n_other).astype(np.intp, copy=False),
                    ones=real.astype(np.float64),
                    centred=np.where(real, centred_sorted[pos], 0.0),
                )
            )
            max_cells = max(max_cells, rows.size * width)
        i = j
    return RowGroups(
        n_rows=n_rows, n_other=n_other, chunks=tuple(chunks), max_chunk_cells=max_cells
    )


def solve_groups(
    groups: RowGroups,
    other_bias: NDArray[np.float64],
    other_factors: NDArray[np.float64],
    reg: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Ridge-solve (bias, factor) of every row of ``groups`` with the other side fixed; ``reg``
    is the ridge's diagonal (the bias's weight, then each factor's).

    Rows without cells get bias 0 and zero factors (the ridge solution of an empty system).
    Inputs are assumed validated (finite, matching shapes, every reg > 0).
    """
    rank = other_factors.shape[1]
    k = rank + 1
    # Feature-major table of the other side (1-D takes per feature are the fastest gathers), plus
    # one all-zero sentinel column that every padding slot points at.
    table = np.zeros((k, groups.n_other + 1))
    table[:rank, : groups.n_other] = other_factors.T
    table[rank, : groups.n_other] = other_bias

    bias = np.zeros(groups.n_rows)
    factors = np.zeros((groups.n_rows, rank))
    scratch = np.empty(groups.max_chunk_cells * (k + 1))
    other_bias_buf = np.empty(groups.max_chunk_cells)
    ridge = np.diag(reg)
    for chunk in groups.chunks:
        n, width = chunk.other.shape
        # Per row a (k+1) x L block: [bias column; factor columns; target]. Its Gram matrix holds
        # XᵀX in the top-left k x k block and Xᵀy in the last column: one matmul gives both.
        design = scratch[: n * (k + 1) * width].reshape(n, k + 1, width)
        design[:, 0] = chunk.ones
        for f in range(rank):
            np.take(table[f], chunk.other, out=design[:, 1 + f], mode="clip")
        gathered_bias = other_bias_buf[: n * width].reshape(n, width)
        np.take(table[rank], chunk.other, out=gathered_bias, mode="clip")
        np.subtract(chunk.centred, gathered_bias, out=design[:, k])
        gram = design @ design.transpose(0, 2, 1)
        theta = np.linalg.solve(gram[:, :k, :k] + ridge, gram[:, :k, k:])[..., 0]
        bias[chunk.rows] = theta[:, 0]
        factors[chunk.rows] = theta[:, 1:]
    return bias, factors
