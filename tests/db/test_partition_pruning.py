"""Every statement a hot-path request runs reads and writes one partition per table (migration
0017): ingest (with an update of stored memories), retrieve (every policy, filtered or not,
through the exact scan and through the HNSW index, a repeated and a rephrased query, an answer
deadline whose late anchors are recorded after the answer), its record and online update, the
refit a retrieve makes due, feedback, the by-id routes (``GET/PATCH/DELETE /memories/{id}``,
``GET /queries/{id}``), the rerank protocol, and the namespace's listing, stats and erasure.

The plans are the server's own, of the statements as the code sends them: the test database
loads ``auto_explain`` in every session and has it send each statement's ``EXPLAIN ANALYZE``
to the client as a notice, which a handler on every pooled connection collects. A partition
counts as touched when a node of the plan ran on it (run-time pruning leaves the others
"never executed", plan-time and initial pruning leave them out). Inserts route rows without a
plan node per partition, so the test also reads the per-partition write counters of the whole
workload: every row inserted, updated or deleted is in the namespace's partitions.

Excluded, because they are background work across namespaces, not a request's: the indexer's
search for a namespace with a backlog (``service.db.memories._BACKLOG_NAMESPACE_SQL``, every
partition's; its batch then names the namespace and is checked like the rest) and the rerank
documents' expiry sweep (off here). Statements over every namespace (``GET /stats`` without a
namespace, the dashboard's namespace list, ``/metrics``) are not run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from pgvector.psycopg import register_vector
from psycopg.errors import Diagnostic
from psycopg.types.json import Jsonb
from sqlalchemy import event
from sqlalchemy.pool import Pool

from service.db.memories import _BACKLOG_NAMESPACE_SQL
from service.http.app import create_app
from service.settings import Settings
from service.testing import GatedReply, LoopbackServer, chat_completions_app

DIM = 384
NAMESPACE = "agent-pruned"
OTHER = "agent-elsewhere"  # in another partition: what a statement must not touch
NEIGHBOUR = "agent-neighbour-15"  # in NAMESPACE's partitions (the test checks it)
NEIGHBOUR_SIZE = 2000
TOPICS = 4
HELD = "held: the passport expires in November"
TABLES = (
    "memories", "queries", "query_factors", "scores", "score_history", "memory_factors",
    "rerank_documents",
)
#: auto_explain, for this database's sessions only: every statement's plan with its actual
#: rows, as a NOTICE to the client (parameters left out: vectors would make them huge).
AUTO_EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_timing": "off",
    "auto_explain.log_format": "json",
    "auto_explain.log_level": "notice",
    "auto_explain.log_parameter_max_length": "0",
}
BACKGROUND = (_BACKLOG_NAMESPACE_SQL,)


def _shape(statement: str) -> str:
    """A statement with its placeholders (``%(name)s`` as written, ``$n`` as sent) and spacing
    blurred, to recognise a plan's query text."""
    return re.sub(r"\s+", " ", re.sub(r"%\(\w+\)[sb]|\$\d+", "?", statement)).strip()


@dataclass
class Plans:
    """The plans auto_explain sends while :attr:`recording`."""

    recording: bool = False
    plans: list[dict[str, Any]] = field(default_factory=list)

    def connected(self, dbapi_connection: Any, connection_record: Any) -> None:
        # The app's engines adapt psycopg's AsyncConnection; a sync engine's is psycopg's own.
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        driver.add_notice_handler(self._notice)

    def _notice(self, diagnostic: Diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if self.recording and "plan:\n" in message:
            self.plans.append(json.loads(message.split("plan:\n", 1)[1]))


@pytest.fixture
def plans() -> Iterator[Plans]:
    collected = Plans()
    event.listen(Pool, "connect", collected.connected)
    try:
        yield collected
    finally:
        event.remove(Pool, "connect", collected.connected)


@pytest.fixture(scope="module")
def explained_url(migrated_database: Callable[[str], str]) -> str:
    name = "earm_test_pruning"
    url = migrated_database(name)
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        for setting, value in AUTO_EXPLAIN.items():
            conn.execute(f'ALTER DATABASE "{name}" SET {setting} = {value!r}')
    return url


@pytest.fixture
def judge() -> Iterator[tuple[GatedReply, str]]:
    reply = GatedReply(score="0.7")
    with LoopbackServer(chat_completions_app(reply)) as server:
        try:
            yield reply, server.url
        finally:
            reply.opened.set()


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _settings(url: str, judge_url: str, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "database_url": url,
        "scorer": "openai",
        "scorer_base_url": f"{judge_url}/v1",
        "scorer_max_retries": 0,
        "scorer_timeout_s": 30.0,
        "score_deadline_ms": 1500.0,
        "refit_process": "thread",
        "rerank_document_ttl_s": 0,
    }
    return Settings(**(options | overrides), _env_file=None)


def _vector(topic: int, i: int) -> list[float]:
    rng = np.random.default_rng(1000 * topic + i)
    center = np.random.default_rng(topic).normal(size=DIM)
    values = center + 0.6 * rng.normal(size=DIM)
    return (values / np.linalg.norm(values)).tolist()


def _memories(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"text": HELD if i == start else f"memory {i} about topic {i % TOPICS}",
         "embedding": _vector(i % TOPICS, i), "external_id": f"m{i}",
         "metadata": {"tag": i % 3}}
        for i in range(start, start + count)
    ]


