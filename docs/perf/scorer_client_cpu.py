"""The scorer client's CPU per chat request, side by side in one run: httpx's ``AsyncClient``,
aiohttp's ``ClientSession`` and the service's ``ScorerClient`` (aiohttp's, pooled under the
scorer's bounds and reading answers up to its cap), each sending 35 and then 200
requests at once (a retrieve's anchors at the schedule's last stage, and a large retrieve's) on
uvloop to an instant loopback judge served by a child process; then the service's whole
``OpenAIChatScorer.score`` of 35 and of 200 pairs (prompt building, JSON, parsing included).
Each client keeps one pool of as many connections as requests in flight, opened before the
clock starts (the scorer's own, of ``EARM_SCORER_MAX_CONNECTIONS``, for its whole calls).
CPU is this process's (``time.process_time``), so the judge's own work is not counted.

    PYTHONPATH=.:bench python docs/perf/scorer_client_cpu.py
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import aiohttp
import httpx
import numpy as np
import uvloop

from earm_bench.common.chat_server import ChatServer
from earm_bench.common.processes import child_server
from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.http_client import PoolLimits, ScorerClient, encode_json

#: Requests per measured client and concurrency: enough rounds that a run's CPU is ~1 s.
REQUESTS = 4200
CONCURRENCY = (35, 200)
QUERY = "what did Caroline do on 7 May?"
MEMORY = "Caroline went to the LGBTQ support group on 7 May and found it powerful. " * 2
BODY = OpenAIChatScorer("http://x/v1", "m").plan(QUERY, [MEMORY])[0].body
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}

Send = Callable[[int], Awaitable[object]]


def reply(prompt: str) -> str:
    return "0.7"


async def cpu_per_request(send: Send, concurrent: int) -> float:
    """Microseconds of this process's CPU per request, ``concurrent`` requests at a time."""
    await asyncio.gather(*(send(slot) for slot in range(concurrent)))  # connections opened
    rounds = REQUESTS // concurrent
    started = time.process_time()
    for _ in range(rounds):
        await asyncio.gather(*(send(slot) for slot in range(concurrent)))
    return (time.process_time() - started) / (rounds * concurrent) * 1e6


async def clients(endpoint: str, concurrent: int, stack: AsyncExitStack) -> dict[str, Send]:
    """Each client's way to send one request (and read its JSON), pooled for ``concurrent``."""
    body = encode_json(BODY)
    client = await stack.enter_async_context(httpx.AsyncClient(
        limits=httpx.Limits(max_connections=concurrent, max_keepalive_connections=concurrent)))
    session = await stack.enter_async_context(aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrent), skip_auto_headers=("Accept-Encoding",)))
    ours = ScorerClient(endpoint, PoolLimits(connections=concurrent))
    stack.push_async_callback(ours.aclose)

    async def with_httpx(slot: int) -> object:
        return (await client.post(endpoint, content=body, headers=HEADERS)).json()

    async def with_aiohttp(slot: int) -> object:
        async with session.post(endpoint, data=body, headers=HEADERS) as response:
            return await response.json()

    async def with_ours(slot: int) -> object:
        return (await ours.post(body, HEADERS)).json()

    return {"httpx AsyncClient.post": with_httpx, "aiohttp ClientSession.post": with_aiohttp,
            "ScorerClient.post": with_ours}


async def measure(url: str) -> dict[str, float]:
    endpoint = url + "/v1/chat/completions"
    figures: dict[str, float] = {}
    for concurrent in CONCURRENCY:
        async with AsyncExitStack() as stack:
            for name, send in (await clients(endpoint, concurrent, stack)).items():
                figures[f"{name}, {concurrent} at once"] = await cpu_per_request(send, concurrent)
    scorer = OpenAIChatScorer(url + "/v1", "m")
    for pairs in CONCURRENCY:
        await scorer.score(QUERY, np.zeros(4), [MEMORY] * pairs, np.zeros((pairs, 4)))
        rounds = REQUESTS // pairs // 4
        started = time.process_time()
        for _ in range(rounds):
            await scorer.score(QUERY, np.zeros(4), [MEMORY] * pairs, np.zeros((pairs, 4)))
        figures[f"OpenAIChatScorer.score of {pairs}, per pair"] = (
            (time.process_time() - started) / (rounds * pairs) * 1e6)
    await scorer.aclose()
    return figures


def main() -> None:
    with child_server(lambda: ChatServer(reply)) as url:
        for name, micros in uvloop.run(measure(url)).items():
            print(f"{name:45s} {micros:7.0f} µs CPU per request")


if __name__ == "__main__":
    main()
