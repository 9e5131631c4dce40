"""Migration 0017 (every table of a namespace's data hash-partitioned by the namespace) moves a
populated 0016 database without loss: every row of every table is the same after the upgrade,
ids keep counting where they stopped, each namespace's observations keep their physical order
(the order a refit sums them in), every memory and query id is located, and the downgrade
gives back the same rows and the 0016 schema."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from alembic import command

from service.db import migrate

PREVIOUS = "0016"
#: The revision under test (later ones change other things).
PARTITIONED = "0017"
NAMESPACES = ("agent-a", "agent-b", "tenant-with-a-much-longer-name-0001", "z")
TABLES = ("namespaces", "memories", "queries", "scores", "score_history", "memory_factors",
          "api_keys", "auth_settings")
#: Each table's rows in a fixed order: its 0016 key.
ORDER = {"namespaces": "name", "memories": "id", "queries": "id",
         "scores": "query_id, memory_id", "score_history": "id",
         "memory_factors": "memory_id", "api_keys": "id", "auth_settings": "id"}

# A 0016 database as the service leaves it, in SQL: memories of several namespaces
# interleaved over the heap (some deleted, some unindexed, some edited), queries with every
# column set, scorer and feedback observations (some retired), replaced values, model rows
# with statistics, rerank documents, keys.
POPULATE = (
    "INSERT INTO namespaces (name, next_query_index, score_sum, score_count, scorer_calls, "
    "scorer_requests, full_rerank_calls, reused_cells, reuse_saved_calls, queries_since_refit, "
    "last_refit_at, content_slope, content_weights) "
    "SELECT name, 20, 7.25, 31, 40, 12, 400, 3, 2, 5, now(), 0.5, "
    "array_fill(0.125::real, ARRAY[384])::vector FROM unnest(%(namespaces)s::text[]) AS name",
    "INSERT INTO memories (namespace, external_id, text, embedding, embedding_model, occurred_at, "
    "metadata, indexed, content_changed_at) "
    "SELECT (%(namespaces)s::text[])[1 + i %% 4], CASE WHEN i %% 3 = 0 THEN 'e' || i END, "
    "'memory ' || i, (SELECT array_agg(sin(i * d)::real) FROM generate_series(1, 384) d)::vector,"
    " 'local', CASE WHEN i %% 2 = 0 THEN '2024-01-01'::timestamptz + i * interval '1 day' END, "
    "jsonb_build_object('tag', i %% 5), i %% 7 <> 0, "
    "CASE WHEN i %% 11 = 0 THEN now() END FROM generate_series(1, 240) i",
    "DELETE FROM memories WHERE id %% 13 = 0",
    "INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates, budget, "
    "scorer_calls, bias, slope, factors, prequential_abs_error, prequential_count, "
    "returned_count, returned_estimated, family_key, reused_memory_ids, stage, timings, "
    "trace_memory_ids, trace_similarities, trace_estimates, trace_scores, trace_sources, "
    "trace_origins, trace_anchors, trace_anchor_reasons, exploration_share) "
    "SELECT n, i, 'query ' || i, (SELECT array_agg(cos(i + d)::real) "
    "FROM generate_series(1, 384) d)::vector, 'earm', 200, 35, 35, 0.1 * i, 0.3, "
    "ARRAY[0.1, -0.2, 0.3]::real[], 0.05, 4, 10, 6, decode(md5(n || i), 'hex'), ARRAY[1, 2], "
    "2, '{\"search_ms\": 1.5}', ARRAY[3, 4], ARRAY[0.9, 0.8]::real[], ARRAY[0.7, 0.6]::real[], "
    "ARRAY[0.5, 0.4]::real[], ARRAY['observed', 'estimated'], ARRAY['scorer', NULL], "
    "ARRAY[true, false], ARRAY['head', NULL], 0.25 "
    "FROM unnest(%(namespaces)s::text[]) AS n, generate_series(0, 19) i",
    "INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source, "
    "anchor_kind, retired_at) "
    "SELECT q.id, m.id, q.namespace, ((q.id * 7 + m.id) %% 100) / 100.0, 0.3, "
    "CASE WHEN m.id %% 5 = 0 THEN 'feedback' ELSE 'scorer' END, "
    "CASE WHEN m.id %% 5 <> 0 THEN (m.id %% 4)::smallint END, "
    "CASE WHEN m.content_changed_at IS NOT NULL THEN now() END "
    "FROM queries q JOIN memories m ON m.namespace = q.namespace "
    "WHERE (q.id + m.id) %% 3 = 0 ORDER BY random()",
    # Feedback rewrites cells: new row versions, elsewhere in the heap.
    "UPDATE scores SET score = 1 - score, source = 'feedback' "
    "WHERE (query_id * memory_id) %% 17 = 0",
    "INSERT INTO score_history (query_id, memory_id, namespace, score, source, observed_at, "
    "retired_at) SELECT query_id, memory_id, namespace, 0.5, 'scorer', now(), NULL "
    "FROM scores WHERE source = 'feedback' AND memory_id %% 2 = 0",
    "INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count, "
    "statistics) SELECT id, namespace, 0.01 * id, ARRAY[0.5, 0.25]::real[], 3, "
    "CASE WHEN id %% 2 = 0 THEN ARRAY[1.0, 2.0, 3.5]::float8[] END "
    "FROM memories WHERE id %% 4 <> 3",
    "INSERT INTO rerank_documents (memory_id, last_seen_at) "
    "SELECT id, now() - id * interval '1 hour' FROM memories WHERE external_id IS NULL "
    "AND id %% 2 = 1",
    "INSERT INTO api_keys (name, key_hash, namespace_patterns) "
    "VALUES ('ops', repeat('a', 64), ARRAY['*']), ('agent', repeat('b', 64), ARRAY['agent-*'])",
    "INSERT INTO auth_settings (key_enforcement) VALUES (true)",
)


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def populated(new_database: Callable[[str], str]) -> Iterator[str]:
    """A database at revision 0016 holding every kind of row."""
    url = new_database("earm_test_partition_migration")
    command.upgrade(migrate.alembic_config(url, 384), PREVIOUS)
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        for statement in POPULATE:
            conn.execute(statement, {"namespaces": list(NAMESPACES)})
        conn.execute("ANALYZE")
    yield url


def _rows(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """Every row of every table as its text form (every column, in column order), in its
    table's 0016 key order; rerank_documents by their 0016 columns."""
    rows = {
        table: [
            r[0] for r in conn.execute(f"SELECT t::text FROM {table} t ORDER BY {ORDER[table]}")
        ]
        for table in TABLES
    }
    rows["rerank_documents"] = [
        r[0] for r in conn.execute(
            "SELECT (memory_id, last_seen_at)::text FROM rerank_documents ORDER BY memory_id"
        )
    ]
    return rows


