"""The scorers' adaptive concurrency window: halved once per window when the backend sheds
load, grown back by one per window of answers; requests beyond it wait; an HTTP scorer's
window against a loopback backend that answers 429 for a while; and the window cut to twice
what a backend that queues silently works on, but not for a latency that varies without a
queue."""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections.abc import Callable

import numpy as np
import pytest

from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.concurrency_limit import AIMDLimit, QueueEstimate
from service.providers.http_client import PoolLimits
from service.testing import HTTPFault, LoopbackServer, chat_completions_app
from tests.providers.raw_http import _content_length

Serve = Callable[[object], LoopbackServer]



def test_the_window_halves_once_per_window_of_overloaded_requests() -> None:
    async def run() -> list[int]:
        limit = AIMDLimit(16)
        windows = []
        async with limit.admitted() as first, limit.admitted() as second:
            limit.overloaded(first)
            limit.overloaded(second)  # let in before the decrease: about the old window
            windows.append(limit.window)
        async with limit.admitted() as third:
            limit.overloaded(third)
            windows.append(limit.window)
        for _ in range(10):
            async with limit.admitted() as admission:
                limit.overloaded(admission)
        windows.append(limit.window)
        return windows

    assert asyncio.run(run()) == [8, 4, 1]


def test_the_window_grows_by_one_per_window_of_successes_up_to_its_ceiling() -> None:
    limit = AIMDLimit(6)
    asyncio.run(_overload(limit, times=2))
    assert limit.window == 1
    grown = []
    for _ in range(1 + 2 + 3 + 4 + 5 + 6):
        limit.succeeded()
        grown.append(limit.window)
    assert grown[0] == 2 and grown[2] == 3 and grown[5] == 4 and grown[9] == 5
    assert grown[-1] == 6  # the ceiling


async def _overload(limit: AIMDLimit, times: int) -> None:
    for _ in range(times):
        async with limit.admitted() as admission:
            limit.overloaded(admission)


def test_requests_beyond_the_window_wait_and_a_grown_window_lets_them_in() -> None:
    async def run() -> list[int]:
        limit = AIMDLimit(4)
        await _overload(limit, times=1)  # window 2
        inside: list[int] = []
        release = asyncio.Event()

        async def request() -> None:
            async with limit.admitted():
                inside.append(limit.in_flight)
                await release.wait()

        tasks = [asyncio.create_task(request()) for _ in range(4)]
        await asyncio.sleep(0.01)
        seen = [len(inside)]
        for _ in range(2):  # a window of successes: room for a third
            limit.succeeded()
        await asyncio.sleep(0.01)
        seen.append(len(inside))
        tasks[-1].cancel()  # a waiter that gives up takes no room
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen + [max(inside), limit.in_flight]

    assert asyncio.run(run()) == [2, 3, 3, 0]


def test_an_http_scorers_window_shrinks_on_429s_and_grows_back(serve: Serve) -> None:
    shedding = True

    async def reply(prompt: str) -> str:
        await asyncio.sleep(0.01)  # requests overlap at the backend
        if shedding:
            raise HTTPFault(429, "rate limited", headers={"Retry-After": "0"})
        return "0.5"

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = OpenAIChatScorer(base_url=server.url + "/v1", model="judge", concurrency=16,
                              max_retries=0)
    memories = [f"m{i}" for i in range(16)]

    async def score() -> list[float | None]:
        return (await scorer.score("q", np.zeros(4), memories, np.zeros((16, 4)))).values

    async def run() -> list[int]:
        nonlocal shedding
        try:
            windows = [scorer.limit.window]
            assert await score() == [None] * 16  # its 429s, all let in at once, halve it once
            windows.append(scorer.limit.window)
            shedding = False
            app.state.max_in_flight = 0
            assert await score() == [0.5] * 16
            windows.append(app.state.max_in_flight)  # the shrunk window held the backend
            while scorer.limit.window < 16:
                assert await score() == [0.5] * 16
            windows.append(scorer.limit.window)
            return windows
        finally:
            await scorer.aclose()

    assert asyncio.run(run()) == [16, 8, 8, 16]


# --- the queue signal -------------------------------------------------------------------------


def test_a_latency_rising_with_the_requests_at_the_backend_tells_how_many_it_works_on() -> None:
    queue = QueueEstimate(64)
    for at_backend in range(1, 33):  # 4 slots of 100 ms, first come first served
        queue.add(at_backend, 0.1 * math.ceil(at_backend / 4))
    works_on = queue.works_on()
    assert works_on is not None and 3.5 <= works_on <= 4.5


def test_a_latency_that_varies_3x_whatever_the_requests_at_the_backend_tells_nothing() -> None:
    rng = random.Random(3)
    queue = QueueEstimate(128)
    estimates = []
    for _ in range(1000):  # an LLM's 1 to 3 s: its slope's noise is over a millisecond
        queue.add(rng.randint(1, 64), rng.uniform(1, 3))
        estimates.append(queue.works_on())
    assert estimates.count(None) >= 990  # a slope of three standard errors, by chance


