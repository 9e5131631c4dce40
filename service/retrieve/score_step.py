"""The score step of a retrieve: the relevance scorer's scores of its anchors, in one round or
two (``service.retrieve.anchors``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from service.completion.scale import ScoreScale
from service.db.search import Candidates
from service.providers.scorers import RelevanceScorer


@dataclass(frozen=True)
class ScoredAnchors:
    """What the scorer answered for the anchors sent to it (``sent``, candidate positions, each
    with its kind): the ones it scored (a pair it failed to score is left out, which degrades
    the answer), their scores and kinds."""

    sent: np.ndarray
    sent_kinds: np.ndarray  # int8
    positions: np.ndarray
    raw_scores: np.ndarray  # as the scorer gave them
    # On the namespace's common scale (:meth:`on_scale`; until then, as the scorer gave them).
    scores: np.ndarray
    kinds: np.ndarray  # int8, of the scored positions
    requests: int  # HTTP requests the scorer made for them, retries included
    degraded: bool  # some pair failed
    # Anchors the plan budgeted and its stop rule left unscored (round two skipped).
    stopped: int = 0
    rounds: int = 0  # the scorer rounds they were sent in, one after the other

    def on_scale(self, scale: ScoreScale) -> ScoredAnchors:
        """These anchors with their scores on the common scale, the scorer's under ``scale``."""
        return replace(self, scores=scale.common(self.raw_scores))

    def plus(self, later: ScoredAnchors) -> ScoredAnchors:
        """These anchors and a later round's."""
        return ScoredAnchors(
            sent=np.concatenate([self.sent, later.sent]),
            sent_kinds=np.concatenate([self.sent_kinds, later.sent_kinds]),
            positions=np.concatenate([self.positions, later.positions]),
            raw_scores=np.concatenate([self.raw_scores, later.raw_scores]),
            scores=np.concatenate([self.scores, later.scores]),
            kinds=np.concatenate([self.kinds, later.kinds]),
            requests=self.requests + later.requests,
            degraded=self.degraded or later.degraded,
            stopped=self.stopped + later.stopped,
            rounds=self.rounds + later.rounds,
        )

    def stopping(self, anchors: int) -> ScoredAnchors:
        """These anchors, and ``anchors`` more the stop rule left unscored."""
        return replace(self, stopped=self.stopped + anchors)


async def score_anchors(
    scorer: RelevanceScorer,
    query_text: str,
    query_vector: np.ndarray,
    candidates: Candidates,
    anchors: np.ndarray,
    kinds: np.ndarray,
    embeddings: np.ndarray,
) -> ScoredAnchors:
    """One round: the scorer's scores of the candidates at ``anchors`` (``embeddings``: theirs,
    for a scorer that reads them)."""
    if len(anchors) == 0:
        return ScoredAnchors(
            anchors, kinds, anchors, np.zeros(0), np.zeros(0), kinds, 0, degraded=False
        )
    scored = await scorer.score(
        query_text, query_vector, [candidates.rows[p]["text"] for p in anchors], embeddings
    )
    return scored_anchors(anchors, kinds, scored.values, scored.requests)


def score_values(values: Sequence[float | None]) -> NDArray[np.float64]:
    """A scorer's answers as floats, NaN for a pair it failed to score."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def scored_anchors(
    anchors: np.ndarray, kinds: np.ndarray, values: Sequence[float | None], requests: int
) -> ScoredAnchors:
    """The anchors sent and the scorer's answers for them (None: failed, left out)."""
    scores = score_values(values)
    succeeded = ~np.isnan(scores)
    raw = scores[succeeded]
    return ScoredAnchors(
        anchors, kinds, anchors[succeeded], raw, raw, kinds[succeeded], requests,
        bool(np.any(~succeeded)), rounds=1,
    )
