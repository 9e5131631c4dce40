"""The answer deadline (``EARM_SCORE_DEADLINE_MS``): a retrieve waits for its anchors' scores
at most the deadline and answers with the ones scored by then (the completion's estimates for
the rest); the anchors still in flight keep being scored, bounded by the scorer's own timeout,
and their scores are recorded as observations of the same query once they land, so what they
cost still buys experience. :class:`LateAnchors` owns those background recordings (one per
pipeline, so per app: the lifespan drains it at shutdown). No HTTP here."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from service.db.record import RecordedQuery
from service.db.search import Candidates
from service.errors import NotFound
from service.providers.scorers import RelevanceScorer, Scores, ScoresInParts
from service.retrieve.learning import LateObservations, Learner
from service.retrieve.score_step import (
    ScoredAnchors,
    score_anchors,
    score_values,
    scored_anchors,
)

log = logging.getLogger(__name__)

#: Told how late anchors ended: ``recorded`` (an observation of their query now), ``superseded``
#: (their pair had one already: client feedback came first, or the memory is gone), ``failed``
#: (the scorer gave no score, or the record failed), ``dropped`` (still pending at shutdown).
LateObserver = Callable[[str, int], None]


@dataclass(frozen=True)
class PendingAnchors:
    """One scorer call that missed the deadline: the anchors it was sent (candidate positions
    and kinds, in the call's order), which of them were answered by then, and the call itself,
    still running."""

    call: asyncio.Task[Scores]
    positions: np.ndarray
    kinds: np.ndarray
    on_time: np.ndarray  # bool, per anchor of the call

    @property
    def late(self) -> int:
        return int(np.count_nonzero(~self.on_time))

    def cancel(self) -> None:
        """The retrieve failed before handing the call on: nothing will record it."""
        self.call.cancel()


async def score_anchors_by(
    scorer: RelevanceScorer,
    query: tuple[str, np.ndarray],
    candidates: Candidates,
    anchors: tuple[np.ndarray, np.ndarray],
    embeddings: np.ndarray,
    deadline: float | None,
) -> tuple[ScoredAnchors, PendingAnchors | None]:
    """One round of :func:`score_anchors` (``query``: text and vector; ``anchors``: positions
    and kinds), waiting until the event loop's time ``deadline`` at most (None: no deadline).
    A scorer that answers in parts (HTTP) gives the pairs answered by then; any other gives all
    or none. The pairs not answered by then are not in the scores: the call goes on in
    :class:`PendingAnchors`."""
    (text, vector), (positions, kinds) = query, anchors
    if deadline is None or len(positions) == 0:
        scored = await score_anchors(scorer, text, vector, candidates, positions, kinds, embeddings)
        return scored, None
    answered: dict[int, float | None] = {}
    texts = [candidates.rows[p]["text"] for p in positions]
    call = asyncio.create_task(
        scorer.score_in_parts(text, vector, texts, embeddings, answered.update)
        if isinstance(scorer, ScoresInParts)
        else scorer.score(text, vector, texts, embeddings)
    )
    try:
        remaining = deadline - asyncio.get_running_loop().time()
        await asyncio.wait({call}, timeout=max(remaining, 0.0))
    except BaseException:
        call.cancel()  # the retrieve was cancelled: nothing will use the call
        raise
    if call.done():
        return scored_anchors(positions, kinds, call.result().values, call.result().requests), None
    # A snapshot: parts answered after this moment are late.
    on_time = dict(answered)
    values = [on_time.get(i) for i in range(len(positions))]
    in_time = np.isin(np.arange(len(positions)), list(on_time))
    scored = scored_anchors(positions, kinds, values, 0)
    # Only pairs that failed by the deadline degrade the answer, not the late ones.
    degraded = bool(np.any(in_time & ~np.isin(positions, scored.positions)))
    return (
        replace(scored, degraded=degraded),
        PendingAnchors(call, positions, kinds, in_time),
    )


class LateAnchors:
    """The late anchors of this app's retrieves, scored and recorded in background tasks owned
    here (the references keep them from being garbage-collected), and their outcomes counted
    (:attr:`outcomes`, and ``observe`` for Prometheus)."""

    def __init__(self, learner: Learner, observe: LateObserver | None = None) -> None:
        self.learner = learner
        self.observe = observe
        self.outcomes: Counter[str] = Counter()
        self._tasks: dict[asyncio.Task[None], int] = {}
        self._closed = False

    @property
    def pending(self) -> int:
        """Late anchors not recorded (nor failed) yet."""
        return sum(self._tasks.values())

    def follow(
        self,
        namespace: str,
        recorded: RecordedQuery | None,
        pending: PendingAnchors,
        candidates: Candidates,
    ) -> None:
        """Record ``pending``'s late anchors to the query ``recorded`` (committed) once they
        are scored. None: the namespace was erased meanwhile, nothing to record them to."""
        if recorded is None or self._closed:
            pending.cancel()
            self._count("failed" if recorded is None else "dropped", pending.late)
            return
        late = ~pending.on_time
        positions = pending.positions[late]
        task = asyncio.create_task(
            self._record(namespace, recorded.query_id, pending, late,
                         (candidates.ids[positions], candidates.similarities[positions])),
            name=f"earm-late:{namespace}:{recorded.query_id}",
        )
        self._tasks[task] = pending.late
        task.add_done_callback(self._tasks.pop)

    async def _record(
        self,
        namespace: str,
        query_id: int,
        pending: PendingAnchors,
        late: np.ndarray,
        cells: tuple[np.ndarray, np.ndarray],
    ) -> None:
        count = int(np.count_nonzero(late))
        try:
            scores = await pending.call
            values = score_values(scores.values)[late]
            ok = ~np.isnan(values)
            memory_ids, similarities = cells
            written = await self.learner.record_late(namespace, query_id, LateObservations(
                memory_ids[ok], similarities[ok], values[ok], pending.kinds[late][ok],
                scores.requests,
            ))
        except asyncio.CancelledError:
            pending.cancel()
            self._count("dropped", count)
            raise
        except NotFound:
            log.info("namespace %r was erased before its late anchors landed", namespace)
            self._count("failed", count)
            return
        except Exception:
            # The answer is out and its query committed: only these observations are lost.
            log.exception("recording the late anchors of query %d failed", query_id)
            self._count("failed", count)
            return
        self._count("recorded", written)
        self._count("superseded", int(np.count_nonzero(ok)) - written)
        self._count("failed", count - int(np.count_nonzero(ok)))

    def _count(self, outcome: str, anchors: int) -> None:
        if anchors <= 0:
            return
        self.outcomes[outcome] += anchors
        if self.observe is not None:
            self.observe(outcome, anchors)

    async def close(self, drain_s: float) -> None:
        """At shutdown: wait at most ``drain_s`` for the late anchors in flight, then drop
        (and count) the rest; later ones are dropped at once."""
        self._closed = True
        tasks = list(self._tasks)
        if not tasks:
            return
        _, unfinished = await asyncio.wait(tasks, timeout=drain_s)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