def _ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


def _settle(client: TestClient, namespace: str) -> None:
    deadline = time.monotonic() + 60
    while _ok(client.get("/stats", params={"namespace": namespace}))["memories_unindexed"]:
        assert time.monotonic() < deadline, "the indexer did not catch up"
        time.sleep(0.05)


def _load_neighbour(url: str) -> str:
    """``NEIGHBOUR_SIZE`` indexed memories of a namespace that shares ``NAMESPACE``'s
    partitions, loaded in bulk (an index scan is cheaper than the exact one from a couple of
    thousand rows)."""
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        register_vector(conn)
        conn.execute("INSERT INTO namespaces (name) VALUES (%s)", (NEIGHBOUR,))
        with conn.cursor().copy(
            "COPY memories (namespace, text, embedding, embedding_model, indexed, metadata) "
            "FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["text", "text", "vector", "text", "bool", "jsonb"])
            for i in range(NEIGHBOUR_SIZE):
                copy.write_row((NEIGHBOUR, f"n{i}", np.asarray(_vector(i % TOPICS, i), np.float32),
                                "client", True, Jsonb({"tag": i % 3})))
        conn.execute("INSERT INTO memory_locator (id, namespace) "
                     "SELECT id, namespace FROM memories WHERE namespace = %s", (NEIGHBOUR,))
        conn.execute("ANALYZE memories")
        row = conn.execute(
            "SELECT tableoid::regclass::text FROM memories WHERE namespace = %s LIMIT 1",
            (NEIGHBOUR,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def _retrieve(client: TestClient, topic: int, i: int, **fields: Any) -> dict[str, Any]:
    body = {"namespace": NAMESPACE, "query": f"question {i} on topic {topic}",
            "query_embedding": _vector(topic, 500 + i), "k": 5} | fields
    result: dict[str, Any] = _ok(client.post("/retrieve", json=body))
    return result


def _requests(client: TestClient, indexed: TestClient, gate: GatedReply) -> None:
    """Every hot-path request, on the namespace ``NAMESPACE``."""
    _ok(client.post("/memories", json={"namespace": NAMESPACE, "memories": _memories(40)}), 201)
    _settle(client, NAMESPACE)
    edited = _memories(2, start=1)
    edited[0]["text"], edited[0]["embedding"] = "memory 1, rewritten", _vector(2, 901)
    _ok(client.post("/memories", json={
        "namespace": NAMESPACE, "memories": [*edited, *_memories(1, start=40)],
        "on_conflict": "update",
    }), 201)
    first = _retrieve(client, 0, 0, policy="full", candidates=50)
    assert first["late"] >= 1, "the held memory's score came after the answer"
    gate.opened.set()
    _wait_for_late(client, first["query_id"])
    queries = [
        _retrieve(client, topic, i, policy=policy, filters=filters)
        for i, (topic, policy, filters) in enumerate([
            (1, "earm", None), (1, "earm", None), (2, "observed", {"tag": 1}),
            (3, "semantic", None), (0, "earm", {"tag": 2}), (2, "earm", None),
        ], start=1)
    ]
    _retrieve(client, 1, 1, policy="earm")  # the same question again: its family's cells
    # Through the partition's HNSW index: a namespace of the same partition large enough for it.
    for i, fields in enumerate([{}, {"filters": {"tag": 0}}, {"policy": "earm"}]):
        _retrieve(indexed, 3, 9 + i, namespace=NEIGHBOUR, candidates=20, **fields)
    query_id, memory_id = queries[1]["query_id"], queries[1]["memories"][0]["id"]
    _ok(client.post("/feedback", json={"namespace": NAMESPACE, "query_id": query_id, "scores": [
        {"memory_id": memory_id, "score": 0.05}, {"external_id": "m7", "score": 0.95},
    ]}))
    _by_id(client, memory_id, query_id)
    _ok(client.post("/v1/rerank", json={
        "model": f"earm/{NAMESPACE}", "query": "what about topic 2?",
        "documents": ["memory 2 about topic 2", "a document nobody stored", "another new one"],
    }))
    _ok(client.get("/memories", params={"namespace": NAMESPACE, "limit": 10}))
    _ok(client.get("/stats", params={"namespace": NAMESPACE}))


def _wait_for_late(client: TestClient, query_id: int) -> None:
    deadline = time.monotonic() + 30
    while any(
        c["anchor"] and c["origin"] is None
        for c in _ok(client.get(f"/queries/{query_id}"))["candidates"]
    ):
        assert time.monotonic() < deadline, "the late anchors were not recorded"
        time.sleep(0.05)


def _by_id(client: TestClient, memory_id: int, query_id: int) -> None:
    _ok(client.get(f"/memories/{memory_id}"))
    _ok(client.patch(f"/memories/{memory_id}", json={"metadata": {"tag": 9}}))
    _ok(client.patch(f"/memories/{memory_id}", json={
        "text": "changed", "embedding": _vector(1, 999)
    }))
    _ok(client.get(f"/queries/{query_id}"))
    _ok(client.delete(f"/memories/{memory_id}"), 204)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _touched(plan: dict[str, Any], parents: dict[str, str]) -> set[tuple[str, str]]:
    """(table, partition) of every partition a node of the plan ran on."""
    return {
        (parents[node["Relation Name"]], node["Relation Name"])
        for node in _nodes(plan)
        if node.get("Relation Name", "") in parents and node.get("Actual Loops", 0) > 0
    }


_WRITES_SQL = (
    "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
    "WHERE relname ~ '_p[0-9]{2}$'"
)


def _writes(url: str) -> dict[str, int]:
    """Rows inserted, updated and deleted so far, by partition (once the backends that wrote
    them have reported: they report when they close)."""
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        return {name: int(count) for name, count in conn.execute(_WRITES_SQL)}


def _settled_writes(url: str) -> dict[str, int]:
    last, deadline = _writes(url), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if (now := _writes(url)) == last:
            return now
        last = now
    return last


def test_every_hot_path_statement_touches_one_partition_of_each_table(
    explained_url: str, plans: Plans, judge: tuple[GatedReply, str],
    partition_parents: dict[str, str],
) -> None:
    gate, judge_url = judge
    settings = _settings(explained_url, judge_url)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        # A neighbour in another partition, whose rows the statements must pass by.
        _ok(client.post("/memories", json={"namespace": OTHER, "memories": _memories(30)}), 201)
        _settle(client, OTHER)
    neighbour = _load_neighbour(explained_url)
    before = _settled_writes(explained_url)
    elsewhere = {name[-3:] for name, count in before.items() if count}
    parents = {child: parent for child, parent in partition_parents.items()
               if parent in TABLES}
    plans.recording = True
    indexed_settings = _settings(
        explained_url, judge_url, exact_scan_below=0, exact_scan_below_filtered=0
    )
    with (
        TestClient(create_app(settings, refit_in_request=True)) as client,
        TestClient(create_app(indexed_settings, refit_in_request=True)) as indexed,
    ):
        _requests(client, indexed, gate)
        _ok(client.delete(f"/namespaces/{NAMESPACE}"), 200)
    plans.recording = False
    written = {
        name for name, count in _settled_writes(explained_url).items()
        if count != before.get(name, 0)
    }

    background = {_shape(statement) for statement in BACKGROUND}
    checked = [p for p in plans.plans if _shape(p["Query Text"]) not in background]
    touched = {p["Query Text"]: _touched(p["Plan"], parents) for p in checked}
    # The namespace's partitions: where its rows were written (inserts name no partition).
    remainders = {name[-3:] for name in written}
    assert len(remainders) == 1, f"the workload wrote to {sorted(written)}"
    (remainder,) = remainders
    assert elsewhere - {remainder}, "a namespace in another partition was passed by"
    assert neighbour.endswith(remainder), "the HNSW search's namespace is this partition's"
    for text, found in touched.items():
        tables = [table for table, _ in found]
        assert len(tables) == len(set(tables)) and all(
            partition.endswith(remainder) for _, partition in found
        ), f"{sorted(found)} touched by:\n{text}"
    _assert_covered([_shape(text) for text in touched])
    graphs = [
        node for plan in checked for node in _nodes(plan["Plan"])
        if partition_parents.get(node.get("Index Name", "")) == "ix_memories_embedding_hnsw"
        and node.get("Actual Loops", 0) > 0
    ]
    assert graphs, "no search went through the partition's HNSW index"


def _assert_covered(texts: list[str]) -> None:
    """The workload ran the statements it is meant to pin (a route that stopped running one
    would leave it unchecked)."""
    expected = {
        "ingest": "INSERT INTO memory_locator",
        "edit": "UPDATE memories SET",
        "search": "embedding <=>",
        "record": "INSERT INTO query_locator",
        "online update": "INSERT INTO memory_factors",
        "late record": "clock_timestamp() FROM q, t",
        "refit read": "COPY (SELECT memory_id, query_id",
        "refit write": "FROM earm_refit_queries",
        "refit write, recorded since": "(s.query_id, s.memory_id) IN",
        "feedback": "INSERT INTO score_history",
        "by id": "FROM memory_locator WHERE id",
        "trace": "FROM query_locator WHERE id",
        "rerank": "UPDATE rerank_documents",
        "erase": "DELETE FROM score_history",
    }
    missing = [name for name, marker in expected.items()
               if not any(_shape(marker) in text for text in texts)]
    assert not missing, f"no statement of {missing} was explained"
