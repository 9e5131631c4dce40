"""A tenant moved to the other worker while earm serves it, as an operator moves a hot tenant
away: clients ingest and retrieve on two namespaces throughout (a real `earm serve`), one of
them is given a shard group of its own on the other worker, and afterwards everything
acknowledged is there, the tenant's rows are all in its own shards on the target worker, and
both namespaces' retrieves answer as before. Two ways of doing it:

- ``isolate_tenant_to_new_shard`` (writes blocked: :data:`ISOLATE_MODE`), then
  ``citus_move_shard_placement`` by logical replication;
- one ``citus_split_shard_by_split_points`` by logical replication whose three children (the
  tenant's hash value alone, and the ranges either side) are all on the target worker.

No request fails. A move keeps its shards' ids: the statements it held up wait. A split (the
isolate, the split) replaces its shards with new ones, and the statements that waited for its
locks were planned for the old ones: Citus rolls their transactions back ("could not find
valid entry for shard", or a serialization failure "shard for the given value does not exist
... Retry the query"), for every namespace of the split group and for statements that waited
on the metadata too, and earm runs those write transactions again (service.db.writes), now
planned for the new shards.

How long each step took, the requests in flight and the slowest of them before and during
each, and how many write transactions were run again, are printed (``-s``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
NAMESPACES = ("agent-x", "agent-y")
#: Memories of known embeddings in each namespace, each found first by its own text before
#: and after a move.
PROBES = [f"probe {i}: a fact only this memory holds" for i in range(8)]
FOUND = [f"probe-{i}" for i in range(len(PROBES))]
#: How isolate_tenant_to_new_shard copies: with writes blocked. Logically ('auto',
#: 'force_logical') it never ends under earm's writes (Citus 14.0.1): it puts the new shards
#: on the source worker and gives them their primary keys only after its replication slot
#: exists, so an UPDATE committed in between (the indexer's, of `memories_p00`) is decoded
#: against a shard without a key, and the subscription's apply worker fails on it ("publisher
#: did not send replica identity column expected by the logical replication target
#: relation") and again after each restart.
ISOLATE_MODE = "block_writes"
#: How a shard group is moved or split to another worker: copied, then streamed by logical
#: replication, writes blocked only for the final catch-up and the metadata switch.
LOGICAL = "force_logical"
#: An operation that stalls fails the test instead of hanging it.
OPERATION_TIMEOUT = "-c statement_timeout=60s"

Operator = psycopg.Connection[Any]
#: A move of a namespace's shard group: (operator's connection, the group's shard of
#: ``namespaces``, the target worker's port, ``step(name)`` called as each step begins).
Move = Callable[[Operator, int, int, Callable[[str], None]], None]


@pytest.fixture(scope="module")
def database(citus_database: Callable[[str], str]) -> str:
    """A Citus database of this module's own: the tests change its shard layout for good."""
    return citus_database(DATABASE)


