"""The hot-path workload whose statements the pruning tests explain, on single-node Postgres
(tests/db/test_partition_pruning.py: one partition per table) and on Citus
(tests/citus/test_one_shard.py: one shard task): ingest (with an update of stored memories),
retrieve (every policy, filtered or not, through the exact scan and through the HNSW index, a
repeated and a rephrased query, an answer deadline whose late anchors are recorded after the
answer), its record and online update, the refit a retrieve makes due, feedback, the by-id
routes (``GET/PATCH/DELETE /memories/{id}``, ``GET /queries/{id}``), the rerank protocol, and
the namespace's listing, stats and erasure.

What is read is the server's own report on the statements as the code sends them: the test
sets its database up to send it to the client as messages (:func:`set_for_every_session`; on
a single node :data:`AUTO_EXPLAIN`, each statement's ``EXPLAIN ANALYZE``), and a
:class:`Collector` (:class:`Plans` for auto_explain) puts a handler on every pooled connection
of the app while :meth:`Workload.run` runs.

Three namespaces: :data:`NAMESPACE` (the requests'), :data:`NEIGHBOUR` (in its partition on a
single node and in its shard on Citus at the tests' 4 shards, large enough for the HNSW index)
and :data:`OTHER` (in another partition, and in a shard on the other Citus worker): what a
statement must pass by.

Not run: statements over every namespace (``GET /stats`` without a namespace, the dashboard's
namespace list, ``/metrics``); off: the rerank documents' expiry sweep. The indexer's
statements (:data:`BACKGROUND`) run but are background work across namespaces, not a
request's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import psycopg
from fastapi.testclient import TestClient
from pgvector.psycopg import register_vector
from psycopg.errors import Diagnostic
from psycopg.types.json import Jsonb
from sqlalchemy import event
from sqlalchemy.pool import Pool

from service.db.memories import _BACKLOG_NAMESPACE_SQL, _INDEX_BATCH_SQL
from service.http.app import create_app
from service.settings import Settings
from service.testing import GatedReply, LoopbackServer, chat_completions_app
from service.testing.standby import libpq

DIM = 384
NAMESPACE = "agent-pruned"
OTHER = "agent-elsewhere-4"
NEIGHBOUR = "agent-neighbour-209"
NEIGHBOUR_SIZE = 2000
TOPICS = 4
HELD = "held: the passport expires in November"
#: auto_explain, for the database's sessions: every statement's plan with its actual rows, as
#: a NOTICE to the client (parameters left out: vectors would make them huge).
AUTO_EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_timing": "off",
    "auto_explain.log_format": "json",
    "auto_explain.log_level": "notice",
    "auto_explain.log_parameter_max_length": "0",
}
#: The indexer's: which namespace has a backlog (every partition's, every shard's), then a
#: batch of that namespace's.
BACKGROUND = (_BACKLOG_NAMESPACE_SQL, _INDEX_BATCH_SQL)


def shape(statement: str) -> str:
    """A statement with its placeholders (``%(name)s`` as written, ``$n`` as sent) and spacing
    blurred, to recognise a plan's query text."""
    return re.sub(r"\s+", " ", re.sub(r"%\(\w+\)[sb]|\$\d+", "?", statement)).strip()


def is_background(statement: str) -> bool:
    return shape(statement) in {shape(background) for background in BACKGROUND}


def set_for_every_session(
    conn: psycopg.Connection[Any], database: str, settings: Mapping[str, str]
) -> None:
    """``settings`` in every later session of ``database``."""
    for setting, value in settings.items():
        conn.execute(f'ALTER DATABASE "{database}" SET {setting} = {value!r}')


class Collector(Protocol):
    """What gathers the server's reports on the statements while :attr:`recording`: given
    every new connection of the app's pools (:meth:`connected`), it adds a notice handler."""

    recording: bool

    def connected(self, dbapi_connection: Any, connection_record: Any) -> None: ...


