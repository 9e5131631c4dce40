"""What migration 0017 (the tables hash-partitioned by namespace) costs an operator: its duration
and the locks it holds, on a 0016 database of ``--memories`` memories over ``--namespaces``
namespaces (384 dimensions, indexed in the HNSW graph), ``--queries-per-namespace`` recorded
queries each with a 200-candidate trace, ``--scores`` observations and a model row per
observed memory, in a temporary embedded Postgres (its defaults: shared_buffers 128 MB,
maintenance_work_mem 64 MB).

While the upgrade runs, another connection samples ``pg_locks`` every 20 ms (which relations
the migrating backend holds, in which mode, from when) and a third one reads a memory by id,
as a request would: it waits for the migration's commit.

    python docs/perf/partition_migration.py            # 100k memories, 1M scores
    python docs/perf/partition_migration.py --memories 10000 --scores 100000
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from alembic import command
from pgvector.psycopg import register_vector
from sqlalchemy import event
from sqlalchemy.engine import Engine

from earm_bench.common.database import libpq_url
from service.db import migrate
from service.db.engine import EmbeddedPostgres

DIM = 384
TABLES = ("namespaces", "memories", "queries", "scores", "score_history", "memory_factors",
          "rerank_documents")


def load(conn: psycopg.Connection[Any], args: argparse.Namespace) -> None:
    """A 0016 database as months of service leave it: rows of all namespaces interleaved."""
    rng = np.random.default_rng(0)
    names = [f"agent-{i:04d}" for i in range(args.namespaces)]
    conn.execute("INSERT INTO namespaces (name, next_query_index) SELECT unnest(%s::text[]), %s",
                 (names, args.queries_per_namespace))
    conn.execute("DROP INDEX ix_memories_embedding_hnsw")  # built once after the load: faster
    owners = rng.integers(0, args.namespaces, size=args.memories)
    with conn.cursor().copy(
        "COPY memories (namespace, external_id, text, embedding, embedding_model, indexed) "
        "FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["text", "text", "text", "vector", "text", "bool"])
        for i, owner in enumerate(owners):
            vector = rng.standard_normal(DIM).astype(np.float32)
            copy.write_row((names[owner], f"e{i}", f"memory {i} of {names[owner]}",
                            vector / np.linalg.norm(vector), "local", True))
    started = time.perf_counter()
    conn.execute(
        "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw "
        "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128) WHERE indexed"
    )
    print(f"0016 HNSW index built in {time.perf_counter() - started:.1f} s")
    conn.execute(
        "INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates, "
        "budget, scorer_calls, bias, slope, factors, family_key, stage, timings, "
        "trace_memory_ids, trace_similarities, trace_estimates, trace_scores, trace_sources, "
        "trace_origins, trace_anchors) "
        "SELECT n.name, i, 'query ' || i, (SELECT embedding FROM memories m "
        "  WHERE m.namespace = n.name LIMIT 1), 'earm', 200, 35, 35, 0.1, 0.2, "
        "  array_fill(0.01::real, ARRAY[8]), decode(md5(n.name || i), 'hex'), 3, '{}', "
        "  t.ids, t.reals, t.reals, t.reals, t.sources, t.sources, t.flags "
        "FROM namespaces n CROSS JOIN generate_series(0, %s - 1) i CROSS JOIN ("
        "  SELECT array_agg(g::bigint) ids, array_agg(random()::real) reals, "
        "  array_agg('estimated'::text) sources, array_agg(g %% 6 = 0) flags "
        "  FROM generate_series(1, 200) g) t ORDER BY random()",
        (args.queries_per_namespace,),
    )
    per_query = max(1, args.scores // max(1, args.namespaces * args.queries_per_namespace))
    conn.execute(
        "INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source, "
        "anchor_kind) SELECT q.id, m.id, q.namespace, random(), random(), 'scorer', 1 "
        "FROM queries q CROSS JOIN LATERAL (SELECT id FROM memories m "
        "  WHERE m.namespace = q.namespace ORDER BY md5(m.id::text || q.id::text) LIMIT %s) m "
        "ORDER BY random()",
        (per_query,),
    )
    conn.execute(
        "INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count, "
        "statistics) SELECT memory_id, min(namespace), 0.1, array_fill(0.01::real, ARRAY[8]), "
        "count(*), array_fill(0.5::float8, ARRAY[54]) FROM scores GROUP BY memory_id"
    )
    conn.execute(
        "INSERT INTO rerank_documents (memory_id) SELECT id FROM memories WHERE id % 10 = 0"
    )
    conn.execute("VACUUM ANALYZE")
    conn.execute("CHECKPOINT")
    counts = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
              for table in TABLES}
    print("loaded:", ", ".join(f"{table} {count:,}" for table, count in counts.items()))


class Statements:
    """The migration's statements and their durations (the Alembic engine's cursor events)."""

    def __init__(self) -> None:
        self.timings: list[tuple[float, str]] = []
        self._started = 0.0

    def before(self, *args: Any) -> None:
        self._started = time.perf_counter()

    def after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.timings.append((time.perf_counter() - self._started, " ".join(statement.split())))


def sample_locks(url: str, stop: threading.Event, seen: dict[tuple[str, str], list[float]],
                 started: float) -> None:
    """Relations locked by other backends (the migration), first and last seen (s)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(
                "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE l.pid <> pg_backend_pid() AND l.granted AND c.relkind IN ('r', 'p') "
                "AND c.relnamespace = 'public'::regnamespace"
            ).fetchall()
            now = time.perf_counter() - started
            for relation, mode in rows:
                span = seen.setdefault((relation, mode), [now, now])
                span[1] = now
            time.sleep(0.02)


