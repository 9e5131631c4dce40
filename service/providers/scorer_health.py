"""Health of the relevance scorer: how many of its recent calls succeeded.

A failing scorer does not fail requests: ``/retrieve`` answers ``degraded`` with semantic
scores, and the namespaces learn only from the calls that still succeed. :class:`ScorerHealth`
makes that visible. It hears every scored pair (it is a
:class:`service.providers.scorers.ScorerObserver`), keeps the outcomes of the last
:data:`WINDOW_CALLS` calls younger than :data:`MAX_AGE_S`, and
logs a warning, at most once per :data:`WARN_INTERVAL_S`, while most of them fail. ``/stats``
and ``/metrics`` report its :meth:`ScorerHealth.snapshot`. ``/readyz`` stays about the
database: a service whose scorer is down still answers.

One per app (built by the lifespan), so per worker process.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from service.api.stats import MAX_AGE_S, MIN_CALLS, WINDOW_CALLS, ScorerHealthSnapshot
from service.providers.scorers import Outcome

__all__ = [
    "MAX_AGE_S",
    "MIN_CALLS",
    "WARN_INTERVAL_S",
    "WINDOW_CALLS",
    "ScorerHealth",
    "ScorerHealthSnapshot",
]

logger = logging.getLogger(__name__)

#: While unhealthy, the warning is logged at most once per this many seconds.
WARN_INTERVAL_S = 60.0


class ScorerHealth:
    """Rolling window of the scorer's recent call outcomes; ``clock`` is injectable for tests."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.clock = clock
        # (time, succeeded) of each recent call, oldest first, and how many of them succeeded
        # (kept as calls come and go: this runs for every scored pair, so it must not walk the
        # window).
        self._calls: collections.deque[tuple[float, bool]] = collections.deque()
        self._successes = 0
        self._warned_at: float | None = None

    def __call__(
        self, scorer: str, outcome: Outcome, duration_s: float, calls: int = 1
    ) -> None:
        """Record ``calls`` calls that ended alike (the
        :class:`~service.providers.scorers.ScorerObserver` signature)."""
        now = self.clock()
        succeeded = outcome == "ok"
        for _ in range(calls):
            if len(self._calls) == WINDOW_CALLS:
                self._forget_oldest()
            self._calls.append((now, succeeded))
            self._successes += succeeded
        health = self.snapshot()
        if health.healthy or (
            self._warned_at is not None and now - self._warned_at < WARN_INTERVAL_S
        ):
            return
        self._warned_at = now
        logger.warning(
            "relevance scorer %s is failing: %.0f%% of its last %d calls succeeded; retrieves "
            "answer degraded and learning stalls until it recovers",
            self.name, 100.0 * (health.recent_success_rate or 0.0), health.recent_calls,
        )

    def snapshot(self) -> ScorerHealthSnapshot:
        now = self.clock()
        while self._calls and now - self._calls[0][0] > MAX_AGE_S:
            self._forget_oldest()
        calls = len(self._calls)
        if calls == 0:
            return ScorerHealthSnapshot(self.name, 0, None, healthy=True)
        rate = self._successes / calls
        return ScorerHealthSnapshot(
            self.name, calls, rate, healthy=calls < MIN_CALLS or rate >= 0.5
        )

    def _forget_oldest(self) -> None:
        _, succeeded = self._calls.popleft()
        self._successes -= succeeded
