"""A small namespace in a table (a partition of it, since migration 0017) dominated by another
one: the search's top-N is the exact scan's, with and without a metadata filter, and the
statement takes the branch (exact scan below ``exact_below`` memories, else the HNSW index the
partition's namespaces share) its size calls for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import async_sessionmaker

from service.db.candidate_sql import CANDIDATES_SQL, search_settings
from service.db.engine import create_engine
from service.db.search import CandidateSearch, search

DIM = 384
# The schema's index (migration 0006).
INDEX_SQL = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw "
    "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128) WHERE indexed"
)
# "small-13" hashes into big's partition (migration 0017): the two share its HNSW graph.
SMALL = "small-13"
SIZES = {"big": 3_000, SMALL: 30}
TAGS = 3
# Memories of the small namespace the indexer has not reached yet: found by its exact scan.
SMALL_UNINDEXED = 5


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture(scope="module")
def tenancy_url(migrated_database: Callable[[str], str]) -> str:
    """A database whose ``big`` namespace holds 100 × the ``small`` one's memories, rows of
    both interleaved over the heap, and the HNSW index built over them."""
    url = migrated_database("earm_test_tenancy")
    rng = np.random.default_rng(7)
    owners = np.repeat(np.array(list(SIZES)), list(SIZES.values()))
    rng.shuffle(owners)
    vectors = rng.normal(size=(len(owners), DIM))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    small_seen = 0
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        register_vector(conn)
        # Built after the load: faster than inserting each row into the graph.
        conn.execute("DROP INDEX ix_memories_embedding_hnsw")
        conn.execute("INSERT INTO namespaces (name) SELECT unnest(%s::text[])", (list(SIZES),))
        with conn.cursor().copy(
            "COPY memories (namespace, text, embedding, embedding_model, indexed, metadata) "
            "FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["text", "text", "vector", "text", "bool", "jsonb"])
            for i, (owner, vector) in enumerate(zip(owners, vectors, strict=True)):
                indexed = owner != SMALL or small_seen >= SMALL_UNINDEXED
                small_seen += owner == SMALL
                copy.write_row((str(owner), f"memory {i}", vector.astype(np.float32), "client",
                                indexed, Jsonb({"tag": i % TAGS})))
        conn.execute(INDEX_SQL)
        conn.execute("VACUUM ANALYZE memories")
        shared = conn.execute(
            "SELECT count(DISTINCT tableoid) FROM memories WHERE namespace = ANY(%s)",
            (list(SIZES),),
        ).fetchone()
    assert shared == (1,), "both namespaces are in one partition, under one HNSW graph"
    return url


def _queries(n: int) -> np.ndarray:
    rows = np.random.default_rng(11).normal(size=(n, DIM))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _exact_ids(url: str, namespace: str, query: np.ndarray, limit: int,
               filters: dict[str, Any] | None) -> list[int]:
    where = "namespace = %(ns)s" + (" AND metadata @> %(f)s" if filters else "")
    with psycopg.connect(_libpq(url)) as conn:
        register_vector(conn)
        rows = conn.execute(
            f"SELECT id FROM memories WHERE {where} ORDER BY (embedding <=> %(q)s) + 0, id "
            "LIMIT %(n)s",
            {"ns": namespace, "q": query, "n": limit, "f": Jsonb(filters)},
        ).fetchall()
    return [int(r[0]) for r in rows]


def _search_ids(url: str, requests: list[CandidateSearch]) -> list[list[int]]:
    async def run() -> list[list[int]]:
        engine = create_engine(url, 1)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        found = []
        try:
            for request in requests:
                async with sessions() as session:
                    _, candidates, _ = await search(session, request)
                found.append([int(i) for i in candidates.ids])
        finally:
            await engine.dispose()
        return found

    return asyncio.run(run())


# (exact_below, limit): scanned exactly, a top-N shorter and longer than the namespace; and
# through the index first, which yields fewer than a limit longer than the namespace, so the
# exact scan answers (an index's top-N shorter than that is approximate, so not compared).
@pytest.mark.parametrize(("exact_below", "limit"), [(10_000, 8), (10_000, 200), (0, 200)])
@pytest.mark.parametrize("filters", [None, {"tag": 1}])
def test_a_small_namespace_gets_the_exact_top_n(
    tenancy_url: str, exact_below: int, filters: dict[str, Any] | None, limit: int
) -> None:
    queries = _queries(6)
    requests = [CandidateSearch(SMALL, q, limit, rank=8, filters=filters,
                                exact_below=exact_below) for q in queries]
    found = _search_ids(tenancy_url, requests)
    expected = [_exact_ids(tenancy_url, SMALL, q, limit, filters) for q in queries]
    assert found == expected
    # Complete: every memory of the namespace (matching the filter) when it has fewer.
    matching = SIZES[SMALL] if filters is None else len(_exact_ids(
        tenancy_url, SMALL, queries[0], 1_000, filters))
    assert all(len(ids) == min(limit, matching) for ids in found)


def test_a_large_namespace_below_the_threshold_is_scanned_exactly(tenancy_url: str) -> None:
    queries = _queries(3)
    requests = [CandidateSearch("big", q, 50, rank=8, filters={"tag": 2}, exact_below=5_000)
                for q in queries]
    assert _search_ids(tenancy_url, requests) == [
        _exact_ids(tenancy_url, "big", q, 50, {"tag": 2}) for q in queries
    ]


def _executed_scans(url: str, namespace: str, exact_below: int,
                    plan_nodes: Callable[[dict[str, Any]], list[dict[str, Any]]],
                    parents: dict[str, str]) -> set[str]:
    """The indexes and tables the candidate statement actually scanned (loops > 0), by the
    names the schema gives them (a plan names the partition's, ``parents`` the schema's)."""
    params = {"namespace": namespace, "query": _queries(1)[0], "limit": 50,
              "exact_below": exact_below}
    with psycopg.connect(_libpq(url)) as conn:
        register_vector(conn)
        for setting in search_settings(50):
            conn.execute(setting)
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + CANDIDATES_SQL[False].replace("%(query)b",
                                                                             "%(query)s"),
            params,
        ).fetchone()
    assert plan is not None
    scanned = {
        node.get("Index Name", node.get("Relation Name", ""))
        for node in plan_nodes(plan[0][0]["Plan"])
        if node["Node Type"].endswith("Scan") and node.get("Actual Loops", 0) > 0
        and parents.get(node.get("Relation Name", "")) != "memory_factors"
    }
    return {parents.get(name, name) for name in scanned}


def test_the_statement_takes_the_branch_the_namespace_size_calls_for(
    tenancy_url: str,
    plan_nodes: Callable[[dict[str, Any]], list[dict[str, Any]]],
    partition_parents: dict[str, str],
) -> None:
    scans = {
        (namespace, exact_below): _executed_scans(
            tenancy_url, namespace, exact_below, plan_nodes, partition_parents
        )
        for namespace, exact_below in ((SMALL, 10_000), ("big", 1_000), ("big", 5_000))
    }
    assert "ix_memories_embedding_hnsw" not in scans[SMALL, 10_000]
    assert "ix_memories_embedding_hnsw" in scans["big", 1_000]
    assert "ix_memories_embedding_hnsw" not in scans["big", 5_000]
