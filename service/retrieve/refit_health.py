"""Health of the full refits this process runs: how the last ones ended.

A failed refit fails no request (the query is recorded, the namespace stays due and is tried
again at its next query), so nothing else would show that every refit fails: a broken refit
process, a model that no longer fits. :class:`RefitHealth` hears every refit's outcome, counts
them for ``/metrics`` (``earm_refits_total{outcome}``), keeps the current failure streak for
``/readyz``, and logs a failure burst once: the first failure with its traceback, then at most
one line per :data:`WARN_INTERVAL_S` while failures go on, and one line when a refit succeeds
again. A namespace due at every query would otherwise log a traceback per retrieve.

One per app (built by the lifespan) or per worker, so per process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum

from service.api.health import RefitHealthSnapshot

log = logging.getLogger(__name__)

#: While refits keep failing, a reminder is logged at most once per this many seconds.
WARN_INTERVAL_S = 60.0


class RefitOutcome(StrEnum):
    REFITTED = "refitted"
    SKIPPED = "skipped"  # another process held the namespace's refit lock (it refits)
    ERASED = "erased"  # the namespace was erased before its refit
    FAILED = "failed"


#: Counts each refit's outcome (``service.metrics``: ``earm_refits_total{outcome}``).
RefitObserver = Callable[[RefitOutcome], None]


class RefitHealth:
    """The current failure streak of this process's refits; ``clock`` is injectable for tests."""

    def __init__(
        self,
        observer: RefitObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.observer = observer
        self.clock = clock
        self._failures = 0
        self._last_error: str | None = None
        self._last_failure_at: datetime | None = None
        self._warned_at: float | None = None

    def ended(self, namespace: str, outcome: RefitOutcome) -> None:
        """A refit ended without an error (``outcome``: not ``failed``)."""
        if self.observer is not None:
            self.observer(outcome)
        if outcome is RefitOutcome.REFITTED and self._failures:
            log.info(
                "refits succeed again (namespace %r) after %d failures",
                namespace, self._failures,
            )
            self._failures = 0
            self._warned_at = None

    def failed(self, namespace: str, error: BaseException) -> None:
        """A refit raised ``error``: counted, and logged once per burst."""
        if self.observer is not None:
            self.observer(RefitOutcome.FAILED)
        self._failures += 1
        self._last_error = f"{type(error).__name__}: {error}"
        self._last_failure_at = datetime.now(UTC)
        now = self.clock()
        if self._failures == 1:
            # The query is committed and the namespace stays due: its next query retries.
            log.error(
                "full refit of namespace %r failed; it stays due", namespace, exc_info=error
            )
            self._warned_at = now
        elif self._warned_at is None or now - self._warned_at >= WARN_INTERVAL_S:
            log.warning(
                "full refits keep failing: %d in a row, the last of namespace %r: %s",
                self._failures, namespace, self._last_error,
            )
            self._warned_at = now

    def snapshot(self) -> RefitHealthSnapshot:
        return RefitHealthSnapshot(
            healthy=self._failures == 0,
            consecutive_failures=self._failures,
            last_error=self._last_error,
            last_failure_at=self._last_failure_at,
        )
