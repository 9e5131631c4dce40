"""The scorer client's CPU per chat request (service/providers/http1.py): httpx's ``post``,
httpcore's pool alone, and the service's lean connection, each sending 35 requests at once (a
retrieve's anchors at the schedule's last stage) on uvloop to an instant loopback judge served by
a child process; then the service's whole ``OpenAIChatScorer.score`` of 35 and of 200 pairs
(prompt building, JSON, parsing included). CPU is this process's (``time.process_time``), so
the judge's own work is not counted.

    python docs/perf/scorer_client_cpu.py
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpcore
import httpx
import numpy as np
import uvloop

from earm_bench.common.chat_server import ChatServer
from earm_bench.common.processes import child_server
from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.http1 import Http1Connection, encode_json

ROUNDS, CONCURRENT = 60, 35
QUERY = "what did Caroline do on 7 May?"
MEMORY = "Caroline went to the LGBTQ support group on 7 May and found it powerful. " * 2
BODY = OpenAIChatScorer("http://x/v1", "m").plan(QUERY, [MEMORY])[0].body
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}


def reply(prompt: str) -> str:
    return "0.7"


async def cpu_per_request(send: Callable[[int], Awaitable[object]]) -> float:
    """Microseconds of this process's CPU per request, ``CONCURRENT`` requests at a time."""
    await asyncio.gather(*(send(slot) for slot in range(CONCURRENT)))  # connections opened
    started = time.process_time()
    for _ in range(ROUNDS):
        await asyncio.gather(*(send(slot) for slot in range(CONCURRENT)))
    return (time.process_time() - started) / (ROUNDS * CONCURRENT) * 1e6


async def measure(url: str) -> dict[str, float]:
    endpoint = url + "/v1/chat/completions"
    clients = [httpx.AsyncClient(limits=httpx.Limits(max_connections=1))
               for _ in range(CONCURRENT)]
    pools = [httpcore.AsyncConnectionPool(max_connections=1) for _ in range(CONCURRENT)]
    lean = [Http1Connection(endpoint, None, 4.0) for _ in range(CONCURRENT)]

    async def with_httpx(slot: int) -> object:
        return (await clients[slot].post(endpoint, json=BODY, headers=HEADERS)).json()

    async def with_httpcore(slot: int) -> object:
        response = await pools[slot].request("POST", endpoint, headers=HEADERS,
                                             content=encode_json(BODY))
        return response.content

    async def with_lean(slot: int) -> object:
        return (await lean[slot].post(encode_json(BODY), HEADERS)).json()

    figures = {name: await cpu_per_request(send) for name, send in
               (("httpx post", with_httpx), ("httpcore request", with_httpcore),
                ("lean connection", with_lean))}
    scorer = OpenAIChatScorer(url + "/v1", "m")
    for pairs in (35, 200):
        started = time.process_time()
        for _ in range(ROUNDS // 4):
            await scorer.score(QUERY, np.zeros(4), [MEMORY] * pairs, np.zeros((pairs, 4)))
        figures[f"OpenAIChatScorer.score of {pairs}, per pair"] = (
            (time.process_time() - started) / (ROUNDS // 4 * pairs) * 1e6)
    return figures


def main() -> None:
    with child_server(lambda: ChatServer(reply)) as url:
        for name, micros in uvloop.run(measure(url)).items():
            print(f"{name:42s} {micros:7.0f} µs CPU per request")


if __name__ == "__main__":
    main()
