"""A tenant moved while earm serves it: under clients that ingest and retrieve on two
namespaces, one of them is isolated to a shard group of its own and that group is moved to
the other worker, as an operator rebalances a hot tenant. The move fails no request (Citus
blocks writes for its final catch-up; they wait), everything acknowledged is there afterwards,
the tenant's rows are all on the target worker, and its retrieves answer as before.

The isolate blocks writes while it copies (:data:`ISOLATE_MODE`), and a statement that waited
for the lock of a shard it dropped fails ("could not find valid entry for shard": Citus chose
the shard before it waited). Those requests, of any namespace of the split shard group, are
answered 503 with Retry-After (a retry finds the new shards), never 500.

The isolate and the move, and how long requests took before and during them, are printed
(``-s``): the figures docs/sharding.md quotes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from service.db import citus
from service.testing import text_vector
from service.testing.citus import CitusCluster
from service.testing.standby import libpq
from tests.load import (
    DIM,
    Ledger,
    Load,
    Request,
    Service,
    check_everything_acknowledged_is_there,
    wait_for,
)

DATABASE = "earm_citus_move"
MOVED = "agent-x"
STAYING = "agent-y"
#: Memories of known embeddings in each namespace, each found first by its own text before
#: and after the move.
PROBES = [f"probe {i}: a fact only this memory holds" for i in range(8)]
FOUND = [f"probe-{i}" for i in range(len(PROBES))]
#: How the tenant's rows are split off: with writes blocked while its shard group is copied.
#: A logical split ('auto', 'force_logical') never ends under earm's writes: its subscription's
#: apply worker fails on the indexer's UPDATE of the new shard of `memories_p00` ("publisher
#: did not send replica identity column expected by the logical replication target
#: relation") and retries for ever (Citus 14.0.1; citusdata/citus#6790 is such a stall).
ISOLATE_MODE = "block_writes"
#: How the isolated group is moved: copied, then streamed by logical replication, writes
#: blocked only for the final catch-up and the metadata switch.
MOVE_MODE = "auto"
#: An operation that stalls fails the test instead of hanging it.
OPERATION_TIMEOUT = "-c statement_timeout=60s"


@pytest.fixture(scope="module")
def database(citus_database: Any) -> str:
    """A Citus database of this module's own: the test changes its shard layout for good."""
    url: str = citus_database(DATABASE)
    return url


