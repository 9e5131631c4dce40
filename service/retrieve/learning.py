"""Learning from experience: after each retrieve, record it and update the memory rows it
observed online; take client feedback; and run the namespace's full refit now and then (in the
background by default). docs/design.md "Causal completion and online learning" and "Full
refits". No HTTP here."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.api.retrieve import FeedbackResult
from service.completion import fold_in
from service.db import experience, memory_rows, model_state
from service.db import memories as memory_table
from service.db.memory_rows import StoredRows
from service.db.namespaces import NamespaceState, namespace_state
from service.db.record import RecordedQuery, RecordedRetrieve, record_query
from service.db.writes import Writes
from service.errors import InvalidInput, NotFound
from service.ingest.validation import repeats
from service.retrieve.online import feedback_rows, new_cells, update_memory_rows
from service.retrieve.refit_health import RefitOutcome
from service.retrieve.refit_process import InProcessRefits, Refits
from service.settings_groups import LearningSettings
from service.tracing import Cause, current

log = logging.getLogger(__name__)


def refit_due(
    queries_since_refit: int, queries_recorded: int, refit_every: int, refit_growth: float
) -> bool:
    """Refit every ``refit_every`` queries, more often while the namespace is young (each time
    its query count has doubled), so factors are learned early, and less often once it is
    old: not before its queries have grown by ``refit_growth`` since the last refit. A refit
    costs time linear in the observations, which grow with the queries; spacing refits
    geometrically keeps their total work over a namespace's life linear in its observations,
    so the refit work per retrieve stays flat as history grows (about (1 + g) / g refits' worth
    of the final size in all: 5 at g = 0.25). The online row updates keep learning between
    refits. ``refit_growth`` = 0: every ``refit_every`` queries at any size."""
    young_or_periodic = min(refit_every, max(1, queries_recorded // 2))
    grown = refit_growth * (queries_recorded - queries_since_refit)
    return queries_since_refit >= max(young_or_periodic, grown)


#: A memory named in feedback: its id, or the external_id the client stored it under.
MemoryRef = int | str


@dataclass(frozen=True)
class LateObservations:
    """Scores of a recorded query's anchors that landed after its answer (the answer deadline,
    ``service.retrieve.late``), and the HTTP requests their scorer call took."""

    memory_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray  # as the scorer gave them (the record maps them to the common scale)
    anchor_kinds: np.ndarray
    requests: int


#: The queries a refit's trace links to, at most: the latest ones of a burst that asked for it.
MAX_REFIT_CAUSES = 32


def _causes(cause: Cause | None) -> list[Cause]:
    return [] if cause is None else [cause]


class Learner:
    """Writes what a namespace learns; one per pipeline, so per process (it owns the
    process's background refit tasks). Every write goes through ``writes`` (default: the
    ``sessions``, with no replicas to note), so this process's replica reads see it.

    A refit a query makes due runs after the response, in a task of this process; with
    ``refit_in_request`` it runs inside that query's request instead, so a sequential replay
    is exactly reproducible and the request times the refit (tests and benchmarks ask for it
    through the app factory; it is no setting of the service)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: LearningSettings,
        scorer_source: str,
        refits: Refits | None = None,
        writes: Writes | None = None,
        *,
        refit_in_request: bool = False,
    ) -> None:
        self.sessions = sessions
        self.writes = writes or Writes(sessions)
        self.settings = settings
        self.completion = settings.completion
        # What the scorer's observations are recorded as coming from (their scale's key:
        # ``service.providers.factory.scorer_source``).
        self.scorer_source = scorer_source
        self.refits = refits or InProcessRefits(sessions, settings.completion)
        self.refit_in_request = refit_in_request
        # namespace -> its running background refit (the reference keeps the task from being
        # garbage-collected; it is dropped when the task ends)
        self._background_refits: dict[str, asyncio.Task[None]] = {}
        # Namespaces whose running background refit must go once more (see below), with the
        # queries that asked, which that refit's trace links to.
        self._refit_again: dict[str, collections.deque[Cause]] = {}

    async def record_and_learn(
        self, retrieve: RecordedRetrieve, state: NamespaceState, stored: StoredRows
    ) -> RecordedQuery | None:
        """Record the retrieve and its observations, update the observed memory rows online
        (from ``stored``, :meth:`read_rows` of them, and the namespace ``state`` the query
        searched with), and commit, all before the response, so the next query learns from
        this one. None when the namespace was erased since the search: nothing recorded."""
        update = None
        observed = retrieve.observed
        if retrieve.query is not None and len(observed.memory_ids):
            update = await asyncio.to_thread(
                update_memory_rows, state, stored.subset(observed.memory_ids),
                new_cells(retrieve.query, observed), self.completion.memory_reg,
                self.completion.rank,
            )
        recorded = await self.writes.transaction(
            retrieve.namespace,
            lambda session: record_query(session, retrieve, update),
            memories=False,
        )
        if recorded is None:
            return None
        if self.settings.background_work and refit_due(
            recorded.queries_since_refit,
            recorded.query_index + 1,
            self.settings.every,
            self.settings.growth,
        ):
            # (Without background work, the count just recorded is what `earm worker` reads.)
            causes = _causes(current().cause())
            if self.refit_in_request:
                await self.refit_logged(retrieve.namespace, causes)
            else:
                self._start_background_refit(retrieve.namespace, causes)
        return recorded

    async def read_rows(self, namespace: str, memory_ids: np.ndarray) -> StoredRows:
        """What the online update of these memories' rows starts from (a retrieve reads its
        anchors' while the scorer works, so its record needs one round trip)."""
        async with self.sessions() as session:
            return await memory_rows.read_rows(
                session, namespace, memory_ids, self.completion.rank
            )

    async def refit_logged(self, namespace: str, causes: Iterable[Cause] = ()) -> bool:
        """:meth:`refit` for background callers (a query's refit, the worker's loop): a
        failure is counted and logged by the refits' health, not raised; whether the
        namespace was refitted. ``causes``: the queries that made it due."""
        # Its own trace, linked to the queries that made it due: a background refit outlives
        # their answers, and is no part of them.
        attributes = {"gen_ai.memory.store.id": namespace}
        with current().linked_trace("refit", attributes, causes) as span:
            outcome = await self._refit_outcome(namespace)
            span.set({"earm.refit.outcome": outcome.value})
            if outcome is RefitOutcome.FAILED:
                span.fail("refit_failed")
        return outcome is RefitOutcome.REFITTED

    async def _refit_outcome(self, namespace: str) -> RefitOutcome:
        health = self.refits.health
        try:
            refitted = await self.refit(namespace)
        except NotFound:
            # Erased (DELETE /namespaces) after the refit was due: nothing left to refit.
            log.info("namespace %r was erased before its refit", namespace)
            health.ended(namespace, RefitOutcome.ERASED)
            return RefitOutcome.ERASED
        except Exception as error:
            # The query is committed and the online state is consistent; a failed refit is
            # retried later (its counter was not reset), so a client gets its answer instead
            # of an error that would invite a duplicate retry.
            health.failed(namespace, error)
            return RefitOutcome.FAILED
        outcome = RefitOutcome.REFITTED if refitted else RefitOutcome.SKIPPED
        health.ended(namespace, outcome)
        return outcome

    def _start_background_refit(self, namespace: str, causes: list[Cause]) -> None:
        """At most one refit task per namespace in this process. A query that finds one
        running asks it to go once more when it is done (its observations came after the
        running refit read the namespace), so the last query's refit is never skipped, and
        a burst of queries costs at most one extra refit. Other processes are kept out by the
        refit's advisory lock."""
        running = self._background_refits.get(namespace)
        if running is not None and not running.done():
            self._refit_again.setdefault(
                namespace, collections.deque(maxlen=MAX_REFIT_CAUSES)
            ).extend(causes)
            return
        task = asyncio.create_task(self._refit_until_current(namespace, causes),
                                   name=f"earm-refit:{namespace}")
        self._background_refits[namespace] = task
        task.add_done_callback(lambda _: self._forget_refit(namespace, task))

    async def _refit_until_current(self, namespace: str, causes: list[Cause]) -> None:
        await self.refit_logged(namespace, causes)
        while namespace in self._refit_again:
            await self.refit_logged(namespace, self._refit_again.pop(namespace))

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

        async def record(session: AsyncSession) -> FeedbackResult:
            # The lock first: a memory deleted after the check would fail the insert (deletes
            # take the same lock, so the check below sees every one committed).
            state = await namespace_state(session, namespace, for_update=True)
            ids = await self._memory_ids(session, namespace, memories)
            similarities = await experience.feedback_similarities(session, namespace, query_id, ids)
            written = await experience.record_feedback(
                session, namespace, query_id, ids, similarities, values
            )
            await self._relearn_query(session, namespace, query_id, written.memory_ids, state)
            await session.commit()
            return FeedbackResult(recorded=len(written.memory_ids), replaced=written.replaced)

        return await self.writes.transaction(namespace, record, memories=False)

    async def record_late(
        self, namespace: str, query_id: int, late: LateObservations
    ) -> int:
        """Record late scores as the scorer's observations of their query, where the pair has
        none yet (client feedback that came first stays), and relearn from them as feedback
        does; how many were recorded. NotFound when the namespace was erased."""

        async def record(session: AsyncSession) -> int:
            state = await namespace_state(session, namespace, for_update=True)
            written = await experience.record_late_scores(
                session, namespace, query_id, late.memory_ids,
                (late.similarities, late.scores, late.anchor_kinds),
                (self.scorer_source, late.requests),
            )
            if len(written):
                await self._relearn_query(session, namespace, query_id, written, state)
            await session.commit()
            return len(written)

        return await self.writes.transaction(namespace, record, memories=False)

    async def _relearn_query(
        self,
        session: AsyncSession,
        namespace: str,
        query_id: int,
        changed_ids: np.ndarray,
        state: NamespaceState,
    ) -> None:
        """The query's observations of ``changed_ids`` changed: its parameters are solved
        again from all of them, then the memory rows relearned (``state``: the namespace's, as
        read under its lock). Under the namespace's lock."""
        observed, cell_similarities, bias, factors = await experience.query_observations(
            session, namespace, query_id, self.completion.rank
        )
        if self.completion.model == "plain":
            cell_similarities = np.zeros_like(cell_similarities)  # the plain model has no slope
        query = fold_in(
            state.mean_score, bias, factors, cell_similarities, observed, self.completion.reg,
            factor_reg=state.factor_reg,
        )
        await model_state.update_query_factors(
            session,
            namespace,
            np.array([query_id]),
            np.array([query.bias]),
            np.array([query.slope]),
            query.factors[None, :],
        )
        await self._relearn_after_feedback(session, namespace, query_id, changed_ids, state)

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
        state: NamespaceState,
    ) -> None:
        """The query's parameters moved: the statistics of every memory it observed are
        rebuilt and stored, and the rows that got feedback re-solved
        (:func:`~service.retrieve.online.feedback_rows`)."""
        ids = np.unique(await experience.query_memory_ids(session, namespace, query_id))
        history = await memory_rows.memory_row_observations(
            session, namespace, ids, self.completion.rank
        )
        rows = feedback_rows(
            history, ids, fed_back_ids, state.mean_score, self.completion.memory_reg,
            state.factor_reg,
        )
        await memory_rows.store_row_statistics(
            session, namespace, rows.memory_ids, rows.statistics
        )
        await model_state.upsert_memory_factors(session, namespace, rows.fed_back)

    # ------------------------------------------------------------------------------- refit

    async def refit(self, namespace: str) -> bool:
        """Full refit of a namespace's model from all its observations. Returns False when
        another process holds the refit lock (it will do the work). The refit writes with
        a connection of its own, maybe in another process: its write is noted here."""
        refitted = await self.refits.refit(namespace)
        if refitted:
            await self.writes.noted(namespace, memories=False)
        return refitted
