"""The retrieve floor of ``earm bench load``: the raw pgvector top-N query every pgvector
application pays, for the very query vectors of the service's retrieves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from earm_bench.common.stats import percentiles
from earm_bench.load.database import is_citus
from earm_bench.load.session import LoadRun

_TOP_N_SQL = (
    # `indexed`: the HNSW index is partial (service.ingest.indexer); the bench measures after the
    # backlog is indexed, so this is every memory of the namespace
    "SELECT id, embedding <=> %(q)b AS distance FROM memories "
    "WHERE namespace = %(ns)s AND indexed ORDER BY embedding <=> %(q)b LIMIT %(n)s"
)


async def _top_n(run: LoadRun, conn: Any, number: int) -> int:
    """The raw query for query ``number``; how many rows it returned."""
    _, embedding, _ = run.world.query(number)
    cursor = await conn.execute(
        _TOP_N_SQL, {"q": embedding, "ns": run.namespace, "n": run.config.candidates}, binary=True
    )
    return len(await cursor.fetchall())


async def floor(run: LoadRun, numbers: Sequence[int], concurrency: int) -> dict[str, Any]:
    """The raw pgvector query for the same query vectors: one round trip each, binary
    vectors, the service's ef_search and iterative-scan settings set once per connection.
    On Citus the settings must reach the workers, which run the HNSW scan: a plain ``SET``
    stays on the coordinator, a ``SET LOCAL`` in a transaction block is passed on (with
    ``citus.propagate_set_commands = 'local'``, which ``earm migrate`` sets), so each
    connection's queries run in one read-only transaction that sets them."""
    ef_search = min(1000, max(40, run.config.candidates))
    latencies: list[float] = []
    returned: list[int] = []
    queue = list(numbers)

    async def worker(conn: Any) -> None:
        scope = "SET"
        if await is_citus(conn):
            await conn.execute("BEGIN READ ONLY")
            scope = "SET LOCAL"
        await conn.execute(f"{scope} hnsw.ef_search = {ef_search}")
        await conn.execute(f"{scope} hnsw.iterative_scan = relaxed_order")
        for number in range(-3, 0):  # warm the new backend up (catalogs, plan), untimed
            await _top_n(run, conn, 2**31 + number)
        while queue:
            number = queue.pop(0)
            began = time.perf_counter()
            rows = await _top_n(run, conn, number)
            latencies.append((time.perf_counter() - began) * 1000)
            returned.append(rows)

    async with run.connections(concurrency) as connections:
        began = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in connections))
        wall = time.perf_counter() - began
    return {
        "concurrency": concurrency,
        "queries": len(latencies),
        "ef_search": ef_search,
        "rows_min": min(returned) if returned else 0,
        "latency_ms": percentiles(latencies),
        "throughput_qps": round(len(latencies) / wall, 1),
    }
