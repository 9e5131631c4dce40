"""`earm migrate` on Citus: the schema distributed as docs/sharding.md says, idempotently, and
a populated single-node schema distributed in place with nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
from fastapi.testclient import TestClient

from service.db import citus, migrate
from service.http.app import create_app
from service.settings import Settings
from service.testing.citus import CitusCluster
from service.testing.standby import libpq

DIM = 384
PLACEMENT_SQL = (
    "SELECT table_name::text, citus_table_type, distribution_column, colocation_id "
    "FROM citus_tables"
)


def _placement(url: str) -> dict[str, tuple[str, str, int]]:
    with psycopg.connect(libpq(url)) as conn:
        rows = conn.execute(PLACEMENT_SQL).fetchall()
    return {name: (kind, column, colocation) for name, kind, column, colocation in rows}


def test_migrate_distributes_a_namespaces_tables_together_and_keys_everywhere(
    database_url: str,
) -> None:
    placement = _placement(database_url)
    namespaces = placement["namespaces"]
    assert namespaces[:2] == ("distributed", "name")
    for table in citus.NAMESPACE_TABLES:
        # The table, and its one partition, co-located with the namespaces.
        for name in (table, f"{table}_p00"):
            assert placement[name] == ("distributed", "namespace", namespaces[2]), name
        assert f"{table}_p01" not in placement
    memory_locator = placement["memory_locator"]
    assert memory_locator[:2] == ("distributed", "id")
    assert placement["query_locator"] == memory_locator
    for table in citus.REFERENCE_TABLES:
        assert placement[table][0] == "reference"
    assert "alembic_version" not in placement


def _earm_migrate(url: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")}
    done = subprocess.run(
        [sys.executable, "-m", "service", "migrate"],
        env=environment | {"EARM_DATABASE_URL": url, "EARM_EMBEDDER": "none"},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_earm_migrate_distributes_a_new_citus_database_once(
    citus_cluster: CitusCluster,
) -> None:
    url = citus_cluster.database("earm_citus_cli")
    first = _earm_migrate(url)
    assert "distributed on Citus: api_keys, auth_settings, namespaces, memories" in first
    placed = _placement(url)
    assert {*citus.REFERENCE_TABLES, "namespaces", *citus.NAMESPACE_TABLES,
            *citus.LOCATOR_TABLES} <= set(placed)
    again = _earm_migrate(url)
    assert "distributed" not in again
    assert _placement(url) == placed


def _populate(client: TestClient, namespace: str) -> None:
    memories = [{"text": f"note {i} about {topic}"} for i, topic in
                enumerate(["hiking", "taxes", "cooking", "travel"] * 10)]
    stored = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert stored.status_code == 201, stored.text
    for query in ("where did I hike?", "when are taxes due?", "what did I cook?"):
        answer = client.post("/retrieve", json={
            "namespace": namespace, "query": query, "budget": 5, "k": 10, "candidates": 40,
        })
        assert answer.status_code == 200, answer.text


def test_a_populated_single_node_schema_is_distributed_in_place(
    citus_cluster: CitusCluster,
) -> None:
    """The schema created before Citus (16 partitions per table), with rows in every table,
    is distributed by `earm migrate` once the operator has made the database Citus's: the
    rows move to the workers, nothing is left on the coordinator, nothing is lost."""
    name = "earm_citus_upgrade"
    url = citus_cluster.plain_database(name)
    migrate.upgrade_to_head(url, DIM)
    settings = Settings(database_url=url, embedder="local", scorer="local", _env_file=None)
    with TestClient(create_app(settings)) as client:
        _populate(client, "agent-upgraded")
    counts_sql = ("SELECT (SELECT count(*) FROM memories), (SELECT count(*) FROM queries), "
                  "(SELECT count(*) FROM scores), (SELECT count(*) FROM memory_locator)")
    with psycopg.connect(libpq(url)) as conn:
        counts = conn.execute(counts_sql).fetchone()
    assert counts is not None and all(counts)

    citus_cluster.make_citus(name)
    migrate.upgrade_to_head(url, DIM)

    placement = _placement(url)
    assert {*citus.NAMESPACE_TABLES, "namespaces", *citus.LOCATOR_TABLES} <= set(placement)
    with psycopg.connect(libpq(url)) as conn:
        assert conn.execute(counts_sql).fetchone() == counts
    with TestClient(create_app(settings)) as client:
        again = client.post("/retrieve", json={
            "namespace": "agent-upgraded", "query": "where did I hike?", "budget": 5, "k": 10,
            "candidates": 40,
        })
        assert again.status_code == 200, again.text
