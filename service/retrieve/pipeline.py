"""The retrieve pipeline, in the order it runs: embed, search, plan (the budget and round one's
anchors), score round one, rank, plan and score round two, rank, record and learn
(docs/design.md "The retrieve pipeline"). The steps are ``search_step``, ``plan_step``,
``score_step``, ``rerank`` and ``record_step``; ``service.retrieve.learning`` records and
learns, takes client feedback and runs the full refit. No HTTP here."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.api.retrieve import FeedbackResult, Policy, RetrievedMemory, RetrieveResult, Timings
from service.budget import BudgetSchedule
from service.db.memory_rows import StoredRows
from service.db.replicas import Replicas
from service.db.search import Candidates, memory_embeddings
from service.db.writes import Writes
from service.errors import InvalidInput, LimitExceeded
from service.providers.embedders import Embedder, check_embedding, embed_texts
from service.providers.factory import scorer_source
from service.providers.scorers import RelevanceScorer
from service.retrieve.late import LateAnchors, LateObserver, PendingAnchors, score_anchors_by
from service.retrieve.learning import Learner, MemoryRef
from service.retrieve.plan_step import Planner, RetrievePlan
from service.retrieve.record_step import query_trace, recorded_retrieve
from service.retrieve.refit_process import Refits
from service.retrieve.request import RetrieveRequest
from service.retrieve.rerank import (
    CandidateObservations,
    Ranking,
    Trust,
    rank_candidates,
)
from service.retrieve.score_step import ScoredAnchors
from service.retrieve.search_step import FoundCandidates, SearchStep
from service.settings import Settings
from service.tracing import current

# The pipeline's request (service.retrieve.request) is part of its interface; its result is the
# API's response body (service.api.retrieve).
__all__ = [
    "RetrievalPipeline",
    "RetrieveRequest",
]


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


class _RowReads:
    """The reads of the memory rows a retrieve's record updates, started while the scorer
    works, so the record is one round trip (a read not done by then is waited for in the
    record's time)."""

    def __init__(self, learner: Learner, candidates: Candidates) -> None:
        self.learner = learner
        self.candidates = candidates
        self.tasks: list[asyncio.Task[StoredRows]] = []

    def start(self, positions: np.ndarray) -> None:
        self.tasks.append(
            asyncio.create_task(
                self.learner.read_rows(self.candidates.namespace, self.candidates.ids[positions])
            )
        )

    async def result(self) -> StoredRows:
        rows = [await task for task in self.tasks]
        return functools.reduce(StoredRows.join, rows[1:], rows[0])

    def close(self) -> None:
        """Done by then unless the retrieve failed: then the reads stop, or their failures are
        taken here (an exception never retrieved would be logged as a second error)."""
        for task in self.tasks:
            if task.done() and not task.cancelled():
                task.exception()
            else:
                task.cancel()


class RetrievalPipeline:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        embedder: Embedder | None,
        scorer: RelevanceScorer,
        settings: Settings,
        late_observer: LateObserver | None = None,
        replicas: Replicas | None = None,
        refits: Refits | None = None,
        *,
        refit_in_request: bool = False,
    ) -> None:
        """``refit_in_request``: a refit a retrieve makes due runs inside its request
        (:class:`~service.retrieve.learning.Learner`), not after the response."""
        self.sessions = sessions
        self.embedder = embedder
        self.scorer = scorer
        # Each step gets its group of the settings; the pipeline keeps the ones it reads.
        self.limits, self.anchors = settings.limits, settings.anchors
        self.completion, self.retrieval = settings.completion, settings.retrieval
        self.schedule = BudgetSchedule.parse(self.anchors.budget_schedule)
        self.search = SearchStep(sessions, settings.search, replicas)
        self.planner = Planner(self.anchors, self.schedule)
        # Where every write of the pipeline begins: this process's replica reads see it.
        self.writes = Writes(sessions, replicas)
        self.learner = Learner(
            sessions, settings.learning, scorer_source(settings.scoring), refits, self.writes,
            refit_in_request=refit_in_request,
        )
        # The anchors answered after the deadline, recorded in the background.
        self.late = LateAnchors(self.learner, late_observer)

    # ----------------------------------------------------------------------------- retrieve

    def _check_limits(self, request: RetrieveRequest) -> None:
        limits = self.limits
        candidates = request.semantic_candidates(limits.default_candidates)
        # Given candidates are all answered (a reranker scores every document it is sent).
        max_k = limits.max_k if request.given is None else candidates
        if not 1 <= request.k <= max_k:
            raise LimitExceeded(f"k={request.k} is outside 1..{max_k}")
        if not 1 <= candidates <= limits.max_candidates:
            raise LimitExceeded(f"candidates={candidates} is outside 1..{limits.max_candidates}")
        if request.budget is not None and not 0 <= request.budget <= candidates:
            raise InvalidInput(
                f"budget={request.budget} must be between 0 and candidates={candidates}"
            )
        if len(request.query) > limits.max_text_chars:
            raise LimitExceeded(
                f"query has {len(request.query)} characters; the limit is {limits.max_text_chars}"
            )

    async def _query_vector(self, request: RetrieveRequest) -> NDArray[np.float32]:
        if request.query_embedding is not None:
            return check_embedding(
                request.query_embedding, self.retrieval.embedding_dim, "query_embedding"
            )
        # Annotated: numpy types an integer index of an array as Any.
        query_vector: NDArray[np.float32] = (await embed_texts(self.embedder, [request.query]))[0]
        return query_vector

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResult:
        self._check_limits(request)
        watch = _Stopwatch()
        query_vector = await self._query_vector(request)
        since = watch.lap("embed_ms", watch.start)

        tracing = current()
        with tracing.span("search") as span:
            found = await self.search.find(
                request, query_vector, self.planner.anchor_window(request)
            )
            span.set({
                "earm.candidates": 0 if found is None else len(found.candidates),
                "earm.reused": 0 if found is None else len(found.reused),
            })
        since = watch.lap("search_ms", since)
        if found is None or len(found.candidates) == 0:
            return self._nothing_found(request, found, watch, since)
        with tracing.span("plan", {"earm.round": 1}) as span:
            plan = self.planner.first_round(request, found)
            span.set({
                "earm.stage": plan.stage,
                "earm.budget": plan.budget.budget,
                "earm.anchors": len(plan.anchors.first),
            })
        rows = _RowReads(self.learner, found.candidates)
        try:
            return await self._score_and_record(
                request, query_vector, found, plan, rows, watch, since
            )
        finally:
            rows.close()

    async def _score_and_record(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        found: FoundCandidates,
        plan: RetrievePlan,
        rows: _RowReads,
        watch: _Stopwatch,
        since: float,
    ) -> RetrieveResult:
        scored, pending = await self._score(request, query_vector, found, plan, rows)
        since = watch.lap("score_ms", since)
        tracing = current()
        try:
            with tracing.span("rank", {"earm.policy": request.policy}) as span:
                ranking = await asyncio.to_thread(
                    self._rank, request.policy, found, scored, self._trust()
                )
                memories = self._top_k(request, found.candidates, ranking)
                span.set({"earm.paraphrased": ranking.paraphrased})
            since = watch.lap("complete_ms", since)
            trace = query_trace(found, ranking, scored, plan.stage, dict(watch.timings),
                                self.retrieval.query_traces)
            with tracing.span("record") as span:
                recorded = await self.learner.record_and_learn(
                    recorded_retrieve(
                        request, query_vector, found, plan, scored, ranking, memories, trace,
                        self.learner.scorer_source,
                    ),
                    found.state,
                    await rows.result(),
                )
                if recorded is not None:
                    span.set({"earm.query_id": recorded.query_id})
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        if pending is not None:
            self.late.follow(request.namespace, recorded, pending, found.candidates)
        watch.lap("record_ms", since)
        if recorded is None:
            # DELETE /namespaces erased the namespace while this ran: answer as a retrieve
            # after the erase does (no memories, nothing recorded), with the calls it made.
            memories = []
        return RetrieveResult(
            query_id=None if recorded is None else recorded.query_id,
            query_index=None if recorded is None else recorded.query_index,
            policy=request.policy,
            stage=plan.stage,
            budget=plan.budget.budget,
            budget_reason=plan.budget.reason,
            scorer_calls=len(scored.sent),
            stopped_anchors=scored.stopped if self.anchors.stop_expected > 0 else None,
            reused=len(found.reused),
            paraphrased=ranking.paraphrased,
            exploration_share=plan.anchors.share,
            scorer_requests=scored.requests,
            scorer_rounds=scored.rounds,
            degraded=scored.degraded,
            memories=memories,
            timings=watch.total(),
            late=self._late_count(pending),
        )

    def _late_count(self, pending: PendingAnchors | None) -> int | None:
        """The response's count of late anchors: None (not shown) without a deadline."""
        if self.retrieval.score_deadline_ms is None:
            return None
        return 0 if pending is None else pending.late

    def _deadline(self) -> float | None:
        """The event-loop time the score phase waits until at most (None: no deadline)."""
        deadline_ms = self.retrieval.score_deadline_ms
        if deadline_ms is None:
            return None
        return asyncio.get_running_loop().time() + deadline_ms / 1000.0

    async def _score(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        found: FoundCandidates,
        plan: RetrievePlan,
        rows: _RowReads,
    ) -> tuple[ScoredAnchors, PendingAnchors | None]:
        """The anchors' scores: round one, then round two chosen from round one's (the rows each
        round's record updates are read while the scorer works on it). With a deadline, the
        scores answered by then, and the call that missed it (round one missing it: no round
        two, which would be chosen from its scores)."""
        anchors, candidates = plan.anchors, found.candidates
        query, deadline = (request.query, query_vector), self._deadline()
        scale = found.state.scale_of(self.learner.scorer_source)
        tracing = current()
        rows.start(anchors.first)
        with tracing.span("score", {"earm.round": 1, "earm.anchors": len(anchors.first)}) as span:
            scored, pending = await score_anchors_by(
                self.scorer, query, candidates, (anchors.first, anchors.first_kinds),
                await self._embeddings(candidates, anchors.first), deadline,
            )
            span.set({"earm.degraded": scored.degraded, "earm.late": pending is not None})
        scored = scored.on_scale(scale)
        if anchors.second_size == 0 or pending is not None:
            return scored, pending
        with tracing.span("plan", {"earm.round": 2}) as span:
            # Round two is chosen by the completion's estimates whatever the policy ranks by,
            # so the policies score the same anchors (a paired comparison).
            round_one = await asyncio.to_thread(self._rank, "earm", found, scored, None)
            second = self.planner.second_round(plan, found, round_one, request.read)
            span.set({"earm.anchors": len(second.positions), "earm.stopped": second.stopped})
        if second.stopped:
            return scored.stopping(second.stopped), pending
        rows.start(second.positions)
        round_two = {"earm.round": 2, "earm.anchors": len(second.positions)}
        with tracing.span("score", round_two) as span:
            later, pending = await score_anchors_by(
                self.scorer, query, candidates, (second.positions, second.kinds()),
                await self._embeddings(candidates, second.positions), deadline,
            )
            span.set({"earm.degraded": later.degraded, "earm.late": pending is not None})
        return scored.plus(later.on_scale(scale)), pending

    async def _embeddings(self, candidates: Candidates, positions: np.ndarray) -> np.ndarray:
        """The embeddings of some candidates, for a scorer that reads them (else 0 columns)."""
        if not self.scorer.reads_embeddings or len(positions) == 0:
            return np.zeros((len(positions), 0), dtype=np.float32)
        async with self.sessions() as session:
            return await memory_embeddings(
                session, candidates.namespace, candidates.ids[positions],
                self.retrieval.embedding_dim,
            )

    def _trust(self) -> Trust | None:
        """When the final ranking lets an unscored candidate outrank a scored one: under the
        learned anchor rule, when trusted to score higher (None: by its estimate, as every
        other ranking)."""
        if self.anchors.policy != "learned":
            return None
        return Trust(self.anchors.trust_probability)

    def _rank(
        self, policy: Policy, found: FoundCandidates, scored: ScoredAnchors, trust: Trust | None
    ) -> Ranking:
        """The candidates ranked by ``policy`` from the anchors the scorer scored and the
        candidates the query's family observed (CPU work: run in a thread); ``trust``: see
        ``rank_candidates``."""
        reused = found.reused
        observed = CandidateObservations(
            np.concatenate([scored.positions, reused.positions]),
            np.concatenate([scored.scores, reused.scores]),
            np.arange(len(scored.positions) + len(reused)) >= len(scored.positions),
        )
        return rank_candidates(
            policy,
            found.candidate_state(self.anchors.content_prior),
            observed,
            found.state.mean_score,
            self.completion.reg,
            found.neighbours,
            self.anchors.paraphrase_prior,
            trust=trust,
        )

    def _nothing_found(
        self,
        request: RetrieveRequest,
        found: FoundCandidates | None,
        watch: _Stopwatch,
        since: float,
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
            scorer_rounds=0,
            reused=0,
            paraphrased=0,
            exploration_share=None,
            degraded=False,
            memories=[],
            timings=watch.total(),
            late=self._late_count(None),
        )

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
