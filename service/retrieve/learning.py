"""Learning from experience (DESIGN §2): after each query, record it and re-solve the touched
memory rows online; take client feedback; and refit the whole namespace model now and then
(in the background by default). No HTTP here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion.similarity import (
    fit_with_similarity,
    fold_in_with_similarity,
)
from service.db import experience, model_state
from service.db.experience import (
    NamespaceObservations,
    QueryTrace,
    RecordedQuery,
    RowObservations,
)
from service.db.model_state import RefittedModel
from service.db.namespaces import (
    namespace_state,
    try_lock_namespace_refit,
    unlock_namespace_refit,
)
from service.db.search import memory_embeddings
from service.errors import InvalidInput
from service.ingest.validation import repeats
from service.retrieve.rerank import Ranking, resolve_memory_rows
from service.settings import Settings

log = logging.getLogger(__name__)


def refit_due(queries_since_refit: int, queries_recorded: int, refit_every: int) -> bool:
    """Refit every ``refit_every`` queries, and more often while the namespace is young (each
    time its query count has grown by half), so factors are learned early. Still O(log n)
    refits before the steady period."""
    return queries_since_refit >= min(refit_every, max(1, queries_recorded // 2))


@dataclass(frozen=True)
class FeedbackResult:
    """Scores recorded, and scores for memories already observed for the query (the first
    score of a pair is kept)."""

    recorded: int
    already_observed: int


class Learner:
    """Writes what a namespace learns; one per pipeline, so per process (it owns the
    process's background refit tasks)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], settings: Settings) -> None:
        self.sessions = sessions
        self.settings = settings
        # namespace -> its running background refit (the reference keeps the task from being
        # garbage-collected; it is dropped when the task ends)
        self._background_refits: dict[str, asyncio.Task[None]] = {}
        # Namespaces whose running background refit must go once more (see below).
        self._refit_again: set[str] = set()

    async def record_and_learn(
        self,
        namespace: str,
        query_text: str,
        query_vector: np.ndarray,
        policy: str,
        n_candidates: int,
        budget: int,
        scorer_calls: int,
        scorer_requests: int,
        ranking: Ranking,
        returned_count: int,
        returned_estimated: int,
        observed_ids: np.ndarray,
        observed_similarities: np.ndarray,
        observed_scores: np.ndarray,
        mean_score: float,
        trace: QueryTrace,
    ) -> RecordedQuery:
        """Record the query and its observations, update the touched memory rows online, and
        commit, all before the response, so the next query learns from this one."""
        async with self.sessions() as session:
            recorded, history = await experience.record_query(
                session,
                namespace=namespace,
                query_text=query_text,
                query_embedding=query_vector,
                policy=policy,
                n_candidates=n_candidates,
                budget=budget,
                scorer_calls=scorer_calls,
                scorer_requests=scorer_requests,
                query=ranking.query,
                prequential_errors=ranking.prequential_errors,
                returned_count=returned_count,
                returned_estimated=returned_estimated,
                observed_ids=observed_ids,
                observed_similarities=observed_similarities,
                observed_scores=observed_scores,
                trace=trace,
                rank=self.settings.rank,
            )
            # The upsert carries the COMMIT (one round trip); session.commit() is then a no-op.
            await self._resolve_memory_rows(
                session, namespace, observed_ids, mean_score, history, commit=True
            )
            await session.commit()
        if refit_due(
            recorded.queries_since_refit, recorded.query_index + 1, self.settings.refit_every
        ):
            if self.settings.refit_in_background:
                self._start_background_refit(namespace)
            else:
                await self._refit_logged(namespace)
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
        """At most one refit task per namespace in this process. A query that finds one
        running asks it to go once more when it is done (its observations came after the
        running refit read the namespace), so the last query's refit is never skipped, and
        a burst of queries costs at most one extra refit. Other processes are kept out by the
        refit's advisory lock."""
        running = self._background_refits.get(namespace)
        if running is not None and not running.done():
            self._refit_again.add(namespace)
            return
        task = asyncio.create_task(self._refit_until_current(namespace),
                                   name=f"earm-refit:{namespace}")
        self._background_refits[namespace] = task
        task.add_done_callback(lambda _: self._forget_refit(namespace, task))

    async def _refit_until_current(self, namespace: str) -> None:
        await self._refit_logged(namespace)
        while namespace in self._refit_again:
            self._refit_again.discard(namespace)
            await self._refit_logged(namespace)

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
        history: RowObservations | None = None,
        commit: bool = False,
    ) -> None:
        """Re-solve the rows of ``memory_ids`` from all their observations (``history``, when
        the caller already read it in the same transaction); ``commit`` ends the transaction
        with the write."""
        if len(memory_ids) == 0:
            return
        if history is None:
            history = await experience.memory_row_observations(
                session, memory_ids, self.settings.rank
            )
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
        await model_state.upsert_memory_factors(
            session,
            namespace,
            update.memory_ids,
            update.bias,
            update.factors,
            update.observation_count,
            commit=commit,
        )

    # ---------------------------------------------------------------------------- feedback

    async def feedback(
        self, namespace: str, query_id: int, memory_ids: Sequence[int], scores: Sequence[float]
    ) -> FeedbackResult:
        """Record client observations for a past query.

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
            state = await namespace_state(session, namespace, for_update=True)
            similarities = await experience.feedback_similarities(session, namespace, query_id, ids)
            inserted_ids, inserted_scores = await experience.insert_scores(
                session, namespace, query_id, ids, similarities, values, "feedback"
            )
            if len(inserted_ids):
                await model_state.add_feedback_to_mean(session, namespace, inserted_scores)
                observed, cell_similarities, bias, factors = await experience.query_observations(
                    session, query_id, self.settings.rank
                )
                query = fold_in_with_similarity(
                    state.mean_score, bias, factors, cell_similarities, observed, self.settings.reg
                )
                await model_state.update_query_factors(
                    session,
                    np.array([query_id]),
                    np.array([query.bias]),
                    np.array([query.slope]),
                    query.factors[None, :],
                )
                await self._resolve_memory_rows(session, namespace, inserted_ids, state.mean_score)
            await session.commit()
        return FeedbackResult(
            recorded=len(inserted_ids), already_observed=len(ids) - len(inserted_ids)
        )

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
            if not await try_lock_namespace_refit(session, namespace):
                return False
            try:
                observations = await experience.namespace_observations(session, namespace)
                # Sorting up to millions of ids: off the event loop, and once for the fetch
                # and the fit.
                memory_ids, memory_idx = await asyncio.to_thread(
                    np.unique, observations.memory_ids, return_inverse=True
                )
                # The fetch commits: no transaction stays open during the fit.
                embeddings = await memory_embeddings(
                    session, memory_ids, self.settings.embedding_dim
                )
                fitted = await asyncio.to_thread(
                    self._fit, observations, memory_ids, memory_idx, embeddings
                )
                await model_state.replace_model(
                    session, namespace, fitted, refitted_at=datetime.now(UTC)
                )
                await session.commit()
            finally:
                await session.rollback()  # a failed write must not hide its error in the unlock
                await unlock_namespace_refit(session, namespace)
                await session.commit()
        return True

    def _fit(
        self,
        observations: NamespaceObservations,
        memory_ids: np.ndarray,
        memory_idx: np.ndarray,
        memory_embeddings: np.ndarray,
    ) -> RefittedModel:
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
        return RefittedModel(
            memory_ids=memory_ids,
            memory_bias=model.memory_bias,
            memory_factors=model.memory_factors,
            observation_count=np.bincount(memory_idx, minlength=len(memory_ids)),
            query_ids=query_ids,
            query_bias=model.query_bias,
            query_slope=model.query_slope,
            query_factors=model.query_factors,
            prior=model.prior,
        )
