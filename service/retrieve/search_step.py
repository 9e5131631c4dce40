"""The search step of a retrieve: its candidates, the namespace's state, what the query's family
and its near-paraphrases observed of them, and the recent anchors the plan learns from
(docs/design.md "The retrieve pipeline", "Query families and paraphrase transfer")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion import content_offsets
from service.db.namespaces import NamespaceState
from service.db.replicas import MEMORIES, Replicas
from service.db.search import (
    AnchorWindow,
    Candidates,
    CandidateSearch,
    NeighbourSearch,
    PastObservations,
    RecentAnchors,
    search,
)
from service.errors import NotFound
from service.retrieve.request import RetrieveRequest
from service.retrieve.rerank import CandidateState
from service.retrieve.reuse import (
    NOTHING_REUSED,
    NeighbourEvidence,
    Reused,
    family_key,
    neighbour_evidence,
    reused_candidates,
)
from service.settings_groups import SearchSettings

#: Paraphrase transfer reads the observations of at most this many nearest earlier queries.
PARAPHRASE_NEIGHBOURS = 16


@dataclass(frozen=True)
class FoundCandidates:
    """What the search step of one retrieve found."""

    state: NamespaceState
    candidates: Candidates
    family_key: bytes | None  # None: a semantic retrieve (it observes nothing, joins no family)
    reused: Reused  # candidates observed for the query's family
    neighbours: NeighbourEvidence | None  # paraphrase transfer (None: off)
    recent_anchors: RecentAnchors  # of the namespace's latest queries (the AnchorWindow asked)

    @property
    def steered(self) -> np.ndarray:
        """Candidates whose paraphrase evidence speaks for them: no exploring anchor goes
        there."""
        if self.neighbours is None:
            return np.zeros(0, dtype=np.int64)
        return self.neighbours.steering

    def candidate_state(self, similarity_feature: bool) -> CandidateState:
        """What reranking needs of the candidates (``similarity_feature``: see
        :class:`CandidateState`)."""
        candidates = self.candidates
        return CandidateState(
            candidates.similarities,
            candidates.memory_bias,
            candidates.memory_factors,
            candidates.observation_count,
            content_offsets(
                self.state.content_slope, candidates.similarities, candidates.content_scores
            ),
            self.state.factor_reg,
            similarity_feature,
        )


class SearchStep:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: SearchSettings,
        replicas: Replicas | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.replicas = replicas

    async def find(
        self, request: RetrieveRequest, query_vector: np.ndarray, anchors: AnchorWindow | None
    ) -> FoundCandidates | None:
        """The candidates, the namespace's state, what the query's family observed of them and
        the ``anchors`` window of recent anchors (None: none read); None for a namespace that
        does not exist (nothing was ever stored in it)."""
        family = self._family_key(request, query_vector)
        paraphrases = self._neighbour_search(request, family)
        asked = self._candidate_search(request, query_vector, family, paraphrases, anchors)
        if self.replicas is not None and request.policy == "semantic" and request.given is None:
            # Observes nothing and learns nothing: it needs the namespace's memories as this
            # process last wrote them, not its latest record, so a read replica can answer.
            return await self.replicas.read(
                request.namespace, lambda session: self._find(session, request, asked), MEMORIES
            )
        async with self.sessions() as session:
            return await self._find(session, request, asked)

    async def _find(
        self, session: AsyncSession, request: RetrieveRequest, search_for: CandidateSearch
    ) -> FoundCandidates | None:
        try:
            state, candidates, past = await search(session, search_for)
        except NotFound:
            return None
        family, paraphrases = search_for.family_key, search_for.neighbours
        reused = (
            reused_candidates(candidates.ids, past.family_ids, past.family_scores)
            if family is not None
            else NOTHING_REUSED
        )
        neighbours = _neighbour_evidence(candidates, past, paraphrases)
        await session.commit()
        return FoundCandidates(
            state, candidates, family, reused, neighbours, past.recent_anchors
        )

    def _candidate_search(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        family: bytes | None,
        paraphrases: NeighbourSearch | None,
        anchors: AnchorWindow | None,
    ) -> CandidateSearch:
        return CandidateSearch(
            request.namespace,
            query_vector,
            request.semantic_candidates(self.settings.default_candidates),
            self.settings.rank,
            request.filters,
            family,
            paraphrases,
            family_feedback_only=not self.settings.reuse_observations,
            anchors=anchors,
            memory_ids=request.given,
            exact_below=(
                self.settings.exact_scan_below_filtered
                if request.filters is not None
                else self.settings.exact_scan_below
            ),
        )

    def _family_key(self, request: RetrieveRequest, query_vector: np.ndarray) -> bytes | None:
        # Semantic retrieval observes nothing, so it neither reuses nor joins a family. With
        # reuse switched off a family still takes its feedback: feedback is authoritative.
        if request.policy == "semantic":
            return None
        return family_key(
            request.query, query_vector if request.query_embedding is not None else None
        )

    def _neighbour_search(
        self, request: RetrieveRequest, family: bytes | None
    ) -> NeighbourSearch | None:
        settings = self.settings
        if not settings.paraphrase_transfer or family is None or request.policy != "earm":
            return None
        return NeighbourSearch(
            settings.paraphrase_similarity, PARAPHRASE_NEIGHBOURS, settings.paraphrase_window
        )


def _neighbour_evidence(
    candidates: Candidates, past: PastObservations, paraphrases: NeighbourSearch | None
) -> NeighbourEvidence | None:
    if paraphrases is None:
        return None
    return neighbour_evidence(
        candidates.ids,
        past.neighbour_ids,
        past.neighbour_similarities,
        past.neighbour_scores,
        paraphrases.min_similarity,
    )