def probe(url: str, started: float, result: dict[str, Any]) -> None:
    """A by-id read, as ``GET /memories/{id}`` runs it, issued just after the upgrade starts."""
    time.sleep(0.5)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        issued = time.perf_counter()
        try:
            conn.execute("SELECT text FROM memories WHERE id = 1").fetchall()
            result["outcome"] = "answered"
        except psycopg.Error as exc:
            result["outcome"] = f"failed: {exc}".splitlines()[0]
        result["issued_s"] = issued - started
        result["waited_s"] = time.perf_counter() - issued


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--queries-per-namespace", type=int, default=10)
    parser.add_argument("--scores", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata")
        url = server.start()
        try:
            config = migrate.alembic_config(url, DIM)
            command.upgrade(config, "0016")
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                register_vector(conn)
                load(conn, args)
            measure(url, config)
        finally:
            server.stop()


def measure(url: str, config: Any) -> None:
    statements = Statements()
    event.listen(Engine, "before_cursor_execute", statements.before)
    event.listen(Engine, "after_cursor_execute", statements.after)
    seen: dict[tuple[str, str], list[float]] = {}
    stop, probed = threading.Event(), {}
    started = time.perf_counter()
    threads = [threading.Thread(target=sample_locks, args=(url, stop, seen, started)),
               threading.Thread(target=probe, args=(url, started, probed))]
    for thread in threads:
        thread.start()
    command.upgrade(config, "head")
    took = time.perf_counter() - started
    stop.set()
    for thread in threads:
        thread.join()
    print(f"upgrade 0016 -> 0017: {took:.1f} s")
    print("slowest statements:")
    for seconds, statement in sorted(statements.timings, reverse=True)[:12]:
        print(f"  {seconds:7.2f} s  {statement[:110]}")
    held: dict[str, list[str]] = defaultdict(list)
    partitions: dict[str, list[float]] = {}
    for (relation, mode), (first, last) in sorted(seen.items(), key=lambda item: item[1][0]):
        if re.search(r"_p[0-9]{2}$", relation):  # the new partitions, summed up
            span = partitions.setdefault(mode, [first, last])
            span[0], span[1] = min(span[0], first), max(span[1], last)
        else:
            held[relation].append(f"{mode} {first:.1f}-{last:.1f} s")
    print("locks the migrating transaction held (first-last seen, s from its start):")
    for relation, modes in held.items():
        print(f"  {relation}: {'; '.join(modes)}")
    for mode, (first, last) in partitions.items():
        print(f"  the new partitions: {mode} {first:.1f}-{last:.1f} s")
    print(f"a by-id read issued at {probed.get('issued_s', 0):.1f} s waited "
          f"{probed.get('waited_s', 0):.1f} s: {probed.get('outcome')}")


if __name__ == "__main__":
    main()
