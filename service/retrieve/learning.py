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

from service.completion import (
    CompletionModel,
    QueryParameters,
    fit_model,
    fold_in,
)
from service.completion.statistics import (
    RowObservations,
    RowStatistics,
    packed_length,
    row_statistics,
    solve_from_statistics,
)
from service.db import experience, model_state
from service.db import memories as memory_table
from service.db.codecs import real_as_read
from service.db.experience import (
    NamespaceObservations,
    QueryTrace,
    RecordedQuery,
    StoredRows,
)
from service.db.model_state import MemoryRowUpdate, OnlineUpdate, RefittedModel
from service.db.namespaces import (
    NamespaceState,
    namespace_state,
    try_lock_namespace_refit,
    unlock_namespace_refit,
)
from service.db.search import memory_embeddings
from service.errors import InvalidInput, NotFound
from service.ingest.validation import repeats
from service.retrieve.rerank import Ranking
from service.settings import Settings

log = logging.getLogger(__name__)


def update_memory_rows(
    state: NamespaceState,
    stored: StoredRows,
    new_cells: RowObservations,
    reg: float,
    rank: int,
) -> OnlineUpdate:
    """Online update of the rows a query observed, at a cost independent of their history:
    each row's stored statistics plus the query's new cells, re-solved with the mean of the
    namespace ``state`` the query searched with (its refit stamp goes with the update).
    Rows without stored statistics are built from their whole history instead (read before
    this query's cells were recorded). Stored statistics of another rank (EARM_RANK changed)
    count as none until the next refit, as stored factors do."""
    ids = stored.memory_ids
    statistics = RowStatistics.zeros(len(ids), rank)
    usable = {
        position: packed for position, packed in enumerate(stored.statistics)
        if packed is not None and len(packed) == packed_length(rank)
    }
    if usable:
        unpacked = RowStatistics.unpack(list(usable.values()), rank)
        positions = list(usable)
        statistics.gram[positions], statistics.moment[positions] = unpacked.gram, unpacked.moment
    added = new_cells.subset(np.isin(new_cells.memory_ids, ids)).statistics(ids)
    statistics = statistics + added + stored.history.statistics(ids)
    bias, factors = solve_from_statistics(state.mean_score, statistics, reg)
    return OnlineUpdate(
        ids, bias, factors, statistics.counts, statistics.packed(),
        versions=stored.versions, added=added.packed(), added_counts=added.counts,
        refitted_at=state.refitted_at,
    )


