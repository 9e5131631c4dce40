"""Read replicas against a real streaming replica of the embedded Postgres.

The module starts its own pair (the session's server stays untouched): an embedded primary,
and a hot standby made from it with the package's ``pg_basebackup -R -X stream``, which
applies each commit ``APPLY_DELAY_MS`` late (``recovery_min_apply_delay``), so "the replica
has not replayed the write yet" is the rule right after a write, not a race to be lucky in.
One earm serves on loopback with the standby as its replica; the tests read through it and
count where each read went in ``/metrics`` (``earm_replica_reads_total``) and on the standby
(its client connections).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.db import migrate
from service.http.app import create_app
from service.settings import Settings
from service.testing import GatedReply, LoopbackServer, chat_completions_app, text_vector
from service.testing.standby import StandbyPair, libpq, start_pair

pytestmark = pytest.mark.replica

DIM = 384
DATABASE = "earm_replica"
#: The standby applies each commit this long after it was made on the primary.
APPLY_DELAY_MS = 500


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    # Not under pytest's temporary root: another pytest run may make it 0700 again, and the
    # standby's pg_ctl runs as the embedded server's user, who must reach the directory.
    directory = Path(tempfile.mkdtemp(prefix="earm-replica-test-"))
    pair = start_pair(directory, APPLY_DELAY_MS)
    try:
        engine = create_engine(pair.server_url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
        engine.dispose()
        migrate.upgrade_to_head(pair.url(DATABASE), DIM)
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def standby(pair: StandbyPair) -> StandbyPair:
    """The pair with its standby running (a test may have killed it) and caught up."""
    if not pair.standby_running():
        pair.start_standby()
    pair.wait_replayed()
    return pair


@pytest.fixture
def serve(standby: StandbyPair) -> Iterator[Any]:
    """Factory of earm servers over the pair (each a fresh process state: it has written
    nothing yet), stopped after the test."""
    servers: list[LoopbackServer] = []

    def start(refit_in_request: bool = False, **overrides: Any) -> str:
        settings = Settings(
            **{
                "database_url": standby.url(DATABASE),
                "database_replica_urls": standby.replica_url(DATABASE),
                "embedder": "none",
                "scorer": "local",
                "db_pool_size": 4,
                **overrides,
            },
            _env_file=None,
        )
        server = LoopbackServer(create_app(settings, refit_in_request=refit_in_request)).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def _standby_clients(pair: StandbyPair) -> int:
    """Client connections to the test database on the standby (earm's replica pool)."""
    with psycopg.connect(libpq(pair.replica_url(DATABASE)), autocommit=True) as standby:
        row = standby.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (DATABASE,),
        ).fetchone()
        assert row is not None
        return int(row[0])


def _outcomes(http: httpx.Client | TestClient) -> dict[str, float]:
    """``earm_replica_reads_total`` by outcome."""
    body = http.get("/metrics").text
    return {
        outcome: float(value)
        for outcome, value in re.findall(
            r'^earm_replica_reads_total\{outcome="(\w+)"\} (\S+)$', body, re.MULTILINE
        )
    }


def _memories(namespace: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "text": f"{namespace} memory {i}",
            "embedding": text_vector(f"{namespace} memory {i}", DIM),
            "external_id": f"m{i}",
        }
        for i in range(start, start + count)
    ]