def driver_connection(dbapi_connection: Any) -> Any:
    """psycopg's connection of a pool's: the app's engines adapt psycopg's AsyncConnection;
    a sync engine's is psycopg's own."""
    return getattr(dbapi_connection, "driver_connection", dbapi_connection)


@dataclass
class Plans:
    """The plans auto_explain sends while :attr:`recording`."""

    recording: bool = False
    plans: list[dict[str, Any]] = field(default_factory=list)

    def connected(self, dbapi_connection: Any, connection_record: Any) -> None:
        driver_connection(dbapi_connection).add_notice_handler(self._notice)

    def _notice(self, diagnostic: Diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if self.recording and "plan:\n" in message:
            self.plans.append(json.loads(message.split("plan:\n", 1)[1]))


@dataclass
class Workload:
    """The workload on the database at ``url`` (:func:`workload`)."""

    url: str
    gate: GatedReply
    judge_url: str

    def settings(self, **overrides: Any) -> Settings:
        options: dict[str, Any] = {
            "database_url": self.url,
            "scorer": "openai",
            "scorer_base_url": f"{self.judge_url}/v1",
            "scorer_max_retries": 0,
            "scorer_timeout_s": 30.0,
            "score_deadline_ms": 1500.0,
            "refit_process": "thread",
            "rerank_document_ttl_s": 0,
        }
        return Settings(**(options | overrides), _env_file=None)

    def prepare(self) -> None:
        """The namespaces the statements pass by: :data:`OTHER`'s few memories, ingested
        and indexed, and :data:`NEIGHBOUR`'s many, loaded in bulk."""
        with TestClient(create_app(self.settings(), refit_in_request=True)) as client:
            _ok(client.post("/memories", json={"namespace": OTHER, "memories": _memories(30)}),
                201)
            _settle(client, OTHER)
        _load_neighbour(self.url)

    def run(self, collector: Collector) -> None:
        """Every hot-path request on :data:`NAMESPACE`, then its erasure, recorded by
        ``collector``."""
        event.listen(Pool, "connect", collector.connected)
        collector.recording = True
        # Through the HNSW index: a namespace of the same partition large enough for it.
        indexed_settings = self.settings(exact_scan_below=0, exact_scan_below_filtered=0)
        try:
            with (
                TestClient(create_app(self.settings(), refit_in_request=True)) as client,
                TestClient(create_app(indexed_settings, refit_in_request=True)) as indexed,
            ):
                _requests(client, indexed, self.gate)
                _ok(client.delete(f"/namespaces/{NAMESPACE}"), 200)
        finally:
            collector.recording = False
            event.remove(Pool, "connect", collector.connected)


@contextmanager
def workload(url: str) -> Iterator[Workload]:
    """The workload on ``url``, with a judge that holds the :data:`HELD` memory's score past
    the answer deadline until the workload lets it through."""
    gate = GatedReply(score="0.7")
    with LoopbackServer(chat_completions_app(gate)) as server:
        try:
            yield Workload(url, gate, server.url)
        finally:
            gate.opened.set()


def settled(read: Callable[[], dict[str, int]]) -> dict[str, int]:
    """``read``'s counters once they stop moving (at most 10 s): the server's statistics of
    rows written or index scans, which a backend reports when it goes idle or closes."""
    last, deadline = read(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if (now := read()) == last:
            return now
        last = now
    return last


def assert_covered(texts: list[str]) -> None:
    """The workload ran the statements it is meant to pin (a route that stopped running one
    would leave it unchecked); ``texts`` are :func:`shape` s of the explained statements."""
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
               if not any(shape(marker) in text for text in texts)]
    assert not missing, f"no statement of {missing} was explained"


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


def _load_neighbour(url: str) -> None:
    """``NEIGHBOUR_SIZE`` indexed memories of :data:`NEIGHBOUR`, loaded in bulk (an index scan
    is cheaper than the exact one from a couple of thousand rows)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        # Not explained: no request's statements (and Citus cannot explain the parameterised
        # INSERT … SELECT once it has run).
        conn.execute("SET auto_explain.log_min_duration = -1")
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
