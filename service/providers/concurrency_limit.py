"""How many requests a scorer keeps in flight to its backend: a window that adapts to what the
backend bears, additive increase and multiplicative decrease (AIMD), in the manner of Netflix's
concurrency-limits and of TCP's congestion window, and, with the queue signal on
(``EARM_SCORER_QUEUE_SIGNAL``; off by default), a cut to what a backend that queues works on.

The window grows by one per window of successes up to its ceiling,
and halves when the backend says it is overloaded: a 429 or 503, or a request that got no
answer at all (refused, reset). It halves once per window, not once per failed request: a
signal from a request admitted before the last decrease is about the old window, which was
already cut (200 requests answered 429 at once halve it once).

A backend that works on a few calls at once and queues the rest without a word (llama.cpp's
slots, Ollama's ``OLLAMA_NUM_PARALLEL``) never says it is overloaded. Its latency says it, but
not latency alone: an LLM's varies 2-3 x with its prompt at a hosted API that queues nothing,
and the usual latency of a backend that queues from a retrieve's first call is the queued one
(a gradient of recent against usual latency was measured to fail there: docs/performance.md,
T10). What tells them apart is how the latency goes with the requests at the backend when
each was sent (:class:`QueueEstimate`): behind a queue each request more adds a service time
over the backend's slots (Little's law: its answers per second stop growing), so the latency
rises in line with them; a latency that varies with the prompt does not.

The rule (off by default: a parallel ``/rerank`` backend whose few requests each cost it a
little serialized CPU was cut to one request at a time, docs/performance.md T10): over the
last answers (twice the ceiling), fit latency against the requests at the
backend. If it rises significantly (by a millisecond a request or more, and by three standard
errors), the backend queues, and works on about as many calls as Vegas's estimate says: an
answer's requests at the backend x the least latency / its latency (the 75th percentile over
the answers; the least latency is remembered eight times longer, since a backend kept busy
answers none at its unqueued one). The window is cut to twice that, rounded down (one
waiting behind each worked on), and grows no further until that many answers again show no
rise. The fit needs requests sent at different counts at the backend: a retrieve's first
ones, sent as the window fills, give them; so those first requests reach the backend before
their answers tell it queues (up to the window), and a load that holds the count at the
window tells nothing new. A latency that rises with the order the requests are sent in looks
like a queue: memories sent shortest first cut the window (docs/performance.md, T10, has the
figures). A rise under a millisecond a request is not taken for a queue: a backend's CPU per
request (a loopback judge's) shows as one.

The latency is the backend's: from the request's head being written to its answer
(``service.providers.http_client.Answer``), not the waits in the client's own pool (a free
connection, a connect slot), which would often be ours.

Written here because no maintained Python library does it: Netflix's library is Java, and the
asyncio ones on PyPI (ace-concurrency, aimd-limiter, adaptive-concurrency) are single 0.1
releases.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["AIMDLimit", "Admission", "QueueEstimate"]


@dataclass(frozen=True)
class Admission:
    """One request let in: which decrease of the window it was admitted after."""

    epoch: int


class QueueEstimate:
    """How many calls at once a backend works on, from its latency against the requests at it
    when each was sent: a least-squares line over the last ``size`` answers, kept as running
    sums (recomputed once per ``size`` answers, so rounding does not drift), and the least
    latency of the last ``HORIZON`` x ``size`` answers (its unqueued latency: a backend kept
    busy answers none at that in the last ``size`` alone)."""

    #: Answers before any estimate; the slope's least multiple of its standard error; the
    #: least latency's memory, in samples of ``size`` answers.
    MIN_ANSWERS = 8
    SIGNIFICANT = 3.0
    HORIZON = 8
    QUANTILE = 0.75
    #: The least rise per request at the backend taken for a queue: a backend's CPU per request
    #: shows as a rise (a loopback judge's: its answers go out one after the other), which a
    #: model's slots (tens of milliseconds a request and more) are far above.
    LEAST_SLOPE_S = 0.001

    def __init__(self, size: int) -> None:
        self.size = max(size, self.MIN_ANSWERS)
        self._answers: collections.deque[tuple[int, float]] = collections.deque()
        self._sums = [0.0] * 5  # answers, sum of x, of y, of x * x, of x * y
        self._yy = 0.0
        self._until_recount = self.size
        self._least_before: collections.deque[float] = collections.deque(maxlen=self.HORIZON)
        self._least = math.inf  # of the answers since the last recount

    def add(self, at_backend: int, latency_s: float) -> None:
        """One answer: ``at_backend`` requests were at the backend as it was sent, itself
        included, and it took ``latency_s``."""
        self._answers.append((at_backend, latency_s))
        self._count(at_backend, latency_s, 1.0)
        self._least = min(self._least, latency_s)
        if len(self._answers) > self.size:
            self._count(*self._answers.popleft(), -1.0)
        self._until_recount -= 1
        if self._until_recount <= 0:
            self._sums, self._yy = [0.0] * 5, 0.0
            for x, y in self._answers:
                self._count(x, y, 1.0)
            self._until_recount = self.size
            self._least_before.append(self._least)
            self._least = math.inf

    def _count(self, x: int, y: float, sign: float) -> None:
        sums = self._sums
        sums[0] += sign
        sums[1] += sign * x
        sums[2] += sign * y
        sums[3] += sign * x * x
        sums[4] += sign * x * y
        self._yy += sign * y * y

    def works_on(self) -> float | None:
        """Calls the backend works on at once (the least latency x the requests at it per
        second of latency, the 75th percentile of the answers'), or ``None`` while its latency
        does not rise significantly with the requests at it."""
        n, sx, sy, sxx, sxy = self._sums
        if n < self.MIN_ANSWERS:
            return None
        vxx = sxx - sx * sx / n
        if vxx <= 0:
            return None
        vxy = sxy - sx * sy / n
        slope = vxy / vxx
        if slope < self.LEAST_SLOPE_S:
            return None
        residual = max(0.0, self._yy - sy * sy / n - slope * vxy) / (n - 2)
        if slope <= self.SIGNIFICANT * math.sqrt(residual / vxx):
            return None
        rates = sorted(x / y for x, y in self._answers if y > 0)
        if not rates:
            return None
        return min((self._least, *self._least_before)) * rates[int(len(rates) * self.QUANTILE)]


class AIMDLimit:
    """A semaphore whose size (:attr:`window`, between 1 and ``ceiling``) adapts. Starts at the
    ceiling: a backend that bears it never sees a difference. ``queue_signal``: whether answers'
    latencies may cut it (:class:`QueueEstimate`); :attr:`queue_bound` is what they allow."""

    def __init__(self, ceiling: int, backoff_ratio: float = 0.5,
                 queue_signal: bool = False) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        self.ceiling = ceiling
        self.backoff_ratio = backoff_ratio
        self.window = ceiling  # requests let in flight at once now
        self.queue = QueueEstimate(2 * ceiling) if queue_signal else None
        # Twice what a queueing backend works on, or the ceiling; and the answers since its
        # latency last rose significantly with the requests at it.
        self.queue_bound = ceiling
        self._unqueued_answers = 0
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

    def succeeded(self, latency_s: float | None = None, at_backend: int = 0) -> None:
        """A request was answered normally: one more request per window of them, but not past
        twice what the backend works on if it queues. ``latency_s``: the backend's time for
        it, ``at_backend`` the requests at the backend as it was sent (itself included)."""
        if self.queue is not None and latency_s is not None and at_backend > 0:
            self.queue.add(at_backend, latency_s)
            works_on = self.queue.works_on()
            if works_on is not None:
                self.queue_bound = max(1, min(self.ceiling, math.floor(2 * works_on)))
                self._unqueued_answers = 0
            else:
                # Kept for as long as the least latency is remembered: a window held at the
                # bound keeps the requests at the backend too alike in number to show the queue
                # in every sample of answers.
                self._unqueued_answers += 1
                if self._unqueued_answers >= self.queue.size * self.queue.HORIZON:
                    self.queue_bound = self.ceiling
            if self.window > self.queue_bound:
                self.window = self.queue_bound
                self._epoch += 1  # a 429 let in before is about the larger window
                self._successes = 0
                return
        self._successes += 1
        if self._successes >= self.window and self.window < self.queue_bound:
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