def _semantic(http: httpx.Client, namespace: str, query: str) -> dict[str, Any]:
    response = http.post("/retrieve", json={
        "namespace": namespace, "query": query, "query_embedding": text_vector(query, DIM),
        "k": 3, "policy": "semantic", "order": "relevance",
    })
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_reads_are_served_by_the_replica(standby: StandbyPair, serve: Any) -> None:
    with httpx.Client(base_url=serve(), timeout=30) as writer:
        ids = writer.post("/memories", json={
            "namespace": "read-a", "memories": _memories("read-a", 6),
        }).json()["ids"]
        query_id = _semantic(writer, "read-a", "read-a memory 2")["query_id"]
    standby.wait_replayed()
    # A process that wrote nothing itself has nothing to wait for: every read on the replica.
    with httpx.Client(base_url=serve(), timeout=30) as reader:
        assert len(reader.get("/memories", params={"namespace": "read-a"}).json()["memories"]) == 6
        assert reader.get(f"/memories/{ids[2]}").json()["text"] == "read-a memory 2"
        assert reader.get(f"/queries/{query_id}").json()["namespace"] == "read-a"
        assert reader.get("/stats", params={"namespace": "read-a"}).json()["queries"] == 1
        assert reader.get("/stats").status_code == 200
        assert reader.get("/dashboard/namespaces/read-a").status_code == 200
        assert reader.get(f"/dashboard/queries/{query_id}").status_code == 200
        # Its record then goes to the primary, and the reads after it would wait for that.
        found = _semantic(reader, "read-a", "read-a memory 4")
        assert found["memories"][0]["id"] == ids[4]
        outcomes = _outcomes(reader)
        # A learning retrieve reads the namespace's latest record: on the primary, uncounted.
        learning = reader.post("/retrieve", json={
            "namespace": "read-a", "query": "q", "query_embedding": text_vector("q", DIM),
            "k": 2, "policy": "earm",
        })
        assert learning.status_code == 200, learning.text
        assert _outcomes(reader) == outcomes
    assert outcomes.get("replica", 0) == 8, outcomes
    assert outcomes.get("primary_lag", 0) == 0 and outcomes.get("primary_error", 0) == 0
    assert _standby_clients(standby) > 0  # the reads' pooled connections are the standby's


def test_a_sequential_client_reads_its_own_writes(standby: StandbyPair, serve: Any) -> None:
    """Right after each write the standby is APPLY_DELAY_MS behind it: the reads that follow
    see the write all the same (from the primary), and a namespace this process did not
    write is still read from the replica."""
    with httpx.Client(base_url=serve(), timeout=30) as http:
        http.post("/memories", json={"namespace": "other", "memories": _memories("other", 2)})
        standby.wait_replayed()  # the namespace "other" is on the replica, and unwritten since
        for round_ in range(3):
            added = http.post("/memories", json={
                "namespace": "ryw", "memories": _memories("ryw", 1, start=round_),
            })
            assert added.status_code == 201, added.text
            (memory_id,) = added.json()["ids"]
            listed = http.get("/memories", params={"namespace": "ryw"}).json()["memories"]
            assert [m["id"] for m in listed][-1] == memory_id
            assert http.get(f"/memories/{memory_id}").status_code == 200
            found = _semantic(http, "ryw", f"ryw memory {round_}")
            assert found["memories"][0]["id"] == memory_id
            trace = http.get(f"/queries/{found['query_id']}")
            assert trace.status_code == 200, trace.text
            assert http.get("/stats", params={"namespace": "ryw"}).json()["queries"] == round_ + 1
        lagging = _outcomes(http)
        assert http.get("/memories", params={"namespace": "other"}).status_code == 200
        outcomes = _outcomes(http)
    # At least the listing right after each ingest found the standby behind (most of the reads
    # of a round do: a slow round may give the standby time to catch up before its last ones).
    assert lagging.get("primary_lag", 0) >= 3, lagging
    assert outcomes.get("replica", 0) == lagging.get("replica", 0) + 1, (lagging, outcomes)


def test_a_late_anchor_recorded_after_the_answer_is_read_back(
    standby: StandbyPair, serve: Any
) -> None:
    """The anchors a loopback judge holds past the answer deadline are recorded in the
    background once it answers: the trace and the counts read right after (the standby
    applies that commit APPLY_DELAY_MS late) show them all the same."""
    held = ["held: the passport expires in November", "held: rent is due on the first"]
    texts = ["the garden needs water", "roses were pruned in March", *held]
    reply = GatedReply(score="0.9")
    with LoopbackServer(chat_completions_app(reply)) as judge:
        try:
            url = serve(
                scorer="openai", scorer_base_url=f"{judge.url}/v1", scorer_max_retries=0,
                # Room for the unheld prompts on a loaded 2-core machine (as the answer
                # deadline's own tests give them).
                score_deadline_ms=2500.0, scorer_timeout_s=30.0, refit_process="thread",
                refit_in_request=True,
            )
            with httpx.Client(base_url=url, timeout=30) as http:
                ids = http.post("/memories", json={"namespace": "late", "memories": [
                    {"text": text, "embedding": text_vector(text, DIM)} for text in texts
                ]}).json()["ids"]
                answer = http.post("/retrieve", json={
                    "namespace": "late", "query": "what is due?",
                    "query_embedding": text_vector("what is due?", DIM), "k": len(texts),
                    "policy": "full",
                }).json()
                assert answer["late"] >= len(held), answer
                standby.wait_replayed()  # the record is on the replica; the late scores not
                reply.opened.set()
                _until(lambda: _late_recorded(http) == answer["late"])
                trace = http.get(f"/queries/{answer['query_id']}").json()["candidates"]
                stats = http.get("/stats", params={"namespace": "late"}).json()
        finally:
            reply.opened.set()  # lets the judge's held requests end before it stops
    origins = {c["memory_id"]: c["origin"] for c in trace}
    assert [origins[memory_id] for memory_id in ids] == ["scorer"] * len(texts), origins
    assert stats["observations"] == len(texts), stats


