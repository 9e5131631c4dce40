"""The scorers' adaptive concurrency window: halved once per window when the backend sheds
load, grown back by one per window of answers; requests beyond it wait; and an HTTP scorer's
window against a loopback backend that answers 429 for a while."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.concurrency_limit import AIMDLimit
from service.testing import HTTPFault, LoopbackServer, chat_completions_app

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
