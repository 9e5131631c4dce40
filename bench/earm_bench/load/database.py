"""What ``earm bench load`` reads and does in the service's database directly."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString

from earm_bench.common.database import libpq_url
from earm_bench.load.session import LoadRun

if TYPE_CHECKING:
    import psycopg


async def until_indexed(run: LoadRun) -> None:
    """Wait until the service's background indexer has moved every memory into the HNSW
    index (measurements of the search start from an indexed namespace)."""
    conn = await run.connect()
    try:
        while (await (await conn.execute(
            "SELECT count(*) FROM memories WHERE NOT indexed"
        )).fetchone())[0]:
            await asyncio.sleep(0.25)
    finally:
        await conn.close()


async def analyze(run: LoadRun) -> None:
    """``VACUUM ANALYZE`` after a bulk load: the state autovacuum reaches a minute later,
    without it running in the middle of a measurement. Without fresh statistics a
    namespace the planner does not know yet is estimated at one row, and its top-N query
    (earm's and the floor's alike) gets an exact scan instead of the HNSW index, depending
    on when each ran."""
    conn = await run.connect()
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def settle(run: LoadRun) -> None:
    """Indexed and analyzed: the state every measurement starts from."""
    await until_indexed(run)
    await analyze(run)


async def observation_counts(run: LoadRun) -> dict[str, int]:
    conn = await run.connect()
    try:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM scores WHERE namespace = %(ns)s), "
            "(SELECT count(*) FROM queries WHERE namespace = %(ns)s), "
            "(SELECT count(*) FROM memory_factors WHERE namespace = %(ns)s)",
            {"ns": run.namespace},
        )
        observations, queries, with_history = await cursor.fetchone()
    finally:
        await conn.close()
    return {"observations": observations, "queries": queries,
            "memories_with_history": with_history}


@dataclass(frozen=True)
class RefitCost:
    """A full refit's wall seconds, and the CPU seconds of this process and of the children
    it waited for (user + system), so a refit that hands its work to a child process is
    counted as well."""

    seconds: float
    cpu_s: float


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


async def refit_cost(run: LoadRun) -> RefitCost:
    """The pipeline's full refit of the namespace, in this process, measured."""
    from service.db.engine import open_database
    from service.providers.scorers import LocalScorer
    from service.retrieve.pipeline import RetrievalPipeline
    from service.settings import Settings

    settings = Settings(database_url=run.database_url, embedder="none", scorer="local",
                        embedding_dim=run.config.dim, _env_file=None)
    async with open_database(settings.database) as db:
        pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
        began, cpu = time.perf_counter(), _cpu_s()
        done = await pipeline.refit(run.namespace)
        cost = RefitCost(time.perf_counter() - began, _cpu_s() - cpu)
    if not done:
        raise RuntimeError("the refit lock was held by another process")
    return cost


async def refit(run: LoadRun) -> float:
    """The pipeline's full refit of the namespace, in this process; seconds."""
    return (await refit_cost(run)).seconds


async def make_refit_due(run: LoadRun) -> None:
    """Set the namespace's counter so that its next query is due a full refit."""
    conn = await run.connect()
    try:
        await conn.execute(
            "UPDATE namespaces SET queries_since_refit = 1000000000 WHERE name = %s",
            (run.namespace,),
        )
    finally:
        await conn.close()


#: The tables whose size grows with memories or observations, each with its indexes (and TOAST).
SIZED_TABLES = ("memories", "queries", "scores", "memory_factors")


async def database_sizes(run: LoadRun) -> dict[str, Any]:
    """Bytes on disk of the tables that grow (with their indexes), the HNSW index alone, and
    the rows they hold (all namespaces: the run's are most of them). On Citus, the bytes are
    those of every shard, on the workers (Citus's size functions)."""
    from psycopg import sql

    conn = await run.connect()
    try:
        citus = await is_citus(conn)
        total = sql.SQL("citus_total_relation_size" if citus else "pg_total_relation_size")
        main_fork = sql.SQL("citus_relation_size" if citus else "pg_relation_size")
        # Summed over the leaves of the partition tree (a partitioned table holds no rows
        # itself), in statements of their own: Citus does not push a size subquery down beside
        # a count of a distributed table.
        parts = sql.SQL(
            "SELECT sum({}(relid))::bigint FROM pg_partition_tree(%s::regclass) WHERE isleaf"
        )
        sizes: dict[str, Any] = {}
        for name in SIZED_TABLES:
            size = await conn.execute(parts.format(total), (name,))
            rows = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(name)))
            sizes[name] = {"bytes": (await size.fetchone())[0], "rows": (await rows.fetchone())[0]}
        size = await conn.execute(parts.format(main_fork), ("ix_memories_embedding_hnsw",))
        rows = await conn.execute("SELECT count(*) FROM memories WHERE indexed")
        sizes["hnsw_index"] = {"bytes": (await size.fetchone())[0],
                               "rows": (await rows.fetchone())[0]}
    finally:
        await conn.close()
    return sizes


async def is_citus(conn: Any) -> bool:
    """Whether the database has the citus extension."""
    cursor = await conn.execute(
        "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
    )
    return bool((await cursor.fetchone())[0])


async def last_refit_at(run: LoadRun) -> Any:
    """When the namespace's latest full refit was written (None before the first)."""
    conn = await run.connect()
    try:
        cursor = await conn.execute(
            "SELECT last_refit_at FROM namespaces WHERE name = %s", (run.namespace,)
        )
        return (await cursor.fetchone())[0]
    finally:
        await conn.close()


def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def environment(database_url: str) -> dict[str, Any]:
    """The machine and the database server the run measures on."""
    import psycopg

    info = _machine()
    with psycopg.connect(libpq_url(database_url)) as conn:
        info["postgres"] = _value(conn, "SHOW server_version")
        info["pgvector"] = _value(
            conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        )
        info["hnsw_index"] = _value(
            conn, "SELECT pg_get_indexdef('ix_memories_embedding_hnsw'::regclass)"
        )
        info["shared_buffers"] = _value(conn, "SHOW shared_buffers")
        # None on a plain PostgreSQL; on Citus, its release and the workers behind it.
        info["citus"] = None
        if _value(conn, "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"):
            info["citus"] = _value(conn, "SELECT citus_version()")
            info["citus_workers"] = _value(
                conn, "SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND isactive"
            )
    return info


def _value(conn: psycopg.Connection[Any], query: LiteralString) -> Any:
    """The first column of the statement's one row."""
    row = conn.execute(query).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {query!r}")
    return row[0]
