"""Where a 50 ms reranker's score phase goes (docs/performance.md, A retrieve at 100k
memories): the round trip of one 35-document ``/rerank`` call through the service's scorer
(``RerankScorer.score``), through a bare httpx ``post`` and through a bare asyncio socket,
against the bare ``asyncio.sleep(0.05)``; to the tests' uvicorn + FastAPI stand-in (sleeping
50 ms in the handler) and to the load bench's lean backend (answering 50 ms after the request
arrives), each served by a child process as the load bench serves its judge.

    python docs/perf/rerank_rtt.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import numpy as np

from earm_bench.common.processes import child_server, rerank_judge_process
from service.providers.rerank_scorer import RerankScorer
from service.testing import LoopbackServer, rerank_app

CALLS = 60
DOCUMENTS = [f"memory text number {i} " * 6 for i in range(35)]
BODY = {"model": "m", "query": "what did Caroline do on 7 May?", "documents": DOCUMENTS,
        "top_n": len(DOCUMENTS)}


async def rerank_after_50_ms(query: str, documents: list[str]) -> list[float]:
    await asyncio.sleep(0.05)
    return [0.5] * len(documents)


def p50_ms(seconds: list[float]) -> str:
    return f"{1000 * statistics.median(seconds):.2f} ms"


async def through_the_scorer(url: str) -> list[float]:
    scorer = RerankScorer(url, "m")
    no_embeddings = np.zeros((len(DOCUMENTS), 0))
    times = []
    for _ in range(CALLS + 1):
        start = time.perf_counter()
        await scorer.score(BODY["query"], np.zeros(0), DOCUMENTS, no_embeddings)
        times.append(time.perf_counter() - start)
    await scorer.aclose()
    return times[1:]  # the first one connected


async def through_httpx(url: str) -> list[float]:
    async with httpx.AsyncClient(base_url=url) as client:
        await client.post("/rerank", json=BODY)  # connect first
        times = []
        for _ in range(CALLS):
            start = time.perf_counter()
            (await client.post("/rerank", json=BODY)).json()
            times.append(time.perf_counter() - start)
    return times


async def through_a_socket(url: str) -> list[float]:
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(BODY).encode()
    request = (
        f"POST /rerank HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    times = []
    for _ in range(CALLS + 1):
        start = time.perf_counter()
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        json.loads(await reader.readexactly(length))
        times.append(time.perf_counter() - start)
    writer.close()
    return times[1:]  # the first one connected


async def bare_sleep() -> list[float]:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        await asyncio.sleep(0.05)
        times.append(time.perf_counter() - start)
    return times


async def main(url: str) -> None:
    print("scorer p50", p50_ms(await through_the_scorer(url)))
    print("httpx p50", p50_ms(await through_httpx(url)))
    print("socket p50", p50_ms(await through_a_socket(url)))
    print("bare sleep p50", p50_ms(await bare_sleep()))


def fastapi_server() -> LoopbackServer:
    return LoopbackServer(rerank_app(rerank_after_50_ms), loop="uvloop")


if __name__ == "__main__":
    with child_server(fastapi_server) as fastapi_url:
        print("uvicorn + FastAPI, uvloop, sleeping 50 ms in the handler")
        asyncio.run(main(fastapi_url))
    with rerank_judge_process(lambda query, documents: [0.5] * len(documents),
                              lambda: 0.05) as lean_url:
        print("the load bench's lean backend, 50 ms from arrival")
        asyncio.run(main(lean_url))