@pytest.fixture(scope="module")
def service(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    served = Service({"EARM_DATABASE_URL": database},
                     tmp_path_factory.mktemp("tenant-move") / "serve.log")
    served.start()
    try:
        yield served
    finally:
        served.stop()


def _store_probes(http: httpx.Client, namespace: str) -> None:
    stored = http.post("/memories", json={"namespace": namespace, "memories": [
        {"text": probe, "external_id": f"probe-{i}", "embedding": text_vector(probe, DIM)}
        for i, probe in enumerate(PROBES)
    ]})
    assert stored.status_code == 201, stored.text


def _probe_answers(http: httpx.Client, namespace: str) -> list[str]:
    """The external id each probe's semantic retrieve ranks first: the probe's own memory,
    whatever else the clients stored meanwhile."""
    answers = []
    for probe in PROBES:
        answer = http.post("/retrieve", json={
            "namespace": namespace, "query": probe, "query_embedding": text_vector(probe, DIM),
            "k": 3, "policy": "semantic", "order": "relevance",
        })
        assert answer.status_code == 200, answer.text
        answers.append(answer.json()["memories"][0]["external_id"])
    return answers


def _placement(conn: psycopg.Connection[Any], table: str, namespace: str) -> tuple[int, int]:
    """The shard of ``table`` that holds ``namespace``'s rows, and the port of its worker."""
    row = conn.execute(
        "SELECT shardid, nodeport FROM citus_shards "
        "WHERE shardid = get_shard_id_for_distribution_column(%s::regclass, %s::text)",
        (table, namespace),
    ).fetchone()
    assert row is not None, table
    return int(row[0]), int(row[1])


def _slowest(requests: list[Request], start: float, end: float) -> tuple[int, float]:
    """How many requests were in flight at some moment of [start, end], and the longest."""
    overlapping = [r.seconds for r in requests if r.started < end and r.started + r.seconds > start]
    return len(overlapping), max(overlapping, default=0.0)


def test_a_tenant_isolated_and_moved_while_served_loses_nothing_and_its_move_fails_nothing(
    citus_cluster: CitusCluster, database: str, service: Service,
) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as http:
        for namespace in (MOVED, STAYING):
            _store_probes(http, namespace)
            assert _probe_answers(http, namespace) == FOUND, namespace

    ledger = Ledger()
    coordinator = libpq(database)
    with Load(service.url, ledger, ingesters=2, retrievers=2, namespaces=(MOVED, STAYING)), \
            psycopg.connect(coordinator, autocommit=True, options=OPERATION_TIMEOUT) as conn:
        wait_for(lambda: len(ledger.requests) >= 20)  # a baseline of latencies under load
        isolate_started = time.monotonic()
        conn.execute("SELECT isolate_tenant_to_new_shard('namespaces', %s::text, 'CASCADE', "
                     "shard_transfer_mode => %s::citus.shard_transfer_mode)",
                     (MOVED, ISOLATE_MODE))
        move_started = time.monotonic()
        shard, source = _placement(conn, "namespaces", MOVED)
        (target,) = {worker.port for worker in citus_cluster.workers} - {source}
        conn.execute("SELECT citus_move_shard_placement(%s::bigint, '127.0.0.1', %s::int, "
                     "'127.0.0.1', %s::int, shard_transfer_mode => %s::citus.shard_transfer_mode)",
                     (shard, source, target, MOVE_MODE))
        moved = time.monotonic()
        served_before_move = len(ledger.requests)
        wait_for(lambda: len(ledger.requests) >= served_before_move + 20)  # served after it

    requests = ledger.requests
    first = min(r.started for r in requests)
    baseline = _slowest(requests, first, isolate_started)
    isolating = _slowest(requests, isolate_started, move_started)
    moving = _slowest(requests, move_started, moved)
    print(f"\ntenant move: isolate ({ISOLATE_MODE}) {move_started - isolate_started:.2f} s, "
          f"move ({MOVE_MODE}) {moved - move_started:.2f} s; requests (count, slowest s): "
          f"before {baseline[0]} {baseline[1]:.3f}, isolating {isolating[0]} {isolating[1]:.3f}, "
          f"moving {moving[0]} {moving[1]:.3f}; {len(requests)} requests in all")
    # (path, namespace, status, start relative to the isolate's) of each request not served
    failed = [(r.path, r.namespace, r.status, round(r.started - isolate_started, 2))
              for r in requests if r.status not in (200, 201)]
    assert ledger.transport_errors == []
    assert all(status == 503 for _, _, status, _ in failed), failed
    # Asked to retry only while the isolate blocked writes: none once it was done.
    assert all(isolate_started + started < move_started for *_, started in failed), failed
    check_everything_acknowledged_is_there(database, ledger)

    with psycopg.connect(coordinator, autocommit=True) as conn:
        tables = ["namespaces", *citus.NAMESPACE_TABLES,
                  *(f"{table}_p00" for table in citus.NAMESPACE_TABLES)]
        placements = {table: _placement(conn, table, MOVED) for table in tables}
        assert {port for _, port in placements.values()} == {target}, placements
        # Isolated: the tenant's hash value alone is in its shards' range.
        assert conn.execute("SELECT shardminvalue = shardmaxvalue FROM pg_dist_shard "
                            "WHERE shardid = %s", (shard,)).fetchone() == (True,)
        expected = len(PROBES) + sum(1 for ns, _, _ in ledger.memories if ns == MOVED)
        assert conn.execute("SELECT count(*) FROM memories WHERE namespace = %s",
                            (MOVED,)).fetchone() == (expected,)
    # The rows themselves are in the target worker's shard of the tenant.
    memories_shard, _ = placements["memories_p00"]
    (worker,) = (node for node in citus_cluster.workers if node.port == target)
    with psycopg.connect(worker.libpq(DATABASE), autocommit=True) as worker_conn:
        assert worker_conn.execute(f"SELECT count(*) FROM memories_p00_{memories_shard} "
                              "WHERE namespace = %s", (MOVED,)).fetchone() == (expected,)

    with httpx.Client(base_url=service.url, timeout=30) as http:
        for namespace in (MOVED, STAYING):
            assert _probe_answers(http, namespace) == FOUND, namespace
