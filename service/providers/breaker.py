"""The scorer's circuit breaker: a backend that refused ``threshold`` connects in a row is taken
as down, and its requests fail at once (outcome ``unavailable``) instead of each trying to
connect, so retrieves answer degraded without delay. Every ``delay_s`` while open, one request
goes through as a probe: an answer (any status) closes the breaker, a refused connect keeps it
open for another ``delay_s``. A probe that ends otherwise (timeout, reset) leaves it open, and
the next probe goes ``delay_s`` after it, so no probe can leave the breaker stuck.

Only connects count: a backend that answers, even 429 or 5xx, is up (the retries and the
concurrency window handle it), and a deadline that ends a call says nothing of the backend.
:class:`service.providers.scorer_health.ScorerHealth` reports what the calls' outcomes say; the
breaker decides whether to send them.

Written here rather than taken from a library: ``circuitbreaker``, the maintained one that
runs coroutines, counts a call cancelled by its deadline as a success (closing the breaker),
keeps every breaker in a process-wide registry, and is untyped; ``pybreaker`` runs coroutines
through Tornado only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["Breaker", "BreakerState"]

BreakerState = Literal["closed", "open"]


class Breaker:
    """Consecutive refused connects of one backend; ``clock`` is injectable for tests."""

    def __init__(self, threshold: int, delay_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        self.threshold = threshold
        self.delay_s = delay_s
        self.clock = clock
        self._refused = 0  # connects refused in a row
        self._next_probe: float | None = None  # while open: when a request may go as a probe

    @property
    def state(self) -> BreakerState:
        return "closed" if self._next_probe is None else "open"

    def allows(self) -> bool:
        """Whether a request may be sent now: always while closed; while open, one per
        ``delay_s`` (the probe)."""
        if self._next_probe is None:
            return True
        now = self.clock()
        if now < self._next_probe:
            return False
        self._next_probe = now + self.delay_s
        return True

    def refused(self) -> None:
        """A connect to the backend failed."""
        self._refused += 1
        if self._refused >= self.threshold and self._next_probe is None:
            self._next_probe = self.clock() + self.delay_s

    def answered(self) -> None:
        """The backend answered a request: it is up."""
        self._refused = 0
        self._next_probe = None
