"""The online update of memory rows: what each memory row keeps between full refits (its
sufficient statistics, ``service.completion.statistics``) and how it moves, at a cost
independent of the row's history (docs/design.md "Causal completion and online learning").

- a refit builds every row's statistics for the query side it fitted (:func:`refit_statistics`);
- each retrieve adds its new cells to the rows it observed and re-solves them
  (:func:`new_cells`, :func:`update_memory_rows`);
- feedback moves a query's parameters, so the rows it observed are rebuilt from their history
  and those fed back re-solved (:func:`feedback_rows`).

Computed here from what ``service.db`` reads; the db layer writes the results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.completion import CompletionModel, QueryParameters
from service.completion.ridge import penalty
from service.completion.statistics import (
    RowObservations,
    RowStatistics,
    packed_length,
    row_statistics,
    solve_from_statistics,
)
from service.db.codecs import real_as_read
from service.db.experience import NamespaceObservations
from service.db.memory_rows import StoredRows
from service.db.model_state import MemoryRowUpdate, OnlineUpdate
from service.db.namespaces import NamespaceState
from service.db.record import ObservedCells


def new_cells(query: QueryParameters, observed: ObservedCells) -> RowObservations:
    """A retrieve's observations as the database stores them (similarity, score and factors
    as ``real``), so incremental statistics equal rebuilt ones up to rounding."""
    n = len(observed.memory_ids)
    return RowObservations(
        memory_ids=np.asarray(observed.memory_ids, dtype=np.int64),
        similarities=real_as_read(observed.similarities),
        scores=real_as_read(observed.scores),
        query_bias=np.full(n, query.bias),
        query_slope=np.full(n, query.slope),
        query_factors=np.tile(real_as_read(query.factors), (n, 1)),
        prior_offsets=np.asarray(observed.prior_offsets, dtype=np.float64),
    )


def update_memory_rows(
    state: NamespaceState,
    stored: StoredRows,
    cells: RowObservations,
    reg: float,
    rank: int,
) -> OnlineUpdate:
    """Online update of the rows a query observed: each row's stored statistics plus the
    query's new ``cells``, re-solved with the mean of the namespace ``state`` the query
    searched with (its refit stamp goes with the update).
    Rows without stored statistics are built from their whole history instead (read before
    this query's cells were recorded). Stored statistics of another rank (EARM_RANK changed)
    count as none until the next refit, as stored factors do."""
    ids = stored.memory_ids
    statistics = _stored_statistics(stored, rank)
    added = cells.subset(np.isin(cells.memory_ids, ids)).statistics(ids)
    statistics = statistics + added + stored.history.statistics(ids)
    bias, factors = solve_from_statistics(
        state.mean_score, statistics, penalty(reg, state.factor_reg, 1, rank)
    )
    return OnlineUpdate(
        ids, bias, factors, statistics.counts, statistics.packed(),
        versions=stored.versions, added=added.packed(), added_counts=added.counts,
        refitted_at=state.refitted_at,
    )


def _stored_statistics(stored: StoredRows, rank: int) -> RowStatistics:
    """The rows' stored statistics unpacked; zeros for a row with none (or of another rank)."""
    statistics = RowStatistics.zeros(len(stored.memory_ids), rank)
    usable = {
        position: packed for position, packed in enumerate(stored.statistics)
        if packed is not None and len(packed) == packed_length(rank)
    }
    if usable:
        unpacked = RowStatistics.unpack(list(usable.values()), rank)
        positions = list(usable)
        statistics.gram[positions], statistics.moment[positions] = unpacked.gram, unpacked.moment
    return statistics


@dataclass(frozen=True)
class RefitCells:
    """A refit's observations on its dense indexes: each cell's memory row among the
    ``n_memories`` observed memories and query column."""

    observations: NamespaceObservations
    memory_idx: np.ndarray
    query_idx: np.ndarray
    n_memories: int


def refit_statistics(
    cells: RefitCells, unit_embeddings: np.ndarray, model: CompletionModel
) -> RowStatistics:
    """Every memory row's statistics given the refit's query side, with the query factors as
    stored (``real``), so they equal a rebuild from the database up to rounding."""
    observations, memory_idx, query_idx = cells.observations, cells.memory_idx, cells.query_idx
    prior = model.prior
    prior_offsets = (
        prior.offsets(observations.similarities, (unit_embeddings @ prior.weights)[memory_idx])
        if len(prior.weights)
        else np.zeros(len(observations.scores))
    )
    return row_statistics(
        memory_idx,
        cells.n_memories,
        observations.scores,
        model.query_bias[query_idx]
        + model.query_slope[query_idx] * observations.similarities
        + prior_offsets,
        real_as_read(model.query_factors)[query_idx],
    )


@dataclass(frozen=True)
class FeedbackRows:
    """After feedback on a query: the statistics of every memory it observed, rebuilt (ids
    ascending), and the re-solved rows of those fed back."""

    memory_ids: np.ndarray
    statistics: RowStatistics
    fed_back: MemoryRowUpdate


def feedback_rows(
    history: RowObservations,
    memory_ids: np.ndarray,
    fed_back_ids: np.ndarray,
    mean_score: float,
    reg: float,
    factor_reg: float | None = None,
) -> FeedbackRows:
    """The query's parameters moved, so the statistics of every memory it observed
    (``memory_ids``, ascending, with their live ``history``) are rebuilt: they hold its old
    parameters. The rows that got feedback are re-solved."""
    statistics = history.statistics(memory_ids)
    fed_back = np.isin(memory_ids, fed_back_ids)
    touched = RowStatistics(statistics.gram[fed_back], statistics.moment[fed_back])
    rank = statistics.gram.shape[1] - 1
    bias, factors = solve_from_statistics(
        mean_score, touched, penalty(reg, factor_reg, 1, rank)
    )
    return FeedbackRows(
        memory_ids,
        statistics,
        MemoryRowUpdate(memory_ids[fed_back], bias, factors, touched.counts, touched.packed()),
    )
