"""Sufficient statistics of memory rows against the dense reference and the batch solve."""

from __future__ import annotations

import numpy as np
import pytest

from service.completion.ridge import solve_rows_batch
from service.completion.statistics import (
    RowStatistics,
    packed_length,
    row_statistics,
    solve_from_statistics,
)
from tests.unit.completion.reference_dense import dense_ridge

RANK = 4
REG = 0.7


def cells(seed: int, n_cells: int, n_rows: int):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n_rows, size=n_cells)
    scores = rng.uniform(0.0, 1.0, size=n_cells)
    offsets = rng.normal(scale=0.2, size=n_cells)
    factors = rng.normal(scale=0.5, size=(n_cells, RANK))
    return rows, scores, offsets, factors


def test_solving_from_statistics_matches_the_dense_reference_row_by_row() -> None:
    rows, scores, offsets, factors = cells(0, 300, 12)
    mu = 0.43
    bias, row_factors = solve_from_statistics(
        mu, row_statistics(rows, 12, scores, offsets, factors), REG
    )
    for row in range(12):
        mine = rows == row
        expected_bias, expected_factors = dense_ridge(
            factors[mine], scores[mine] - mu - offsets[mine], REG
        )
        assert bias[row] == pytest.approx(expected_bias, abs=1e-10)
        np.testing.assert_allclose(row_factors[row], expected_factors, atol=1e-10)


def test_solving_from_statistics_matches_the_batch_solve_for_any_mean() -> None:
    rows, scores, offsets, factors = cells(1, 500, 30)
    statistics = row_statistics(rows, 30, scores, offsets, factors)
    for mu in (0.0, 0.31, 0.77):
        expected = solve_rows_batch(
            mu, rows, np.arange(len(scores)), scores, offsets, factors, REG, n_rows=30
        )
        got = solve_from_statistics(mu, statistics, REG)
        np.testing.assert_allclose(got[0], expected[0], atol=1e-10)
        np.testing.assert_allclose(got[1], expected[1], atol=1e-10)


def test_statistics_added_cell_by_cell_equal_the_statistics_of_all_cells() -> None:
    rows, scores, offsets, factors = cells(2, 200, 9)
    # A tiny chunk makes rows straddle chunks, the case the per-chunk reduction must get right.
    whole = row_statistics(rows, 9, scores, offsets, factors, chunk_cells=7)
    running = RowStatistics.zeros(9, RANK)
    for start in range(0, 200, 35):
        part = slice(start, start + 35)
        running = running + row_statistics(
            rows[part], 9, scores[part], offsets[part], factors[part]
        )
    np.testing.assert_allclose(running.gram, whole.gram, atol=1e-10)
    np.testing.assert_allclose(running.moment, whole.moment, atol=1e-10)
    np.testing.assert_array_equal(whole.counts, np.bincount(rows, minlength=9))


def test_rows_without_cells_solve_to_zero() -> None:
    rows, scores, offsets, factors = cells(3, 20, 3)
    bias, row_factors = solve_from_statistics(
        0.5, row_statistics(rows + 2, 5, scores, offsets, factors), REG
    )
    assert bias[:2].tolist() == [0.0, 0.0]
    assert not np.any(row_factors[:2])


def test_packed_statistics_round_trip() -> None:
    rows, scores, offsets, factors = cells(4, 60, 4)
    statistics = row_statistics(rows, 4, scores, offsets, factors)
    packed = statistics.packed()
    assert packed.shape == (4, packed_length(RANK))
    back = RowStatistics.unpack(packed, RANK)
    np.testing.assert_array_equal(back.gram, statistics.gram)
    np.testing.assert_array_equal(back.moment, statistics.moment)
    with pytest.raises(ValueError, match="rank 3 needs"):
        RowStatistics.unpack(packed, 3)