def test_a_rise_of_less_than_a_millisecond_per_request_is_not_a_queue() -> None:
    queue = QueueEstimate(64)  # an instant backend: the client's and its CPU per request
    for at_backend in range(1, 65):
        queue.add(at_backend, 0.002 + 0.0005 * at_backend)
    assert queue.works_on() is None


class LeanJudge:
    """A chat-completions judge on loopback, on an asyncio event loop of its own (a daemon
    thread) and a few lines of HTTP (a web framework's CPU per request would be a queue of its
    own): it works on ``slots`` calls at once (0: all), each for ``latency_s(body)``, and
    queues the rest without a word. ``most``: the most calls it had at once, waiting or worked
    on, since it was last set to 0."""

    def __init__(self, latency_s: Callable[[bytes], float], slots: int = 0) -> None:
        self.latency_s = latency_s
        self.slots = slots
        self.at_once = self.most = 0
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve_forever(),), daemon=True).start()
        assert self._ready.wait(10)

    async def _serve_forever(self) -> None:
        self._gate = asyncio.Semaphore(self.slots) if self.slots else None
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=256)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        await server.serve_forever()

    async def _work(self, body: bytes) -> None:
        if self._gate is None:
            await asyncio.sleep(self.latency_s(body))
            return
        async with self._gate:
            await asyncio.sleep(self.latency_s(body))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answer = b'{"choices": [{"message": {"content": "0.5"}}]}'
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_content_length(head))
                self.at_once += 1
                self.most = max(self.most, self.at_once)
                try:
                    await self._work(body)
                finally:
                    self.at_once -= 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def score_calls(judge: LeanJudge, memories: list[str], calls: int,
                queue_signal: bool = True) -> list[tuple[int, int]]:
    """The most calls ``judge`` had at once in each of ``calls`` scoring calls of ``memories``
    by one chat scorer (the shipped pool: a window of at most 64; the queue signal on unless
    ``queue_signal`` is false), and the window after it."""
    scorer = OpenAIChatScorer(base_url=judge.url + "/v1", model="judge", max_retries=0,
                              timeout_s=60.0,
                              pool=PoolLimits(queue_signal=True) if queue_signal else PoolLimits())
    pairs = len(memories)

    async def run() -> list[tuple[int, int]]:
        seen = []
        try:
            for _ in range(calls):
                judge.most = 0
                scores = await scorer.score("q", np.zeros(4), memories, np.zeros((pairs, 4)))
                assert scores.values == [0.5] * pairs
                seen.append((judge.most, scorer.limit.window))
            return seen
        finally:
            await scorer.aclose()

    return asyncio.run(run())


def test_a_backend_that_queues_silently_gets_twice_what_it_works_on_after_a_first_call() -> None:
    judge = LeanJudge(lambda body: 0.1, slots=4)  # answers 4 a time, 100 ms each
    seen = score_calls(judge, [f"m{i}" for i in range(80)], calls=3)
    # The first call's leave as the pool opens, before answers; then twice the 4 slots, or one
    # more on a busy machine (a request sent as a slot frees counts one more than it waits on).
    for most, window in seen[1:]:
        assert most <= 9 and 4 <= window <= 9, seen


def test_without_the_queue_signal_a_backend_that_queues_silently_gets_the_whole_window() -> None:
    """EARM_SCORER_QUEUE_SIGNAL=false, the default: nothing but a 429, a 503 or no answer
    lowers the window."""
    judge = LeanJudge(lambda body: 0.02, slots=4)
    seen = score_calls(judge, [f"m{i}" for i in range(120)], calls=2, queue_signal=False)
    assert [window for _, window in seen] == [64, 64] and seen[1][0] == 64, seen


@pytest.mark.parametrize("varies", ["at random", "with the prompt"])
def test_a_latency_that_varies_3x_without_a_queue_keeps_the_window_at_its_ceiling(
        varies: str) -> None:
    rng = random.Random(5)
    lengths = [rng.randint(10, 8000) for _ in range(200)]
    # 80 ms and more: this process handles the 64 calls in flight at both ends, a few ms of
    # CPU that a busy machine stretches; a latency near that would rise with the calls in
    # flight, a queue of the test's own.
    if varies == "at random":
        judge = LeanJudge(lambda body: 0.08 * rng.uniform(1, 3))
    else:  # 80 to 240 ms with the memory's length, memories in no order of length
        judge = LeanJudge(lambda body: 0.08 * (1 + 2 * min(len(body), 8000) / 8000))
    memories = [f"m{i} " + "x" * n for i, n in enumerate(lengths)]
    seen = score_calls(judge, memories, calls=4)
    assert [window for _, window in seen] == [64] * 4
    assert [most for most, _ in seen[1:]] == [64] * 3
