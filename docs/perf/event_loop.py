"""What the event loop costs a retrieve's I/O (docs/performance.md, Tuning notes): the CPU and wall
time of one scorer request (a 35-document ``/rerank`` call through httpx, as the rerank scorer
sends it, to the load bench's lean backend answering at once) and of one database round trip
(``SELECT 1`` through psycopg's async connection), on asyncio's own loop and on uvloop (what
``earm serve`` runs on where it is installed), alternating, three rounds.

    python docs/perf/event_loop.py

Starts the backend in a child process and a temporary embedded Postgres.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import psycopg
import uvloop

from earm_bench.common.database import libpq_url
from earm_bench.common.processes import rerank_judge_process
from service.db.engine import EmbeddedPostgres

CALLS = 400
ROUNDS = 3
DOCUMENTS = [f"memory text number {i} " * 6 for i in range(35)]
BODY = {"model": "m", "query": "what did Caroline do on 7 May?", "documents": DOCUMENTS,
        "top_n": len(DOCUMENTS)}


def answer_at_once(query: str, documents: list[str]) -> list[float | None]:
    return [0.5] * len(documents)


async def per_call(call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(wall p50, mean CPU) of one call, in ms, over CALLS calls after one untimed."""
    await call()
    wall, cpu = [], []
    for _ in range(CALLS):
        started, started_cpu = time.perf_counter(), time.process_time()
        await call()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall) * 1000, statistics.fmean(cpu) * 1000


async def measure(backend_url: str, database_url: str) -> dict[str, tuple[float, float]]:
    async with httpx.AsyncClient(base_url=backend_url) as client:

        async def rerank() -> object:
            return (await client.post("/rerank", json=BODY)).json()

        http = await per_call(rerank)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:

        async def select_one() -> object:
            return await (await conn.execute("SELECT 1")).fetchall()

        database = await per_call(select_one)
    return {"scorer request": http, "database round trip": database}


def main(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir)
    database_url = libpq_url(server.start())
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
        "asyncio": None, "uvloop": uvloop.new_event_loop,
    }
    try:
        with rerank_judge_process(answer_at_once, lambda: 0.0) as backend_url:
            for round_number in range(1, ROUNDS + 1):
                for name, loop_factory in loops.items():
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        results = runner.run(measure(backend_url, database_url))
                    print(f"round {round_number}, {name:8s}" + "".join(
                        f" | {what}: wall p50 {wall:.3f} ms, CPU {cpu:.3f} ms"
                        for what, (wall, cpu) in results.items()
                    ))
    finally:
        server.stop()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="earm-loop-") as tmp:
        main(Path(tmp) / "pgdata")