@pytest.fixture(scope="module")
def service(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # INFO: the log line of each write transaction run again, which the report counts.
    served = Service({"EARM_DATABASE_URL": database, "EARM_LOG_LEVEL": "INFO"},
                     tmp_path_factory.mktemp("tenant-move") / "serve.log")
    served.start()
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            for namespace in NAMESPACES:
                _store_probes(http, namespace)
        yield served
    finally:
        served.stop()


def _store_probes(http: httpx.Client, namespace: str) -> None:
    stored = http.post("/memories", json={"namespace": namespace, "memories": [
        {"text": probe, "external_id": found, "embedding": text_vector(probe, DIM)}
        for probe, found in zip(PROBES, FOUND, strict=True)
    ]})
    assert stored.status_code == 201, stored.text


def _probe_answers(url: str, namespace: str) -> list[str]:
    """The external id each probe's semantic retrieve ranks first: the probe's own memory,
    whatever else the clients stored meanwhile."""
    answers = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for probe in PROBES:
            answer = http.post("/retrieve", json={
                "namespace": namespace, "query": probe,
                "query_embedding": text_vector(probe, DIM), "k": 3, "policy": "semantic",
                "order": "relevance",
            })
            assert answer.status_code == 200, answer.text
            answers.append(answer.json()["memories"][0]["external_id"])
    return answers


def _placement(conn: Operator, table: str, namespace: str) -> tuple[int, int]:
    """The shard of ``table`` that holds ``namespace``'s rows, and the port of its worker."""
    row = conn.execute(
        "SELECT shardid, nodeport FROM citus_shards "
        "WHERE shardid = get_shard_id_for_distribution_column(%s::regclass, %s::text)",
        (table, namespace),
    ).fetchone()
    assert row is not None, table
    return int(row[0]), int(row[1])


def _memories(conn: Operator, namespace: str) -> int:
    row = conn.execute("SELECT count(*) FROM memories WHERE namespace = %s",
                       (namespace,)).fetchone()
    assert row is not None
    return int(row[0])


def _in_flight(requests: list[Request], start: float, end: float) -> tuple[int, float]:
    """How many requests were in flight at some moment of [start, end], and the longest."""
    overlapping = [r.seconds for r in requests if r.started < end and r.started + r.seconds > start]
    return len(overlapping), max(overlapping, default=0.0)


@dataclass
class Moved:
    """What a move under load did: the requests, when each step began (``steps``: name and
    start, the last entry when the move was done), and where the tenant went."""

    ledger: Ledger
    steps: list[tuple[str, float]]
    target: int
    #: Write transactions the service ran again (rolled back for a replaced shard).
    retried: int

    def report(self, namespace: str) -> str:
        requests = self.ledger.requests
        first = min(r.started for r in requests)
        count, slowest = _in_flight(requests, first, self.steps[0][1])
        figures = [f"before: {count} requests, slowest {slowest:.3f} s"]
        for (step, start), (_, end) in zip(self.steps, self.steps[1:], strict=False):
            count, slowest = _in_flight(requests, start, end)
            figures.append(f"{step} {end - start:.2f} s: {count} requests, slowest {slowest:.3f} s")
        return (f"\n{namespace} moved: " + "; ".join(figures)
                + f" ({len(requests)} in all; {self.retried} write transactions run again)")

    def failed(self) -> list[tuple[str, str, int, float]]:
        """(path, namespace, status, start) of each request not served."""
        return [(r.path, r.namespace, r.status, r.started) for r in self.ledger.requests
                if r.status not in (200, 201)]


def _retries_logged(service: Service) -> int:
    """How many write transactions ``service`` has run again (tenacity logs each)."""
    return sum('"logger": "service.db.writes"' in line
               for line in service.log_path.read_text().splitlines())


def _move_under_load(
    citus_cluster: CitusCluster, database: str, service: Service, namespace: str,
    move: Move,
) -> Moved:
    """Clients on every namespace while ``move`` moves ``namespace``'s shard group to the
    worker it is not on, then the checks every move must pass: no request failed, and the
    namespace's memories before and after compared to what the clients were told."""
    url = service.url
    retried_before = _retries_logged(service)
    ledger = Ledger()
    with psycopg.connect(libpq(database), autocommit=True, options=OPERATION_TIMEOUT) as conn:
        stored_before = _memories(conn, namespace)
        shard, source = _placement(conn, "namespaces", namespace)
        (target,) = {worker.port for worker in citus_cluster.workers} - {source}
        with Load(url, ledger, ingesters=2, retrievers=2, namespaces=NAMESPACES):
            wait_for(lambda: len(ledger.requests) >= 20)  # latencies under load, before
            steps: list[tuple[str, float]] = []
            move(conn, shard, target, lambda step: steps.append((step, time.monotonic())))
            steps.append(("done", time.monotonic()))
            served_before = len(ledger.requests)
            wait_for(lambda: len(ledger.requests) >= served_before + 20)  # served after it
    moved = Moved(ledger, steps, target, _retries_logged(service) - retried_before)
    print(moved.report(namespace))
    assert ledger.transport_errors == []
    assert moved.failed() == []
    check_everything_acknowledged_is_there(database, ledger)

    with psycopg.connect(libpq(database), autocommit=True) as conn:
        tables = ["namespaces", *citus.NAMESPACE_TABLES,
                  *(f"{table}_p00" for table in citus.NAMESPACE_TABLES)]
        placements = {table: _placement(conn, table, namespace) for table in tables}
        assert {port for _, port in placements.values()} == {target}, placements
        # Its own shard: the tenant's hash value alone is in its range.
        shard, _ = placements["namespaces"]
        assert conn.execute("SELECT shardminvalue = shardmaxvalue FROM pg_dist_shard "
                            "WHERE shardid = %s", (shard,)).fetchone() == (True,)
        expected = stored_before + sum(1 for ns, _, _ in ledger.memories if ns == namespace)
        assert _memories(conn, namespace) == expected
    # The rows themselves are in the target worker's shard of the tenant.
    (worker,) = (node for node in citus_cluster.workers if node.port == target)
    memories_shard, _ = placements["memories_p00"]
    with psycopg.connect(worker.libpq(DATABASE), autocommit=True) as worker_conn:
        assert worker_conn.execute(f"SELECT count(*) FROM memories_p00_{memories_shard} "
                                   "WHERE namespace = %s", (namespace,)).fetchone() == (expected,)
    for name in NAMESPACES:
        assert _probe_answers(url, name) == FOUND, name
    return moved


def test_a_tenant_isolated_then_moved_while_served_fails_no_request_and_loses_nothing(
    citus_cluster: CitusCluster, database: str, service: Service,
) -> None:
    def isolate_then_move(
        conn: Operator, shard: int, target: int, step: Callable[[str], None]
    ) -> None:
        step("isolate")
        conn.execute("SELECT isolate_tenant_to_new_shard('namespaces', %s::text, 'CASCADE', "
                     "shard_transfer_mode => %s::citus.shard_transfer_mode)",
                     ("agent-x", ISOLATE_MODE))
        isolated, source = _placement(conn, "namespaces", "agent-x")
        step("move")
        conn.execute("SELECT citus_move_shard_placement(%s::bigint, '127.0.0.1', %s::int, "
                     "'127.0.0.1', %s::int, shard_transfer_mode => %s::citus.shard_transfer_mode)",
                     (isolated, source, target, LOGICAL))

    _move_under_load(citus_cluster, database, service, "agent-x", isolate_then_move)


def test_a_tenant_split_off_onto_another_worker_while_served_fails_no_request(
    citus_cluster: CitusCluster, database: str, service: Service,
) -> None:
    def split_onto_target(
        conn: Operator, shard: int, target: int, step: Callable[[str], None]
    ) -> None:
        hashed = conn.execute("SELECT worker_hash(%s::text)", ("agent-y",)).fetchone()
        node = conn.execute("SELECT nodeid FROM pg_dist_node WHERE nodeport = %s",
                            (target,)).fetchone()
        assert hashed is not None and node is not None
        # Split points are the children's inclusive upper bounds: the middle child holds
        # the tenant's hash value alone. Every child on the target, none on the source:
        # there the split gives its shards their keys only after the slot (see ISOLATE_MODE).
        step("split")
        conn.execute("SELECT citus_split_shard_by_split_points(%s::bigint, %s::text[], "
                     "%s::int[], shard_transfer_mode => %s::citus.shard_transfer_mode)",
                     (shard, [str(hashed[0] - 1), str(hashed[0])], [node[0]] * 3, LOGICAL))

    _move_under_load(citus_cluster, database, service, "agent-y", split_onto_target)