def _scan_orders(conn: psycopg.Connection[Any]) -> dict[str, list[tuple[int, int]]]:
    """Each namespace's observations in the order a sequential scan reads them."""
    conn.execute("SET enable_indexscan = off")
    conn.execute("SET enable_bitmapscan = off")
    conn.execute("SET synchronize_seqscans = off")
    return {
        namespace: [
            (int(q), int(m)) for q, m in conn.execute(
                "SELECT query_id, memory_id FROM scores WHERE namespace = %s", (namespace,)
            )
        ]
        for namespace in NAMESPACES
    }


def _sequences(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """The last value each identity sequence handed out."""
    last: dict[str, int] = {}
    for table in ("memories", "queries", "score_history"):
        row = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", (table,)).fetchone()
        assert row is not None
        value = conn.execute(f"SELECT last_value FROM {row[0]}").fetchone()
        assert value is not None
        last[table] = int(value[0])
    return last


def test_the_upgrade_keeps_every_row_and_the_downgrade_gives_them_back(populated: str) -> None:
    config = migrate.alembic_config(populated, 384)
    with psycopg.connect(_libpq(populated), autocommit=True) as conn:
        before, order, counters = _rows(conn), _scan_orders(conn), _sequences(conn)
    assert all(before[table] for table in (*TABLES, "rerank_documents")), "every table has rows"

    command.upgrade(config, PARTITIONED)
    with psycopg.connect(_libpq(populated), autocommit=True) as conn:
        assert _rows(conn) == before
        assert _scan_orders(conn) == order
        assert _sequences(conn) == counters
        # The next ids follow the old sequences' last values, not the largest ids left.
        assert conn.execute("SELECT nextval('memories_id_seq')").fetchone() == (
            counters["memories"] + 1,
        )
        located = conn.execute(
            "SELECT (SELECT count(*) FROM memories m JOIN memory_locator l "
            "ON l.id = m.id AND l.namespace = m.namespace), "
            "(SELECT count(*) FROM memory_locator), (SELECT count(*) FROM memories), "
            "(SELECT count(*) FROM queries q JOIN query_locator l "
            "ON l.id = q.id AND l.namespace = q.namespace), "
            "(SELECT count(*) FROM query_locator), (SELECT count(*) FROM queries)"
        ).fetchone()
        assert located is not None and len(set(located[:3])) == 1 and len(set(located[3:])) == 1
        documents = conn.execute(
            "SELECT count(*) FROM rerank_documents d JOIN memories m "
            "ON m.namespace = d.namespace AND m.id = d.memory_id"
        ).fetchone()
        assert documents == (len(before["rerank_documents"]),)

    command.downgrade(config, PREVIOUS)
    with psycopg.connect(_libpq(populated), autocommit=True) as conn:
        after = _rows(conn)
        # nextval above consumed one memory id: the downgrade keeps counting from there too.
        assert _sequences(conn) == counters | {"memories": counters["memories"] + 1}
    assert after == before


def test_the_upgraded_tables_are_hash_partitioned_by_namespace_with_an_hnsw_graph_each(
    populated: str,
) -> None:
    command.upgrade(migrate.alembic_config(populated, 384), PARTITIONED)
    with psycopg.connect(_libpq(populated)) as conn:
        keys = dict(conn.execute(
            "SELECT c.relname, pg_get_partkeydef(c.oid) FROM pg_partitioned_table p "
            "JOIN pg_class c ON c.oid = p.partrelid"
        ).fetchall())
        partitions = dict(conn.execute(
            "SELECT p.relname, count(*) FROM pg_inherits i "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relkind = 'p' GROUP BY p.relname"
        ).fetchall())
        graphs = conn.execute(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam JOIN pg_class t ON t.oid = i.indrelid "
            "WHERE a.amname = 'hnsw' AND t.relkind = 'r' AND t.relname LIKE 'memories_p%%'"
        ).fetchone()
    tables = ("memories", "queries", "scores", "score_history", "memory_factors",
              "rerank_documents")
    assert keys == dict.fromkeys(tables, "HASH (namespace)")
    assert partitions == dict.fromkeys(tables, 16)
    assert graphs == (16,)
