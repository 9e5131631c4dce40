"""The record step of a retrieve: what it records, built once from what the other steps found
(the learner records it and learns from it, ``service.retrieve.learning``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.api.retrieve import RetrievedMemory
from service.completion import content_offsets
from service.db.record import (
    REUSED_ORIGIN,
    SCORER_ORIGIN,
    ObservedCells,
    QueryTrace,
    RecordedRetrieve,
    ReusedCells,
    Spending,
)
from service.retrieve.anchors import REASONS
from service.retrieve.plan_step import RetrievePlan
from service.retrieve.request import RetrieveRequest
from service.retrieve.rerank import ESTIMATED, Ranking
from service.retrieve.score_step import ScoredAnchors
from service.retrieve.search_step import FoundCandidates


def recorded_retrieve(
    request: RetrieveRequest,
    query_vector: np.ndarray,
    found: FoundCandidates,
    plan: RetrievePlan,
    scored: ScoredAnchors,
    ranking: Ranking,
    memories: Sequence[RetrievedMemory],
    trace: QueryTrace,
    scored_by: str,
) -> RecordedRetrieve:
    candidates, observed = found.candidates, scored.positions
    similarities = candidates.similarities[observed]
    return RecordedRetrieve(
        namespace=request.namespace,
        text=request.query,
        embedding=query_vector,
        policy=request.policy,
        scored_by=scored_by,
        family_key=found.family_key,
        query=ranking.query,
        prequential_errors=ranking.prequential_errors,
        spending=Spending(len(candidates), plan.budget.budget, len(scored.sent), scored.requests),
        observed=ObservedCells(
            candidates.ids[observed],
            similarities,
            scored.scores,
            scored.raw_scores,
            content_offsets(
                found.state.content_slope, similarities, candidates.content_scores[observed]
            ),
            scored.kinds,
        ),
        reused=ReusedCells(
            candidates.ids[found.reused.positions],
            # What the budget would have scored had the family not covered those candidates.
            plan.budget.budget - len(scored.sent),
        ),
        returned=len(memories),
        returned_estimated=sum(m.source == ESTIMATED for m in memories),
        exploration_share=plan.anchors.share,
        trace=trace,
    )


def query_trace(
    found: FoundCandidates,
    ranking: Ranking,
    scored: ScoredAnchors,
    stage: int,
    timings: dict[str, float],
    keep_candidates: bool,
) -> QueryTrace:
    """The query's trace, its candidates in rank order (``timings``: the phases so far); only
    the stage and timings without ``keep_candidates`` (``EARM_QUERY_TRACES=false``)."""
    n = len(found.candidates)
    anchors = np.zeros(n, dtype=bool)
    anchors[scored.sent] = True
    reasons: list[str | None] = [None] * n
    for position, kind in zip(scored.sent.tolist(), scored.sent_kinds.tolist(), strict=True):
        reasons[position] = REASONS[kind]
    origins: list[str | None] = [None] * n
    for position in scored.positions:
        origins[position] = SCORER_ORIGIN
    for position in found.reused.positions:
        origins[position] = REUSED_ORIGIN
    # No candidates: every per-candidate array below comes out empty.
    order = ranking.order if keep_candidates else ranking.order[:0]
    return QueryTrace(
        stage=stage,
        timings=timings,
        memory_ids=found.candidates.ids[order],
        similarities=found.candidates.similarities[order],
        estimates=ranking.estimates[order],
        scores=ranking.scores[order],
        sources=[ranking.sources[p] for p in order],
        origins=[origins[p] for p in order],
        anchors=anchors[order],
        anchor_reasons=[reasons[p] for p in order],
        scorer_rounds=scored.rounds,
    )
