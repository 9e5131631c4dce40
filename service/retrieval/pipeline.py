"""The retrieve pipeline (DESIGN §2): embed, search, budget, score anchors, record, complete,
rerank, learn. Also client feedback and the full refit. No HTTP here."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion.similarity import (
    content_offsets,
    fit_with_similarity,
    fold_in_with_similarity,
)
from service.embedders import Embedder
from service.errors import InvalidInput, LimitExceeded, NotFound
from service.memories import check_embedding, embed_texts, repeats
from service.retrieval import store
from service.retrieval.budget import BudgetSchedule, anchor_seed, sample_anchors
from service.retrieval.rerank import (
    ESTIMATED,
    CandidateState,
    Policy,
    Ranking,
    rank_candidates,
    resolve_memory_rows,
)
from service.scorers import RelevanceScorer
from service.settings import Settings

log = logging.getLogger(__name__)

Order = Literal["chronological", "relevance"]


@dataclass(frozen=True)
class RetrieveRequest:
    namespace: str
    query: str
    query_embedding: Sequence[float] | None = None
    k: int = 10
    candidates: int = 200
    policy: Policy = "earm"
    budget: int | None = None
    seed: int = 0
    order: Order = "chronological"
    filters: dict[str, Any] | None = None


@dataclass(frozen=True)
class RetrievedMemory:
    id: int
    external_id: str | None
    text: str
    occurred_at: datetime | None
    metadata: dict[str, Any]
    score: float
    source: str
    similarity: float
    rank: int


@dataclass(frozen=True)
class RetrieveResult:
    query_id: int
    query_index: int
    policy: Policy
    stage: int
    budget: int
    scorer_calls: int
    degraded: bool
    memories: list[RetrievedMemory]
    timings: dict[str, float] = field(default_factory=dict)


class _Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}

    def lap(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[name] = round((now - since) * 1000, 3)
        return now

    def total(self) -> dict[str, float]:
        self.timings["total_ms"] = round((time.perf_counter() - self.start) * 1000, 3)
        return self.timings


def refit_due(queries_since_refit: int, queries_recorded: int, refit_every: int) -> bool:
    """Refit every ``refit_every`` queries, and more often while the namespace is young (each
    time its query count has grown by half), so factors are learned early. Still O(log n)
    refits before the steady period."""
    return queries_since_refit >= min(refit_every, max(1, queries_recorded // 2))


class RetrievalPipeline:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        embedder: Embedder | None,
        scorer: RelevanceScorer,
        settings: Settings,
    ) -> None:
        self.sessions = sessions
        # namespace -> its running background refit (the reference keeps the task from being
        # garbage-collected; it is dropped when the task ends)
        self._background_refits: dict[str, asyncio.Task[None]] = {}
        self.embedder = embedder
        self.scorer = scorer
        self.settings = settings
        self.schedule = BudgetSchedule.parse(settings.budget_schedule)

    # ----------------------------------------------------------------------------- retrieve

    def _check_limits(self, request: RetrieveRequest) -> None:
        settings = self.settings
        if not 1 <= request.k <= settings.max_k:
            raise LimitExceeded(f"k={request.k} is outside 1..{settings.max_k}")
        if not 1 <= request.candidates <= settings.max_candidates:
            raise LimitExceeded(
                f"candidates={request.candidates} is outside 1..{settings.max_candidates}"
            )
        if request.budget is not None and not 0 <= request.budget <= request.candidates:
            raise InvalidInput(
                f"budget={request.budget} must be between 0 and candidates={request.candidates}"
            )
        if len(request.query) > settings.max_text_chars:
            raise LimitExceeded(
                f"query has {len(request.query)} characters; the limit is {settings.max_text_chars}"
            )

    async def _query_vector(self, request: RetrieveRequest) -> np.ndarray:
        if request.query_embedding is not None:
            return check_embedding(
                request.query_embedding, self.settings.embedding_dim, "query_embedding"
            )
        return (await embed_texts(self.embedder, [request.query]))[0]

    def _budget(self, request: RetrieveRequest, query_index: int, n_candidates: int) -> int:
        if request.policy == "semantic":
            return 0
        if request.policy == "full":
            return n_candidates
        if request.budget is not None:
            return min(request.budget, n_candidates)
        return self.schedule.budget_for_query(query_index, n_candidates)

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResult:
        self._check_limits(request)
        watch = _Stopwatch()
        query_vector = await self._query_vector(request)
        since = watch.lap("embed_ms", watch.start)

        async with self.sessions() as session:
            state, candidates = await store.search(
                session,
                request.namespace,
                query_vector,
                request.candidates,
                self.settings.rank,
                request.filters,
            )
            # Stage, budget and anchors follow the index this query expects; under concurrent
            # requests the recorded index can be a few higher, never lower.
            stage = self.schedule.stage_for(state.next_query_index)
            budget = self._budget(request, state.next_query_index, len(candidates))
            anchors = sample_anchors(
                len(candidates),
                budget,
                anchor_seed(request.namespace, state.next_query_index, request.seed),
            )
            anchor_embeddings = (
                await store.memory_embeddings(
                    session, candidates.ids[anchors], self.settings.embedding_dim
                )
                if self.scorer.reads_embeddings
                else np.zeros((len(anchors), 0), dtype=np.float32)
            )
            await session.commit()
        since = watch.lap("search_ms", since)

        anchor_scores = await self._score(
            request.query, query_vector, candidates, anchors, anchor_embeddings
        )
        since = watch.lap("score_ms", since)

        succeeded = ~np.isnan(anchor_scores)
        observed_positions = anchors[succeeded]
        observed_scores = anchor_scores[succeeded]
        ranking = await asyncio.to_thread(
            rank_candidates,
            request.policy,
            CandidateState(
                candidates.similarities,
                candidates.memory_bias,
                candidates.memory_factors,
                candidates.observation_count,
                content_offsets(
                    state.content_slope, candidates.similarities, candidates.content_scores
                ),
            ),
            observed_positions,
            observed_scores,
            state.mean_score,
            self.settings.reg,
        )
        memories = self._top_k(request, candidates, ranking)
        since = watch.lap("complete_ms", since)

        recorded = await self._record_and_learn(
            request,
            query_vector,
            candidates,
            budget,
            len(anchors),
            ranking,
            memories,
            candidates.ids[observed_positions],
            candidates.similarities[observed_positions],
            observed_scores,
            state.mean_score,
        )
        watch.lap("record_ms", since)
        return RetrieveResult(
            query_id=recorded.query_id,
            query_index=recorded.query_index,
            policy=request.policy,
            stage=stage,
            budget=budget,
            scorer_calls=len(anchors),
            degraded=bool(np.any(~succeeded)),
            memories=memories,
            timings=watch.total(),
        )

    async def _score(
        self,
        query_text: str,
        query_vector: np.ndarray,
        candidates: store.Candidates,
        anchors: np.ndarray,
        anchor_embeddings: np.ndarray,
    ) -> np.ndarray:
        """Scores of the anchors, NaN where the scorer failed for that pair."""
        if len(anchors) == 0:
            return np.zeros(0)
        scores = await self.scorer.score(
            query_text,
            query_vector,
            [candidates.rows[p]["text"] for p in anchors],
            anchor_embeddings,
        )
        return np.array([np.nan if s is None else s for s in scores], dtype=np.float64)

    async def _record_and_learn(
        self,
        request: RetrieveRequest,
        query_vector: np.ndarray,
        candidates: store.Candidates,
        budget: int,
        scorer_calls: int,
        ranking: Ranking,
        memories: list[RetrievedMemory],
        observed_ids: np.ndarray,
        observed_similarities: np.ndarray,
        observed_scores: np.ndarray,
        mean_score: float,
    ) -> store.RecordedQuery:
        """Record the query and its observations, update the touched memory rows online, and
        commit, all before the response, so the next query learns from this one."""
        async with self.sessions() as session:
            recorded, history = await store.record_query(
                session,
                namespace=request.namespace,
                query_text=request.query,
                query_embedding=query_vector,
                policy=request.policy,
                n_candidates=len(candidates),
                budget=budget,
                scorer_calls=scorer_calls,
                query=ranking.query,
                prequential_errors=ranking.prequential_errors,
                returned_count=len(memories),
                returned_estimated=sum(m.source == ESTIMATED for m in memories),
                observed_ids=observed_ids,
                observed_similarities=observed_similarities,
                observed_scores=observed_scores,
                rank=self.settings.rank,
            )
            # The upsert carries the COMMIT (one round trip); session.commit() is then a no-op.
            await self._resolve_memory_rows(
                session, request.namespace, observed_ids, mean_score, history, commit=True
            )
            await session.commit()
        if refit_due(
            recorded.queries_since_refit, recorded.query_index + 1, self.settings.refit_every
        ):
            if self.settings.refit_in_background:
                self._start_background_refit(request.namespace)
            else:
                await self._refit_logged(request.namespace)
        return recorded

    async def _refit_logged(self, namespace: str) -> None:
        try:
            await self.refit(namespace)
        except Exception:
            # The query is committed and the online state is consistent; a failed refit is
            # retried by the next query (its counter was not reset), so the client gets its
            # answer instead of an error that would invite a duplicate retry.
            log.exception("full refit of namespace %r failed", namespace)

    def _start_background_refit(self, namespace: str) -> None:
        """At most one refit task per namespace in this process; a query that finds one
        running leaves it be (its observations are in the database and its counter keeps the
        refit due, so the next query after it starts another). Other processes are kept out
        by the refit's advisory lock."""
        running = self._background_refits.get(namespace)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._refit_logged(namespace), name=f"earm-refit:{namespace}")
        self._background_refits[namespace] = task
        task.add_done_callback(lambda _: self._forget_refit(namespace, task))

    def _forget_refit(self, namespace: str, task: asyncio.Task[None]) -> None:
        if self._background_refits.get(namespace) is task:
            del self._background_refits[namespace]

    async def drain(self) -> None:
        """Wait for the background refits started so far (at shutdown, before the database
        closes; and wherever a caller needs the model current)."""
        tasks = list(self._background_refits.values())
        if tasks:
            await asyncio.gather(*tasks)

    async def _resolve_memory_rows(
        self,
        session: AsyncSession,
        namespace: str,
        memory_ids: np.ndarray,
        mean_score: float,
        history: store.RowObservations | None = None,
        commit: bool = False,
    ) -> None:
        """Re-solve the rows of ``memory_ids`` from all their observations (``history``, when
        the caller already read it in the same transaction); ``commit`` ends the transaction
        with the write."""
        if len(memory_ids) == 0:
            return
        if history is None:
            history = await store.memory_row_observations(session, memory_ids, self.settings.rank)
        if len(history.scores) == 0:
            return
        update = await asyncio.to_thread(
            resolve_memory_rows,
            mean_score,
            history.memory_ids,
            history.similarities,
            history.scores,
            history.query_bias,
            history.query_slope,
            history.query_factors,
            history.prior_offsets,
            self.settings.memory_reg,
        )
        await store.upsert_memory_factors(
            session,
            namespace,
            update.memory_ids,
            update.bias,
            update.factors,
            update.observation_count,
            commit=commit,
        )

    def _top_k(
        self, request: RetrieveRequest, candidates: store.Candidates, ranking: Ranking
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
            top.sort(key=lambda m: (m.occurred_at is None, m.occurred_at or datetime.min.replace(tzinfo=UTC), m.id))
        return top

    # ---------------------------------------------------------------------------- feedback

    async def feedback(
        self, namespace: str, query_id: int, memory_ids: Sequence[int], scores: Sequence[float]
    ) -> tuple[int, int]:
        """Record client observations for a past query; returns (recorded, already_observed).

        The query's own parameters and the touched memory rows are re-solved at once, so the
        next query already benefits. A memory may be scored once per request: of two scores
        for it, one would be dropped.
        """
        for first, position in repeats(memory_ids):
            raise InvalidInput(
                f"scores[{first}] and scores[{position}] both score memory {memory_ids[first]}"
            )
        ids = np.asarray(memory_ids, dtype=np.int64)
        values = np.asarray(scores, dtype=np.float64)
        async with self.sessions() as session:
            # The lock first: a memory deleted after the check would fail the insert (deletes
            # take the same lock, so the check below sees every one committed).
            state = await store.namespace_state(session, namespace, for_update=True)
            similarities = await self._check_feedback_targets(session, namespace, query_id, ids)
            inserted_ids, inserted_scores = await store.insert_scores(
                session, namespace, query_id, ids, similarities, values, "feedback"
            )
            if len(inserted_ids):
                await store.add_feedback_to_mean(session, namespace, inserted_scores)
                observed, cell_similarities, bias, factors = await store.query_observations(
                    session, query_id, self.settings.rank
                )
                query = fold_in_with_similarity(
                    state.mean_score, bias, factors, cell_similarities, observed, self.settings.reg
                )
                await store.update_query_factors(
                    session,
                    np.array([query_id]),
                    np.array([query.bias]),
                    np.array([query.slope]),
                    query.factors[None, :],
                )
                await self._resolve_memory_rows(session, namespace, inserted_ids, state.mean_score)
            await session.commit()
        return len(inserted_ids), len(ids) - len(inserted_ids)

    async def _check_feedback_targets(
        self, session: AsyncSession, namespace: str, query_id: int, memory_ids: np.ndarray
    ) -> np.ndarray:
        """The cosine similarity of the query to each memory, or NotFound for a query or
        memory outside the namespace."""
        query_namespace = await session.scalar(
            text("SELECT namespace FROM queries WHERE id = :id"), {"id": query_id}
        )
        if query_namespace != namespace:
            raise NotFound(f"query {query_id} does not exist in namespace {namespace!r}")
        distances = dict(
            (
                await session.execute(
                    text(
                        "SELECT m.id, m.embedding <=> q.embedding "
                        "FROM memories m JOIN queries q ON q.id = :query_id "
                        "WHERE m.namespace = :namespace AND m.id = ANY(CAST(:ids AS bigint[]))"
                    ),
                    {
                        "namespace": namespace,
                        "query_id": query_id,
                        "ids": [int(m) for m in memory_ids],
                    },
                )
            ).all()
        )
        missing = sorted(set(int(m) for m in memory_ids) - set(distances))
        if missing:
            raise NotFound(f"memories {missing[:10]} do not exist in namespace {namespace!r}")
        return store.cosine_similarities([distances[int(m)] for m in memory_ids])

    # ------------------------------------------------------------------------------- refit

    async def refit(self, namespace: str) -> bool:
        """Full refit of a namespace's model from all its observations. Returns False when
        another process holds the refit lock (it will do the work).

        The lock is a session-level advisory lock, so every statement of the refit must run on
        the connection that took it: a session commits by handing its connection back to the
        pool, and the unlock would then run on another connection, leaking the lock (and
        silently disabling later refits of the namespace). Hence one pinned connection.
        """
        engine = self.sessions.kw["bind"]
        async with engine.connect() as connection, self.sessions(bind=connection) as session:
            if not await store.try_lock_namespace_refit(session, namespace):
                return False
            try:
                observations = await store.namespace_observations(session, namespace)
                # Sorting up to millions of ids: off the event loop, and once for the fetch
                # and the fit.
                memory_ids, memory_idx = await asyncio.to_thread(
                    np.unique, observations.memory_ids, return_inverse=True
                )
                # The fetch commits: no transaction stays open during the fit.
                embeddings = await store.memory_embeddings(
                    session, memory_ids, self.settings.embedding_dim
                )
                fitted = await asyncio.to_thread(
                    self._fit, observations, memory_ids, memory_idx, embeddings
                )
                await store.replace_model(
                    session, namespace, *fitted, refitted_at=datetime.now(UTC)
                )
                await session.commit()
            finally:
                await session.rollback()  # a failed write must not hide its error in the unlock
                await store.unlock_namespace_refit(session, namespace)
                await session.commit()
        return True

    def _fit(
        self,
        observations: store.NamespaceObservations,
        memory_ids: np.ndarray,
        memory_idx: np.ndarray,
        memory_embeddings: np.ndarray,
    ) -> tuple[Any, ...]:
        """The refit. ``memory_ids`` are the observed memories in id order, ``memory_idx`` each
        observation's row among them, ``memory_embeddings`` theirs (zero rows for memories
        deleted since)."""
        norms = np.linalg.norm(memory_embeddings, axis=1, keepdims=True)
        # Unit rows, as the search computes e_m·w: client vectors need not be normalised.
        unit_embeddings = np.divide(
            memory_embeddings, norms, out=np.zeros(memory_embeddings.shape), where=norms > 0
        )
        query_ids, query_idx = np.unique(observations.query_ids, return_inverse=True)
        model = fit_with_similarity(
            memory_idx,
            query_idx,
            observations.similarities,
            observations.scores,
            len(memory_ids),
            len(query_ids),
            rank=self.settings.rank,
            reg=self.settings.reg,
            n_iterations=self.settings.als_iterations,
            memory_embeddings=unit_embeddings,
            content_reg=self.settings.content_reg,
            memory_reg=self.settings.memory_reg,
        )
        return (
            memory_ids,
            model.memory_bias,
            model.memory_factors,
            np.bincount(memory_idx, minlength=len(memory_ids)),
            query_ids,
            model.query_bias,
            model.query_slope,
            model.query_factors,
            model.prior,
        )
