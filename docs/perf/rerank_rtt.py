"""Where a 50 ms reranker's score phase goes (docs/performance.md, Known limits): the round trip
of one 35-document ``/rerank`` call to the bench's loopback server, through httpx and through a
bare asyncio socket, against the bare ``asyncio.sleep(0.05)`` the server waits.

    python docs/perf/rerank_rtt.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx

from service.bench.loopback import LoopbackServer, rerank_app

CALLS = 60
DOCUMENTS = [f"memory text number {i} " * 6 for i in range(35)]
BODY = {"model": "m", "query": "what did Caroline do on 7 May?", "documents": DOCUMENTS,
        "top_n": len(DOCUMENTS)}


async def rerank_after_50_ms(query: str, documents: list[str]) -> list[float]:
    await asyncio.sleep(0.05)
    return [0.5] * len(documents)


def p50_ms(seconds: list[float]) -> str:
    return f"{1000 * statistics.median(seconds):.2f} ms"


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
    print("httpx p50", p50_ms(await through_httpx(url)))
    print("socket p50", p50_ms(await through_a_socket(url)))
    print("bare sleep p50", p50_ms(await bare_sleep()))


if __name__ == "__main__":
    with LoopbackServer(rerank_app(rerank_after_50_ms)) as server:
        asyncio.run(main(server.url))
