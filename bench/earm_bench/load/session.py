"""What the phases of one ``earm bench load`` run share, and its timed retrieves."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from earm_bench.common.cli import progress
from earm_bench.common.database import libpq_url
from earm_bench.common.http import ServiceError, check
from earm_bench.common.processes import ServiceProcess
from earm_bench.common.stats import percentiles
from earm_bench.load.config import LoadConfig
from earm_bench.load.judge import Judge
from earm_bench.load.world import World

logger = logging.getLogger(__name__)

#: The phases of a retrieve the report breaks the server-side time into.
PHASES = ("embed_ms", "search_ms", "score_ms", "complete_ms", "record_ms")


@dataclass
class Samples:
    """Per-request measurements of one cell."""

    client_ms: list[float] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    scorer_calls: list[int] = field(default_factory=list)
    scorer_requests: list[int] = field(default_factory=list)
    scorer_rounds: list[int] = field(default_factory=list)
    degraded: int = 0
    errors: int = 0
    wall_s: float = 0.0
    #: Each answered retrieve's start and end (``time.perf_counter``), in ``client_ms``'s order.
    spans: list[tuple[float, float]] = field(default_factory=list)

    def timing(self, name: str) -> list[float]:
        return [t.get(name, 0.0) for t in self.timings]

    def overhead(self) -> list[float]:
        return [t["total_ms"] - t.get("score_ms", 0.0) for t in self.timings]

    def outside(self) -> list[float]:
        """The client's time outside the pipeline's ``total_ms``: HTTP, (de)serialisation and
        the wait for the serving process's event loop."""
        return [c - t["total_ms"] for c, t in zip(self.client_ms, self.timings, strict=True)]

    def subset(self, keep: Sequence[bool]) -> Samples:
        """The answered retrieves where ``keep`` (one flag per retrieve) is true."""
        picked = Samples(wall_s=self.wall_s)
        for flag, client, timing, calls, requests, rounds, span in zip(
                keep, self.client_ms, self.timings, self.scorer_calls, self.scorer_requests,
                self.scorer_rounds, self.spans, strict=True):
            if flag:
                picked.client_ms.append(client)
                picked.timings.append(timing)
                picked.scorer_calls.append(calls)
                picked.scorer_requests.append(requests)
                picked.scorer_rounds.append(rounds)
                picked.spans.append(span)
        return picked

    def phase_tails(self) -> dict[str, dict[str, Any]]:
        """Each phase's percentiles, the overhead (total − score) and the time outside the
        pipeline (client − total)."""
        return {**{name: percentiles(self.timing(name)) for name in PHASES},
                "overhead_ms": percentiles(self.overhead()),
                "outside_ms": percentiles(self.outside())}

    def summary(self) -> dict[str, Any]:
        ok = len(self.timings)
        return {
            "requests": ok,
            "errors": self.errors,
            "degraded": self.degraded,
            "scorer_calls_mean": round(float(np.mean(self.scorer_calls)), 1) if ok else None,
            "scorer_requests_mean": round(float(np.mean(self.scorer_requests)), 1) if ok else None,
            "scorer_rounds_mean": round(float(np.mean(self.scorer_rounds)), 2) if ok else None,
            "scorer_rounds_max": max(self.scorer_rounds) if ok else None,
            "throughput_rps": round(ok / self.wall_s, 2) if self.wall_s > 0 else None,
            "client_ms": percentiles(self.client_ms),
            "total_ms": percentiles(self.timing("total_ms")),
            "score_ms": percentiles(self.timing("score_ms")),
            "overhead_ms": percentiles(self.overhead()),
            "phases_p50_ms": {name: percentiles(self.timing(name))["p50"] for name in PHASES},
        }


@dataclass
class LoadRun:
    """The run's data, judge, service, database and HTTP client, and its one namespace."""

    config: LoadConfig
    world: World
    judge: Judge
    service: ServiceProcess
    database_url: str
    client: httpx.AsyncClient
    namespace: str = field(default_factory=lambda: f"load-{uuid.uuid4().hex[:8]}")
    next_query: int = 0
    memory_ids: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.memory_ids = np.zeros(self.config.memories, dtype=np.int64)

    async def connect(self) -> Any:
        """A psycopg connection (autocommit, pgvector types) to the service's database."""
        import psycopg
        from pgvector.psycopg import register_vector_async

        conn = await psycopg.AsyncConnection.connect(libpq_url(self.database_url), autocommit=True)
        await register_vector_async(conn)
        return conn

    @asynccontextmanager
    async def connections(self, n: int) -> AsyncIterator[list[Any]]:
        """``n`` connections as :meth:`connect` opens them, closed on exit."""
        opened = [await self.connect() for _ in range(n)]
        try:
            yield opened
        finally:
            for conn in opened:
                await conn.close()

    def query_numbers(self, n: int) -> list[int]:
        """``n`` query numbers no retrieve of this run has used."""
        numbers = list(range(self.next_query, self.next_query + n))
        self.next_query += n
        return numbers


async def retrieve(run: LoadRun, number: int, policy: str, samples: Samples,
                   budget: int | None = None, client: httpx.AsyncClient | None = None) -> None:
    """One ``POST /retrieve`` of query ``number`` to ``client`` (the run's own by default),
    measured into ``samples``."""
    topic, embedding, _ = run.world.query(number)
    body: dict[str, Any] = {
        "namespace": run.namespace,
        "query": run.world.query_text(number, topic),
        "query_embedding": embedding.tolist(),
        "k": run.config.k,
        "candidates": run.config.candidates,
        "policy": policy,
        "order": "relevance",
        "seed": run.config.seed,
    }
    if budget is not None:
        body["budget"] = budget
    started = time.perf_counter()
    try:
        result = check(await (client or run.client).post("/retrieve", json=body))
    except (httpx.HTTPError, ServiceError) as exc:
        samples.errors += 1
        logger.warning("retrieve failed: %s", exc)
        return
    ended = time.perf_counter()
    samples.client_ms.append((ended - started) * 1000)
    samples.spans.append((started, ended))
    samples.timings.append(result["timings"])
    samples.scorer_calls.append(result["scorer_calls"])
    samples.scorer_requests.append(result["scorer_requests"])
    samples.scorer_rounds.append(result["scorer_rounds"])
    samples.degraded += bool(result["degraded"])


async def drive(run: LoadRun, numbers: Sequence[int], concurrency: int, policy: str,
                description: str, budget: int | None = None,
                clients: Sequence[httpx.AsyncClient] = ()) -> Samples:
    """``len(numbers)`` retrieves, ``concurrency`` in flight; to ``clients`` in turn (round
    robin, by request), or all to the run's own."""
    samples = Samples()
    queue = list(enumerate(numbers))
    bar = progress(len(queue), description, run.config.progress)

    async def worker() -> None:
        while queue:
            i, number = queue.pop(0)
            client = clients[i % len(clients)] if clients else None
            await retrieve(run, number, policy, samples, budget, client)
            bar.update()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    samples.wall_s = time.perf_counter() - started
    bar.close()
    return samples
