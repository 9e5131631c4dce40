"""Mixed reranking: observed scores are authoritative, the rest are estimated. Pure numpy.

Runs in a worker thread (it is CPU work); knows nothing of HTTP or the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.completion import (
    calibrate_similarity,
    fold_in_query,
    leave_one_out_predictions,
    predict_scores,
    solve_rows_batch,
)

Policy = Literal["earm", "semantic", "full", "observed"]
POLICIES: tuple[Policy, ...] = ("earm", "semantic", "full", "observed")

OBSERVED, ESTIMATED, SEMANTIC = "observed", "estimated", "semantic"


@dataclass(frozen=True)
class CandidateState:
    """What reranking needs of the candidates, most similar first."""

    similarities: np.ndarray  # (n,)
    memory_bias: np.ndarray  # (n,)
    memory_factors: np.ndarray  # (n, rank)
    observation_count: np.ndarray  # (n,) observations before this query


@dataclass(frozen=True)
class Ranking:
    order: np.ndarray  # candidate positions, best first
    scores: np.ndarray  # final score of each candidate position
    sources: list[str]  # "observed" | "estimated" | "semantic" per candidate position
    query_bias: float | None  # this query's solved parameters (None: nothing observed)
    query_factors: np.ndarray | None
    # |estimate - observed| for the observed anchors that had history, each estimated as if
    # it had not been scored (leave-one-out fold-in): the completion's prequential error.
    prequential_errors: np.ndarray


def rank_candidates(
    policy: Policy,
    candidates: CandidateState,
    observed_positions: np.ndarray,
    observed_scores: np.ndarray,
    mean_score: float,
    reg: float,
) -> Ranking:
    """Final scores for every candidate and their order.

    - observed cells keep their score (every policy);
    - ``earm``: unobserved memories with history get the completion estimate from the model
      fitted on earlier queries with this query folded in from its anchors; memories without
      history get the similarity calibrated on this query's anchors;
    - ``observed`` / ``full``: unobserved memories get the calibrated similarity only;
    - ``semantic``, or nothing observed: the cosine similarity itself.
    """
    n = len(candidates.similarities)
    scores = candidates.similarities.astype(np.float64).copy()
    sources = [SEMANTIC] * n
    query_bias: float | None = None
    query_factors: np.ndarray | None = None
    prequential_errors = np.zeros(0)

    if len(observed_positions):
        # Every policy that observed something solves the query's parameters, so the model
        # learns from all traffic, not only from earm requests.
        query_bias, query_factors = fold_in_query(
            mean_score,
            candidates.memory_bias[observed_positions],
            candidates.memory_factors[observed_positions],
            observed_scores,
            reg,
        )
        had_history = candidates.observation_count[observed_positions] > 0
        if np.any(had_history):
            left_out = leave_one_out_predictions(
                mean_score,
                candidates.memory_bias[observed_positions],
                candidates.memory_factors[observed_positions],
                observed_scores,
                reg,
            )
            prequential_errors = np.abs(left_out - observed_scores)[had_history]
        calibration = calibrate_similarity(
            candidates.similarities[observed_positions], observed_scores
        )
        scores = calibration.estimate(candidates.similarities)
        if policy == "earm":
            with_history = candidates.observation_count > 0
            if np.any(with_history):
                scores[with_history] = predict_scores(
                    mean_score,
                    candidates.memory_bias[with_history],
                    candidates.memory_factors[with_history],
                    query_bias,
                    query_factors,
                )
                for position in np.flatnonzero(with_history):
                    sources[position] = ESTIMATED
        scores[observed_positions] = observed_scores
        for position in observed_positions:
            sources[position] = OBSERVED

    # Ties (e.g. equal observed scores) keep the semantic order: the candidates arrive most
    # similar first and the sort is stable.
    order = np.argsort(-scores, kind="stable")
    return Ranking(order, scores, sources, query_bias, query_factors, prequential_errors)


@dataclass(frozen=True)
class MemoryRowUpdate:
    memory_ids: np.ndarray
    bias: np.ndarray
    factors: np.ndarray
    observation_count: np.ndarray


def resolve_memory_rows(
    mean_score: float,
    memory_ids: np.ndarray,
    scores: np.ndarray,
    query_bias: np.ndarray,
    query_factors: np.ndarray,
    reg: float,
) -> MemoryRowUpdate:
    """Online update: re-solve each touched memory row from all of its observations.

    Inputs are one entry per observation (the memory observed, the score, and the observing
    query's parameters); the query side stays fixed.
    """
    rows, compact = np.unique(memory_ids, return_inverse=True)
    bias, factors = solve_rows_batch(
        mean_score,
        compact,
        np.arange(len(scores)),
        scores,
        query_bias,
        query_factors,
        reg,
        n_rows=len(rows),
    )
    counts = np.bincount(compact, minlength=len(rows))
    return MemoryRowUpdate(rows, bias, factors, counts)
