"""How many requests a scorer keeps in flight to its backend: a window that adapts to what the
backend bears, additive increase and multiplicative decrease (AIMD), in the manner of Netflix's
concurrency-limits and of TCP's congestion window.

The window grows by one per window of successes up to its ceiling,
and halves when the backend says it is overloaded: a 429 or 503, or a request that got no
answer at all (refused, reset). It halves once per window, not once per failed request: a
signal from a request admitted before the last decrease is about the old window, which was
already cut (200 requests answered 429 at once halve it once).

Latency is not a signal here: the time a request takes at the scorer includes its waits in
the client's own pool (a free connection, a connect slot), so a rise would often be ours.

Written here because no maintained Python library does it: Netflix's library is Java, and the
asyncio ones on PyPI (ace-concurrency, aimd-limiter, adaptive-concurrency) are single 0.1
releases.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["AIMDLimit", "Admission"]


@dataclass(frozen=True)
class Admission:
    """One request let in: which decrease of the window it was admitted after."""

    epoch: int


class AIMDLimit:
    """A semaphore whose size (:attr:`window`, between 1 and ``ceiling``) adapts. Starts at the
    ceiling: a backend that bears it never sees a difference."""

    def __init__(self, ceiling: int, backoff_ratio: float = 0.5) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        self.ceiling = ceiling
        self.backoff_ratio = backoff_ratio
        self.window = ceiling  # requests let in flight at once now
        self._successes = 0  # since the window last changed
        self._epoch = 0  # decreases so far
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[Admission]:
        """Wait until the window has room; the request is in flight inside."""
        await self._wait_for_room()
        self.in_flight += 1
        try:
            yield Admission(self._epoch)
        finally:
            self.in_flight -= 1
            self._wake()

    def succeeded(self) -> None:
        """A request was answered normally: one more request per window of them."""
        self._successes += 1
        if self._successes >= self.window and self.window < self.ceiling:
            self.window += 1
            self._successes = 0
            self._wake()

    def overloaded(self, admission: Admission) -> None:
        """The backend shed the request (429, 503, no answer): halve the window, unless it
        was halved since the request was let in."""
        if admission.epoch != self._epoch:
            return
        self._epoch += 1
        self.window = max(1, int(self.window * self.backoff_ratio))
        self._successes = 0

    async def _wait_for_room(self) -> None:
        while self.in_flight >= self.window:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for room it will not take: pass it on
                raise

    def _wake(self) -> None:
        room = self.window - self.in_flight
        while room > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1
