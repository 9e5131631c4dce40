"""The dashboard row of ``earm bench load``: each page of the run's namespace fetched in turn,
timed end to end over HTTP (the service runs on loopback without keys, so the pages are open
as they are to a local operator)."""

from __future__ import annotations

import time
from typing import Any

from earm_bench.common.stats import percentiles
from earm_bench.load.session import LoadRun

#: The dashboard's target: every page within this, at 100k memories and 1M observations.
PAGE_TARGET_MS = 500.0


async def dashboard_pages(run: LoadRun, requests: int) -> list[dict[str, Any]]:
    """Every page ``requests`` times (one warm-up fetch first): the namespaces list, the
    namespace, its experience matrix and the trace of its latest query."""
    conn = await run.connect()
    try:
        cursor = await conn.execute(
            "SELECT id FROM queries WHERE namespace = %s ORDER BY query_index DESC LIMIT 1",
            (run.namespace,),
        )
        latest_query = (await cursor.fetchone())[0]
    finally:
        await conn.close()
    pages = [
        ("namespaces", "/dashboard/"),
        ("namespace", f"/dashboard/namespaces/{run.namespace}"),
        ("experience matrix", f"/dashboard/namespaces/{run.namespace}/matrix"),
        ("query trace", f"/dashboard/queries/{latest_query}"),
    ]
    rows = []
    for page, path in pages:
        (await run.client.get(path)).raise_for_status()
        times, size = [], 0
        for _ in range(requests):
            began = time.perf_counter()
            response = await run.client.get(path)
            times.append((time.perf_counter() - began) * 1000)
            response.raise_for_status()
            size = len(response.content)
        rows.append({"page": page, "bytes": size, "client_ms": percentiles(times)})
    return rows
