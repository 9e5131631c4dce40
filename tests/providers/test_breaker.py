"""The scorer's circuit breaker against a loopback port: refused connects open it, and then a
call fails ``unavailable`` at once without trying; once a judge listens on the port, the next
probe is answered and the breaker closes."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np

from service.providers.breaker import Breaker
from service.providers.chat_scorer import OpenAIChatScorer
from tests.providers.raw_http import read_request_async

ANSWER = b'{"choices": [{"message": {"content": "0.5"}}]}'


async def judge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A chat-completions judge scoring every pair 0.5."""
    try:
        while True:
            await read_request_async(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def test_a_dead_backend_opens_the_breaker_and_its_return_closes_it() -> None:
    closed_port = socket.socket()  # bound, not listening: connects are refused
    closed_port.bind(("127.0.0.1", 0))
    port = closed_port.getsockname()[1]
    breaker = Breaker(threshold=2, delay_s=0.2)
    scorer = OpenAIChatScorer(base_url=f"http://127.0.0.1:{port}/v1", model="judge",
                              max_retries=0, breaker=breaker)
    memories = ["a", "b"]

    async def score() -> list[float | None]:
        return (await scorer.score("q", np.zeros(4), memories, np.zeros((2, 4)))).values

    async def run() -> None:
        assert await score() == [None, None]  # two refused connects
        assert (breaker.state, scorer.outcomes) == ("open", {"transport_error": 2})
        started = time.perf_counter()
        assert await score() == [None, None]
        assert time.perf_counter() - started < 0.05
        assert scorer.outcomes["unavailable"] == 2  # nothing was sent
        closed_port.close()
        server = await asyncio.start_server(judge, "127.0.0.1", port)
        try:
            await asyncio.sleep(breaker.delay_s)
            probed = await score()  # one request goes as the probe; the other fails at once
            assert sorted(probed, key=lambda value: value is None) == [0.5, None]
            assert breaker.state == "closed"  # the probe was answered
            assert await score() == [0.5, 0.5]
        finally:
            server.close()
            await scorer.aclose()

    asyncio.run(run())
