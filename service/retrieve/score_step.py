"""The score step of a retrieve: the relevance scorer's scores of its anchors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.providers.scorers import RelevanceScorer
from service.retrieve.search_step import FoundCandidates


@dataclass(frozen=True)
class ScoredAnchors:
    """What the scorer answered for the anchors: the ones it scored (candidate positions;
    a pair it failed to score is left out, which degrades the answer) and their scores."""

    positions: np.ndarray
    scores: np.ndarray
    requests: int  # HTTP requests the scorer made for them, retries included
    degraded: bool  # some pair failed


async def score_anchors(
    scorer: RelevanceScorer, query_text: str, query_vector: np.ndarray, found: FoundCandidates
) -> ScoredAnchors:
    anchors = found.anchors
    if len(anchors) == 0:
        return ScoredAnchors(anchors, np.zeros(0), 0, degraded=False)
    scored = await scorer.score(
        query_text,
        query_vector,
        [found.candidates.rows[p]["text"] for p in anchors],
        found.anchor_embeddings,
    )
    values = np.array([np.nan if s is None else s for s in scored.values], dtype=np.float64)
    succeeded = ~np.isnan(values)
    return ScoredAnchors(
        anchors[succeeded], values[succeeded], scored.requests, bool(np.any(~succeeded))
    )
