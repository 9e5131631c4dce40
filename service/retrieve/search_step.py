"""The search step of a retrieve: its candidates, the namespace's state, what the query's family
and its near-paraphrases observed of them, the budget, and the anchors to score among the rest
(docs/design.md "The retrieve pipeline", "Budget and anchors", "Query families and paraphrase
transfer")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.budget import BudgetSchedule
from service.completion import content_offsets
from service.db.namespaces import NamespaceState
from service.db.replicas import MEMORIES, Replicas
from service.db.search import (
    AnchorWindow,
    Candidates,
    CandidateSearch,
    NeighbourSearch,
    PastObservations,
    memory_embeddings,
    search,
)
from service.errors import NotFound
from service.retrieve.anchors import (
    EXPLORE,
    MARGINAL,
    AnchorHistory,
    AnchorPlan,
    AnchorRule,
    anchor_seed,
    learned_plan,
    paper_plan,
)
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
from service.settings import Settings

#: Paraphrase transfer reads the observations of at most this many nearest earlier queries.
PARAPHRASE_NEIGHBOURS = 16
_RULE = AnchorRule()
#: What the learned rule reads of recent anchors: the two arms it compares, and every find
#: (a find of any kind can be a discovery that later finds are credited to).
_ANCHOR_WINDOW = AnchorWindow(_RULE.window, (MARGINAL, EXPLORE), _RULE.relevant)


@dataclass(frozen=True)
class BudgetDecision:
    budget: int
    reason: str  # why: the response's budget_reason


@dataclass(frozen=True)
class FoundCandidates:
    """What the search step of one retrieve found."""

    state: NamespaceState
    candidates: Candidates
    budget: BudgetDecision
    family_key: bytes | None  # None: a semantic retrieve (it observes nothing, joins no family)
    reused: Reused  # candidates observed for the query's family
    neighbours: NeighbourEvidence | None  # paraphrase transfer (None: off)
    plan: AnchorPlan  # the anchors to score (none of them reused): round one, then round two's size
    # round one's embeddings, for a scorer that reads embeddings (else 0 columns)
    anchor_embeddings: np.ndarray

    @property
    def steered(self) -> np.ndarray:
        """Candidates whose paraphrase evidence speaks for them: no exploring anchor goes
        there."""
        if self.neighbours is None:
            return np.zeros(0, dtype=np.int64)
        return self.neighbours.steering

    def candidate_state(self) -> CandidateState:
        """What reranking needs of the candidates."""
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
        )


class SearchStep:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        schedule: BudgetSchedule,
        scorer_reads_embeddings: bool,
        replicas: Replicas | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.schedule = schedule
        self.scorer_reads_embeddings = scorer_reads_embeddings
        self.replicas = replicas

    async def find(
        self, request: RetrieveRequest, query_vector: np.ndarray
    ) -> FoundCandidates | None:
        """The candidates, the namespace's state, what the query's family observed of them and
        the anchors to score among the rest; None for a namespace that does not exist (nothing
        was ever stored in it)."""
        family = self._family_key(request, query_vector)
        paraphrases = self._neighbour_search(request, family)
        asked = self._candidate_search(request, query_vector, family, paraphrases)
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
        # Stage, budget and anchors follow the index this query expects; under concurrent
        # requests the recorded index can be a few higher, never lower. The budget goes to
        # candidates the family has not observed, so coverage grows with each asking.
        budget = self._budget(request, state.next_query_index, candidates)
        plan = self._plan(request, state, candidates, reused, budget, neighbours, past)
        anchor_embeddings = await self.anchor_embeddings(session, candidates, plan.first)
        await session.commit()
        return FoundCandidates(
            state, candidates, budget, family, reused, neighbours, plan, anchor_embeddings
        )

    def _candidate_search(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        family: bytes | None,
        paraphrases: NeighbourSearch | None,
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
            anchors=_ANCHOR_WINDOW if self._learns_anchors(request) else None,
            memory_ids=request.given,
            exact_below=(
                self.settings.exact_scan_below_filtered
                if request.filters is not None
                else self.settings.exact_scan_below
            ),
        )

    def _learns_anchors(self, request: RetrieveRequest) -> bool:
        """Whether this retrieve's anchors follow the learned rule (it reads recent anchors)."""
        return self.settings.anchor_policy == "learned" and request.policy in ("earm", "observed")

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

    def _budget(
        self, request: RetrieveRequest, query_index: int, candidates: Candidates
    ) -> BudgetDecision:
        n_candidates = len(candidates)
        if request.policy == "semantic":
            return BudgetDecision(0, "policy semantic: no scorer calls")
        if request.policy == "full":
            return BudgetDecision(n_candidates, "policy full: every candidate")
        if request.budget is not None:
            return BudgetDecision(min(request.budget, n_candidates), "set by the request")
        stage = self.schedule.stage_for(query_index)
        return BudgetDecision(
            self.schedule.budget_for_query(query_index, n_candidates),
            f"schedule: stage {stage} of the schedule, ratio {self.schedule.stages[stage][1]:g}",
        )

    def _plan(
        self,
        request: RetrieveRequest,
        state: NamespaceState,
        candidates: Candidates,
        reused: Reused,
        budget: BudgetDecision,
        neighbours: NeighbourEvidence | None,
        past: PastObservations,
    ) -> AnchorPlan:
        """The budget's anchors among the candidates the query's family has not observed."""
        seed = anchor_seed(request.namespace, state.next_query_index, request.seed)
        if self._learns_anchors(request):
            recent = past.recent_anchors
            history = AnchorHistory(
                recent.query_index, recent.kind, recent.memory_ids, recent.scores
            )
            return learned_plan(len(candidates), reused.positions, budget.budget, history, seed)
        steered = neighbours.steering if neighbours is not None else np.zeros(0, dtype=np.int64)
        return paper_plan(len(candidates), reused.positions, budget.budget, seed, steered)

    async def anchor_embeddings(
        self, session: AsyncSession, candidates: Candidates, anchors: np.ndarray
    ) -> np.ndarray:
        """The embeddings of some candidates, for a scorer that reads them (else 0 columns)."""
        if not self.scorer_reads_embeddings:
            return np.zeros((len(anchors), 0), dtype=np.float32)
        return await memory_embeddings(
            session, candidates.namespace, candidates.ids[anchors], self.settings.embedding_dim
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