def _late_recorded(http: httpx.Client) -> float:
    """``earm_late_anchors_total{outcome="recorded"}``: counted once the record committed."""
    found = re.search(
        r'^earm_late_anchors_total\{outcome="recorded"\} (\S+)$', http.get("/metrics").text,
        re.MULTILINE,
    )
    return 0.0 if found is None else float(found[1])


def test_a_killed_replica_fails_no_request(standby: StandbyPair, serve: Any) -> None:
    """Readers in threads while the standby is stopped with ``-m immediate``: every request
    is answered, from the primary once the replica failed."""
    url = serve()
    with httpx.Client(base_url=url, timeout=30) as http:
        ids = http.post("/memories", json={
            "namespace": "load", "memories": _memories("load", 8),
        }).json()["ids"]
    standby.wait_replayed()
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def read_loop(worker: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                responses = [
                    http.get("/memories", params={"namespace": "load"}),
                    http.get(f"/memories/{ids[worker]}"),
                    http.get("/stats", params={"namespace": "load"}),
                ]
                for response in responses:
                    if response.status_code != 200:
                        failures.append(f"{response.request.url}: {response.status_code}")
                answered[0] += len(responses)

    threads = [threading.Thread(target=read_loop, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        _until(lambda: answered[0] >= 30)
        standby.kill_standby()
        killed_at = answered[0]
        _until(lambda: answered[0] >= killed_at + 60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == []
    with httpx.Client(base_url=url, timeout=30) as http:
        outcomes = _outcomes(http)
    assert outcomes.get("replica", 0) > 0, outcomes
    assert outcomes.get("primary_error", 0) >= 1, outcomes
    assert outcomes.get("primary_down", 0) > 0, outcomes


def test_a_replica_down_from_the_start_costs_nothing_but_a_connect(settings: Settings) -> None:
    """Nothing listens at the replica's socket: earm starts, and the reads the replica would
    serve are answered from the primary (one failure, then marked down)."""
    missing = re.sub(r"host=[^&]+", "host=/nonexistent-earm-replica", settings.database_url or "")
    down = settings.model_copy(update={"database_replica_urls": missing})
    with TestClient(create_app(down)) as client:
        client.post("/memories", json={"namespace": "n", "memories": _memories("n", 2)})
        for _ in range(3):
            assert len(client.get("/memories", params={"namespace": "n"}).json()["memories"]) == 2
        outcomes = _outcomes(client)
    # Marked down after the first failure: the next reads skip it (unless 5 s went by).
    assert outcomes.get("primary_error", 0) >= 1 and "replica" not in outcomes, outcomes
    assert sum(outcomes.values()) == 3 and outcomes.get("primary_down", 0) >= 1, outcomes


def test_a_server_not_in_recovery_serves_only_what_needs_no_replay(settings: Settings) -> None:
    """A "replica" URL naming the primary itself has no replay position: a read that must see
    this process's write goes to the primary; one that need not is served there."""
    itself = settings.model_copy(update={"database_replica_urls": settings.database_url})
    with TestClient(create_app(itself)) as client:
        assert client.get("/memories", params={"namespace": "n"}).status_code == 200
        client.post("/memories", json={"namespace": "n", "memories": _memories("n", 1)})
        assert len(client.get("/memories", params={"namespace": "n"}).json()["memories"]) == 1
        outcomes = _outcomes(client)
    assert outcomes == {"replica": 1.0, "primary_lag": 1.0}


def _until(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
