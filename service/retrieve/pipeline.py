"""The retrieve pipeline (DESIGN §2): embed, search, budget, score anchors, complete, rerank,
then record and learn (``service.retrieve.learning``, which also takes client feedback and runs
the full refit). No HTTP here."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion import content_offsets
from service.db.experience import REUSED_ORIGIN, SCORER_ORIGIN, QueryTrace, StoredRows
from service.db.namespaces import NamespaceState
from service.db.search import Candidates, NeighbourSearch, memory_embeddings, search
from service.db.spending import recent_spending
from service.errors import InvalidInput, LimitExceeded, NotFound
from service.providers.embedders import Embedder, check_embedding, embed_texts
from service.providers.scorers import RelevanceScorer
from service.retrieve.budget import (
    AdaptivePolicy,
    BudgetDecision,
    adaptive_budget,
    anchor_seed,
    budget_history,
    cold_head_share,
)
from service.retrieve.learning import FeedbackResult, Learner, MemoryRef
from service.retrieve.rerank import (
    ESTIMATED,
    EXPANDED,
    CandidateState,
    Policy,
    Ranking,
    Source,
    rank_candidates,
)
from service.retrieve.reuse import (
    NOTHING_REUSED,
    NeighbourEvidence,
    Reused,
    family_key,
    neighbour_evidence,
    reused_candidates,
    unobserved_anchors,
)
from service.settings import MAX_EXPAND, BudgetSchedule, Settings

Order = Literal["chronological", "relevance"]

#: Paraphrase transfer reads the observations of at most this many nearest earlier queries.
PARAPHRASE_NEIGHBOURS = 16


@dataclass(frozen=True)
class RetrieveRequest:
    namespace: str
    query: str
    query_embedding: Sequence[float] | None = None
    k: int = 10
    # Semantic candidates (N); None: the deployment's EARM_DEFAULT_CANDIDATES.
    candidates: int | None = None
    policy: Policy = "earm"
    budget: int | None = None
    seed: int = 0
    order: Order = "chronological"
    filters: dict[str, Any] | None = None
    # Search expansion (earm only): up to this many memories outside the semantic candidates
    # join them; None: the deployment's EARM_EXPAND.
    expand: int | None = None


# The results below are also the API's response body (service.http serves them as they are).


@dataclass(frozen=True)
class RetrievedMemory:
    id: int
    external_id: str | None
    text: str
    occurred_at: datetime | None
    metadata: dict[str, Any]
    score: float
    source: Source
    similarity: float
    rank: int


@dataclass(frozen=True)
class Timings:
    """Milliseconds per phase of one retrieve."""

    embed_ms: float
    search_ms: float
    score_ms: float
    complete_ms: float
    record_ms: float
    total_ms: float


@dataclass(frozen=True)
class RetrieveResult:
    # None when nothing was recorded: the namespace has no memories (or no candidate passed
    # the filters), so there was nothing to score or learn from.
    query_id: int | None
    query_index: int | None
    policy: str  # the request's Policy, documented as a plain string in the API
    stage: int
    budget: int
    budget_reason: str  # why the budget is what it is (the policy and what it read)
    scorer_calls: int
    # Candidates observed for earlier askings of this query (its family), taken from
    # experience instead of scored again.
    reused: int
    # Memories outside the semantic candidates that search expansion added to them (they
    # were ranked with the others; the budget is a share of the semantic ones only).
    expanded: int
    # Candidates ranked by an estimate that near-paraphrases' observations weighed on
    # (paraphrase transfer, earm; observed and reused candidates are not counted).
    paraphrased: int
    # HTTP requests the scorer made for those calls, retries included (0 for the local
    # scorer; one per batch of documents for a reranker).
    scorer_requests: int
    degraded: bool
    memories: list[RetrievedMemory]
    timings: Timings


class _Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[name] = round((now - since) * 1000, 3)
        return now

    def total(self) -> Timings:
        self.timings["total_ms"] = round((time.perf_counter() - self.start) * 1000, 3)
        return Timings(**self.timings)


@dataclass(frozen=True)
class _Search:
    """What the search step of one retrieve found."""

    state: NamespaceState
    candidates: Candidates
    budget: BudgetDecision
    family_key: bytes | None  # None: a semantic retrieve (it observes nothing, joins no family)
    reused: Reused  # candidates observed for the query's family
    neighbours: NeighbourEvidence | None  # paraphrase transfer (None: off)
    anchors: np.ndarray  # candidate positions to score (none of them reused)
    anchor_embeddings: np.ndarray  # theirs, for a scorer that reads embeddings (else 0 columns)


def _candidate_state(found: _Search) -> CandidateState:
    candidates = found.candidates
    return CandidateState(
        candidates.similarities,
        candidates.memory_bias,
        candidates.memory_factors,
        candidates.observation_count,
        content_offsets(
            found.state.content_slope, candidates.similarities, candidates.content_scores
        ),
        candidates.expanded,
    )


def _trace(
    found: _Search,
    ranking: Ranking,
    observed_positions: np.ndarray,
    stage: int,
    timings: dict[str, float],
    keep_candidates: bool,
) -> QueryTrace:
    """The query's trace, its candidates in rank order (``timings``: the phases so far); only
    the stage and timings without ``keep_candidates`` (``EARM_QUERY_TRACES=false``)."""
    n = len(found.candidates)
    anchors = np.zeros(n, dtype=bool)
    anchors[found.anchors] = True
    origins: list[str | None] = [None] * n
    for position in observed_positions:
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
    )


class RetrievalPipeline:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        embedder: Embedder | None,
        scorer: RelevanceScorer,
        settings: Settings,
    ) -> None:
        self.sessions = sessions
        self.embedder = embedder
        self.scorer = scorer
        self.settings = settings
        self.schedule = BudgetSchedule.parse(settings.budget_schedule)
        self.adaptive = AdaptivePolicy.from_settings(settings)
        self.learner = Learner(sessions, settings)

    # ----------------------------------------------------------------------------- retrieve

    def _check_limits(self, request: RetrieveRequest) -> None:
        settings = self.settings
        if not 1 <= request.k <= settings.max_k:
            raise LimitExceeded(f"k={request.k} is outside 1..{settings.max_k}")
        candidates = self._candidates(request)
        if not 1 <= candidates <= settings.max_candidates:
            raise LimitExceeded(f"candidates={candidates} is outside 1..{settings.max_candidates}")
        if request.budget is not None and not 0 <= request.budget <= candidates:
            raise InvalidInput(
                f"budget={request.budget} must be between 0 and candidates={candidates}"
            )
        if request.expand is not None and not 0 <= request.expand <= MAX_EXPAND:
            raise LimitExceeded(f"expand={request.expand} is outside 0..{MAX_EXPAND}")
        if len(request.query) > settings.max_text_chars:
            raise LimitExceeded(
                f"query has {len(request.query)} characters; the limit is {settings.max_text_chars}"
            )

    def _candidates(self, request: RetrieveRequest) -> int:
        if request.candidates is None:
            return self.settings.default_candidates
        return request.candidates

    async def _query_vector(self, request: RetrieveRequest) -> NDArray[np.float32]:
        if request.query_embedding is not None:
            return check_embedding(
                request.query_embedding, self.settings.embedding_dim, "query_embedding"
            )
        # Annotated: numpy types an integer index of an array as Any.
        query_vector: NDArray[np.float32] = (await embed_texts(self.embedder, [request.query]))[0]
        return query_vector

    async def _budget(
        self,
        session: AsyncSession,
        request: RetrieveRequest,
        query_index: int,
        candidates: Candidates,
    ) -> BudgetDecision:
        # A share of the semantic candidates: expansion adds candidates, never scorer calls.
        n_candidates = candidates.semantic_count
        if request.policy == "semantic":
            return BudgetDecision(0, "policy semantic: no scorer calls")
        if request.policy == "full":
            return BudgetDecision(n_candidates, "policy full: every candidate")
        if request.budget is not None:
            return BudgetDecision(min(request.budget, n_candidates), "set by the request")
        stage = self.schedule.stage_for(query_index)
        # The adaptive policy follows the schedule until its last stage: a new namespace's
        # model has too little to go on, and the warm-up costs what the schedule says.
        warm_up_end = self.schedule.stages[-1][0]
        if self.settings.budget_policy == "schedule" or query_index < warm_up_end:
            warm_up = "warm-up, " if self.settings.budget_policy == "adaptive" else ""
            return BudgetDecision(
                self.schedule.budget_for_query(query_index, n_candidates),
                f"{self.settings.budget_policy}: {warm_up}stage {stage} of the schedule, "
                f"ratio {self.schedule.stages[stage][1]:g}",
            )
        recent = await recent_spending(
            session, request.namespace, warm_up_end, self.settings.budget_window - 1
        )
        return adaptive_budget(
            n_candidates,
            cold_head_share(candidates.observation_count[:n_candidates]),
            budget_history(recent, self.adaptive.target),
            self.adaptive,
        )

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResult:
        self._check_limits(request)
        watch = _Stopwatch()
        query_vector = await self._query_vector(request)
        since = watch.lap("embed_ms", watch.start)

        found = await self._search(request, query_vector)
        since = watch.lap("search_ms", since)
        if found is None or len(found.candidates) == 0:
            return self._nothing_found(request, found, watch, since)

        # The rows the record updates are read while the scorer works, so the record is one
        # round trip; a read not done by then is waited for in the record's time.
        anchor_rows = asyncio.create_task(
            self.learner.read_rows(found.candidates.ids[found.anchors])
        )
        try:
            return await self._score_and_record(
                request, query_vector, found, anchor_rows, watch, since
            )
        finally:
            # Done by then unless the retrieve failed: then the read stops, or its failure is
            # taken here (an exception never retrieved would be logged as a second error).
            if anchor_rows.done() and not anchor_rows.cancelled():
                anchor_rows.exception()
            else:
                anchor_rows.cancel()

    async def _score_and_record(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        found: _Search,
        anchor_rows: asyncio.Task[StoredRows],
        watch: _Stopwatch,
        since: float,
    ) -> RetrieveResult:
        anchor_scores, scorer_requests = await self._score(
            request.query, query_vector, found.candidates, found.anchors, found.anchor_embeddings
        )
        since = watch.lap("score_ms", since)

        succeeded = ~np.isnan(anchor_scores)
        observed_positions = found.anchors[succeeded]
        observed_scores = anchor_scores[succeeded]
        reused = found.reused
        ranking = await asyncio.to_thread(
            rank_candidates,
            request.policy,
            _candidate_state(found),
            np.concatenate([observed_positions, reused.positions]),
            np.concatenate([observed_scores, reused.scores]),
            found.state.mean_score,
            self.settings.reg,
            np.arange(len(observed_positions) + len(reused)) >= len(observed_positions),
            found.neighbours,
            self.settings.paraphrase_prior,
        )
        memories = self._top_k(request, found.candidates, ranking)
        since = watch.lap("complete_ms", since)
        stage = self.schedule.stage_for(found.state.next_query_index)

        recorded = await self.learner.record_and_learn(
            request.namespace,
            request.query,
            query_vector,
            request.policy,
            found.candidates.semantic_count,
            found.budget.budget,
            len(found.anchors),
            scorer_requests,
            ranking,
            len(memories),
            # An expanded memory's score is the completion's estimate too.
            sum(m.source in (ESTIMATED, EXPANDED) for m in memories),
            found.candidates.ids[observed_positions],
            found.candidates.similarities[observed_positions],
            observed_scores,
            content_offsets(
                found.state.content_slope,
                found.candidates.similarities[observed_positions],
                found.candidates.content_scores[observed_positions],
            ),
            found.state,
            found.family_key,
            found.candidates.ids[reused.positions],
            # What the budget would have scored had the family not covered those candidates.
            found.budget.budget - len(found.anchors),
            _trace(
                found, ranking, observed_positions, stage, dict(watch.timings),
                self.settings.query_traces,
            ),
            await anchor_rows,
        )
        watch.lap("record_ms", since)
        return RetrieveResult(
            query_id=recorded.query_id,
            query_index=recorded.query_index,
            policy=request.policy,
            stage=stage,
            budget=found.budget.budget,
            budget_reason=found.budget.reason,
            scorer_calls=len(found.anchors),
            reused=len(reused),
            expanded=found.candidates.expanded,
            paraphrased=ranking.paraphrased,
            scorer_requests=scorer_requests,
            degraded=bool(np.any(~succeeded)),
            memories=memories,
            timings=watch.total(),
        )

    def _nothing_found(
        self, request: RetrieveRequest, found: _Search | None, watch: _Stopwatch, since: float
    ) -> RetrieveResult:
        """The answer when no memory is a candidate (none stored yet, an unknown namespace, or
        filters nothing passes): no memories, and no query recorded, so a new user's first
        retrieves cost nothing and do not advance the budget schedule."""
        for phase in ("score_ms", "complete_ms", "record_ms"):
            since = watch.lap(phase, since)
        return RetrieveResult(
            query_id=None,
            query_index=None,
            policy=request.policy,
            stage=self.schedule.stage_for(found.state.next_query_index if found else 0),
            budget=0,
            budget_reason="no candidates: nothing to score",
            scorer_calls=0,
            scorer_requests=0,
            reused=0,
            expanded=0,
            paraphrased=0,
            degraded=False,
            memories=[],
            timings=watch.total(),
        )

    def _family_key(self, request: RetrieveRequest, query_vector: np.ndarray) -> bytes | None:
        # Semantic retrieval observes nothing, so it neither reuses nor joins a family. With
        # reuse switched off a family still takes its feedback: feedback is authoritative.
        if request.policy == "semantic":
            return None
        return family_key(
            request.query, query_vector if request.query_embedding is not None else None
        )

    def _expand(self, request: RetrieveRequest) -> int:
        """How many memories search expansion may add. Only ``earm`` ranks by the completion
        model, the only ranking under which a memory found by the content prior can compete;
        the other policies rank unobserved memories by similarity, which would put the
        expanded ones last."""
        if request.policy != "earm":
            return 0
        return self.settings.expand if request.expand is None else request.expand

    def _neighbour_search(
        self, request: RetrieveRequest, family: bytes | None
    ) -> NeighbourSearch | None:
        settings = self.settings
        if not settings.paraphrase_transfer or family is None or request.policy != "earm":
            return None
        return NeighbourSearch(
            settings.paraphrase_similarity, PARAPHRASE_NEIGHBOURS, settings.paraphrase_window
        )

    async def _search(self, request: RetrieveRequest, query_vector: np.ndarray) -> _Search | None:
        """The candidates, the namespace's state, what the query's family observed of them and
        the anchors to score among the rest; None for a namespace that does not exist (nothing
        was ever stored in it)."""
        family = self._family_key(request, query_vector)
        paraphrases = self._neighbour_search(request, family)
        async with self.sessions() as session:
            try:
                state, candidates, past = await search(
                    session,
                    request.namespace,
                    query_vector,
                    self._candidates(request),
                    self.settings.rank,
                    request.filters,
                    family,
                    paraphrases,
                    family_feedback_only=not self.settings.reuse_observations,
                    expand=self._expand(request),
                )
            except NotFound:
                return None
            reused = (
                reused_candidates(candidates.ids, past.family_ids, past.family_scores)
                if family is not None
                else NOTHING_REUSED
            )
            neighbours = (
                neighbour_evidence(
                    candidates.ids,
                    past.neighbour_ids,
                    past.neighbour_similarities,
                    past.neighbour_scores,
                    paraphrases.min_similarity,
                )
                if paraphrases is not None
                else None
            )
            # Anchors come from the semantic candidates only, as without expansion: the same
            # budget scores the same anchors (a paired comparison), and the exploring half
            # keeps spreading observations over the semantic range the query's similarity
            # slope is solved on. An expanded memory is observed only through its family's
            # earlier observations (feedback on a returned one, say).
            n_semantic = candidates.semantic_count
            # Stage, budget and anchors follow the index this query expects; under concurrent
            # requests the recorded index can be a few higher, never lower. The budget goes to
            # candidates the family has not observed, so coverage grows with each asking.
            budget = await self._budget(session, request, state.next_query_index, candidates)
            anchors = unobserved_anchors(
                n_semantic,
                reused.positions[reused.positions < n_semantic],
                budget.budget,
                anchor_seed(request.namespace, state.next_query_index, request.seed),
                neighbours.steering if neighbours is not None else np.zeros(0, dtype=np.int64),
            )
            anchor_embeddings = (
                await memory_embeddings(
                    session, candidates.ids[anchors], self.settings.embedding_dim
                )
                if self.scorer.reads_embeddings
                else np.zeros((len(anchors), 0), dtype=np.float32)
            )
            await session.commit()
        return _Search(
            state, candidates, budget, family, reused, neighbours, anchors, anchor_embeddings
        )

    async def _score(
        self,
        query_text: str,
        query_vector: np.ndarray,
        candidates: Candidates,
        anchors: np.ndarray,
        anchor_embeddings: np.ndarray,
    ) -> tuple[np.ndarray, int]:
        """Scores of the anchors, NaN where the scorer failed for that pair, and the HTTP
        requests the scorer made for them."""
        if len(anchors) == 0:
            return np.zeros(0), 0
        scored = await self.scorer.score(
            query_text,
            query_vector,
            [candidates.rows[p]["text"] for p in anchors],
            anchor_embeddings,
        )
        values = np.array([np.nan if s is None else s for s in scored.values], dtype=np.float64)
        return values, scored.requests

    def _top_k(
        self, request: RetrieveRequest, candidates: Candidates, ranking: Ranking
    ) -> list[RetrievedMemory]:
        top = [
            RetrievedMemory(
                id=candidates.rows[p]["id"],
                external_id=candidates.rows[p]["external_id"],
                text=candidates.rows[p]["text"],
                occurred_at=candidates.rows[p]["occurred_at"],
                metadata=json.loads(candidates.rows[p]["metadata_json"]),
                score=float(ranking.scores[p]),
                source=ranking.sources[p],
                similarity=float(candidates.similarities[p]),
                rank=rank,
            )
            for rank, p in enumerate(ranking.order[: request.k], start=1)
        ]
        if request.order == "chronological":
            # Undated memories sort after dated ones; creation order (id) breaks ties.
            top.sort(
                key=lambda m: (
                    m.occurred_at is None,
                    m.occurred_at or datetime.min.replace(tzinfo=UTC),
                    m.id,
                )
            )
        return top

    # ------------------------------------------------------------------- learning (delegated)

    async def feedback(
        self, namespace: str, query_id: int, memories: Sequence[MemoryRef], scores: Sequence[float]
    ) -> FeedbackResult:
        """Record client observations for a past query (by memory id or external id)."""
        return await self.learner.feedback(namespace, query_id, memories, scores)

    async def refit(self, namespace: str) -> bool:
        """Full refit of a namespace's model; False when another process holds its lock."""
        return await self.learner.refit(namespace)

    async def drain(self) -> None:
        """Wait for the background refits started so far."""
        await self.learner.drain()