def refit_due(queries_since_refit: int, queries_recorded: int, refit_every: int) -> bool:
    """Refit every ``refit_every`` queries, and more often while the namespace is young (each
    time its query count has grown by half), so factors are learned early. Still O(log n)
    refits before the steady period."""
    return queries_since_refit >= min(refit_every, max(1, queries_recorded // 2))


@dataclass(frozen=True)
class FeedbackResult:
    """Scores recorded, and how many of them replaced an earlier observation of their pair
    (the scorer's, or earlier feedback: the latest feedback wins)."""

    recorded: int
    replaced: int


#: A memory named in feedback: its id, or the external_id the client stored it under.
MemoryRef = int | str


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
        observed_prior_offsets: np.ndarray,
        state: NamespaceState,
        family_key: bytes | None,
        reused_ids: np.ndarray,
        reuse_saved_calls: int,
        trace: QueryTrace,
        stored: StoredRows,
    ) -> RecordedQuery:
        """Record the query and its observations, update the observed memory rows online
        (from ``stored``, :meth:`read_rows` of them, and the namespace ``state`` the query
        searched with), and commit, all before the response, so the next query learns from
        this one.

        Cells reused from the query's family (``reused_ids``) are recorded as ids only, never
        as observations: the judgement already has its row, and learning counts it once."""
        update = None
        if ranking.query is not None and len(observed_ids):
            new_cells = _new_cells(
                ranking.query, observed_ids, observed_similarities, observed_scores,
                observed_prior_offsets,
            )
            update = await asyncio.to_thread(
                update_memory_rows, state, stored.subset(observed_ids), new_cells,
                self.settings.memory_reg, self.settings.rank,
            )
        async with self.sessions() as session:
            recorded = await experience.record_query(
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
                family_key=family_key,
                reused_ids=reused_ids,
                reuse_saved_calls=reuse_saved_calls,
                trace=trace,
                update=update,
            )
        if self.settings.background_work and refit_due(
            recorded.queries_since_refit, recorded.query_index + 1, self.settings.refit_every
        ):
            # (Without background work, the count just recorded is what `earm worker` reads.)
            if self.settings.refit_in_background:
                self._start_background_refit(namespace)
            else:
                await self.refit_logged(namespace)
        return recorded

    async def read_rows(self, memory_ids: np.ndarray) -> StoredRows:
        """What the online update of these memories' rows starts from (a retrieve reads its
        anchors' while the scorer works, so its record needs one round trip)."""
        async with self.sessions() as session:
            return await experience.read_rows(session, memory_ids, self.settings.rank)

    async def refit_logged(self, namespace: str) -> bool:
        """:meth:`refit` for background callers (a query's refit, the worker's loop): a
        failure is logged, not raised; whether the namespace was refitted."""
        try:
            return await self.refit(namespace)
        except NotFound:
            # Erased (DELETE /namespaces) after the refit was due: nothing left to refit.
            log.info("namespace %r was erased before its refit", namespace)
        except Exception:
            # The query is committed and the online state is consistent; a failed refit is
            # retried later (its counter was not reset), so a client gets its answer instead
            # of an error that would invite a duplicate retry.
            log.exception("full refit of namespace %r failed", namespace)
        return False

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
        await self.refit_logged(namespace)
        while namespace in self._refit_again:
            self._refit_again.discard(namespace)
            await self.refit_logged(namespace)

    def _forget_refit(self, namespace: str, task: asyncio.Task[None]) -> None:
        if self._background_refits.get(namespace) is task:
            del self._background_refits[namespace]

    async def drain(self) -> None:
        """Wait for the background refits started so far (at shutdown, before the database
        closes; and wherever a caller needs the model current)."""
        tasks = list(self._background_refits.values())
        if tasks:
            await asyncio.gather(*tasks)

    # ---------------------------------------------------------------------------- feedback

    async def feedback(
        self,
        namespace: str,
        query_id: int,
        memories: Sequence[MemoryRef],
        scores: Sequence[float],
    ) -> FeedbackResult:
        """Record client observations for a past query; they replace the pairs' earlier
        observations (feedback is authoritative), which are kept in the score history.

        The query's own parameters and the touched memory rows are re-solved at once, so the
        next query already benefits. A memory may be scored once per request: of two scores
        for it, which would be the latest?
        """
        values = np.asarray(scores, dtype=np.float64)
        async with self.sessions() as session:
            # The lock first: a memory deleted after the check would fail the insert (deletes
            # take the same lock, so the check below sees every one committed).
            state = await namespace_state(session, namespace, for_update=True)
            ids = await self._memory_ids(session, namespace, memories)
            similarities = await experience.feedback_similarities(session, namespace, query_id, ids)
            written = await experience.record_feedback(
                session, namespace, query_id, ids, similarities, values
            )
            observed, cell_similarities, bias, factors = await experience.query_observations(
                session, query_id, self.settings.rank
            )
            query = fold_in(
                state.mean_score, bias, factors, cell_similarities, observed, self.settings.reg
            )
            await model_state.update_query_factors(
                session,
                np.array([query_id]),
                np.array([query.bias]),
                np.array([query.slope]),
                query.factors[None, :],
            )
            await self._relearn_after_feedback(
                session, namespace, query_id, written.memory_ids, state.mean_score
            )
            await session.commit()
        return FeedbackResult(recorded=len(written.memory_ids), replaced=written.replaced)

    @staticmethod
    async def _memory_ids(
        session: AsyncSession, namespace: str, memories: Sequence[MemoryRef]
    ) -> np.ndarray:
        """The ids of the memories feedback names, external ids looked up in the namespace;
        NotFound for an unknown external id, InvalidInput for a memory named twice."""
        external_ids = [m for m in memories if isinstance(m, str)]
        known = (
            await memory_table.ids_by_external_id(session, namespace, external_ids)
            if external_ids
            else {}
        )
        if missing := sorted(set(external_ids) - set(known)):
            raise NotFound(
                f"external ids {missing[:10]} do not exist in namespace {namespace!r}"
            )
        ids = [known[m] if isinstance(m, str) else m for m in memories]
        for first, position in repeats(ids):
            raise InvalidInput(
                f"scores[{first}] and scores[{position}] both score memory {ids[first]}"
            )
        return np.asarray(ids, dtype=np.int64)

    async def _relearn_after_feedback(
        self,
        session: AsyncSession,
        namespace: str,
        query_id: int,
        fed_back_ids: np.ndarray,
        mean_score: float,
    ) -> None:
        """The query's parameters moved, so the statistics of every memory it observed are
        rebuilt (they hold its old parameters); the rows that got feedback are re-solved."""
        query_memories = await experience.query_memory_ids(session, query_id)
        ids, statistics = await experience.rebuild_row_statistics(
            session, query_memories, self.settings.rank
        )
        fed_back = np.isin(ids, fed_back_ids)
        touched = RowStatistics(statistics.gram[fed_back], statistics.moment[fed_back])
        bias, factors = solve_from_statistics(mean_score, touched, self.settings.memory_reg)
        await model_state.upsert_memory_factors(
            session,
            namespace,
            MemoryRowUpdate(ids[fed_back], bias, factors, touched.counts, touched.packed()),
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
                read_from = await model_state.refit_horizon(session, namespace)
                await session.commit()  # the lock only orders the read after edits under way
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
                    session, namespace, fitted, refitted_at=datetime.now(UTC), read_from=read_from
                )
                await session.commit()
                log.info(
                    "refitted namespace %r", namespace,
                    extra={"namespace": namespace, "observations": len(observations.scores)},
                )
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
        model = fit_model(
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
        statistics = _refit_statistics(
            observations, memory_idx, query_idx, len(memory_ids), unit_embeddings, model
        )
        return RefittedModel(
            memory_ids=memory_ids,
            memory_bias=model.memory_bias,
            memory_factors=model.memory_factors,
            observation_count=statistics.counts,
            statistics=statistics.packed(),
            query_ids=query_ids,
            query_bias=model.query_bias,
            query_slope=model.query_slope,
            query_factors=model.query_factors,
            prior=model.prior,
        )


def _refit_statistics(
    observations: NamespaceObservations,
    memory_idx: np.ndarray,
    query_idx: np.ndarray,
    n_memories: int,
    unit_embeddings: np.ndarray,
    model: CompletionModel,
) -> RowStatistics:
    """Every memory row's statistics given the refit's query side, with the query factors as
    stored (``real``), so they equal a rebuild from the database up to rounding."""
    prior = model.prior
    prior_offsets = (
        prior.offsets(observations.similarities, (unit_embeddings @ prior.weights)[memory_idx])
        if len(prior.weights)
        else np.zeros(len(observations.scores))
    )
    return row_statistics(
        memory_idx,
        n_memories,
        observations.scores,
        model.query_bias[query_idx]
        + model.query_slope[query_idx] * observations.similarities
        + prior_offsets,
        real_as_read(model.query_factors)[query_idx],
    )


def _new_cells(
    query: QueryParameters,
    memory_ids: np.ndarray,
    similarities: np.ndarray,
    scores: np.ndarray,
    prior_offsets: np.ndarray,
) -> RowObservations:
    """This query's observations as the database stores them (similarity, score and factors
    as ``real``), so incremental statistics equal rebuilt ones up to rounding."""
    n = len(memory_ids)
    return RowObservations(
        memory_ids=np.asarray(memory_ids, dtype=np.int64),
        similarities=real_as_read(similarities),
        scores=real_as_read(scores),
        query_bias=np.full(n, query.bias),
        query_slope=np.full(n, query.slope),
        query_factors=np.tile(real_as_read(query.factors), (n, 1)),
        prior_offsets=np.asarray(prior_offsets, dtype=np.float64),
    )
