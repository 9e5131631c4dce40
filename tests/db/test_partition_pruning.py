"""Every statement a hot-path request runs reads and writes one partition per table (migration
0017): the workload of :mod:`tests.hot_path` (every hot-path request on one namespace, then its
erasure), each statement's plan sent by auto_explain as the server ran it.

A partition counts as touched when a node of the plan ran on it (run-time pruning leaves the
others "never executed", plan-time and initial pruning leave them out). Inserts route rows
without a plan node per partition, so the test also reads the per-partition write counters of
the whole workload: every row inserted, updated or deleted is in the namespace's partitions.

Excluded, because they are background work across namespaces, not a request's: the indexer's
statements (``tests.hot_path.BACKGROUND``; finding the namespace with a backlog reads every
partition's small ``ix_memories_unindexed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from service.db.citus import NAMESPACE_TABLES
from service.testing.standby import libpq
from tests import hot_path
from tests.hot_path import NEIGHBOUR

_WRITES_SQL = (
    "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
    "WHERE relname ~ '_p[0-9]{2}$'"
)


@pytest.fixture(scope="module")
def explained_url(migrated_database: Callable[[str], str]) -> str:
    name = "earm_test_pruning"
    url = migrated_database(name)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        hot_path.set_for_every_session(conn, name, hot_path.AUTO_EXPLAIN)
    return url


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


def _writes(url: str) -> dict[str, int]:
    """Rows inserted, updated and deleted so far, by partition (once the backends that wrote
    them have reported: they report when they close)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        return {name: int(count) for name, count in conn.execute(_WRITES_SQL)}


def _partition_of(url: str, namespace: str) -> str:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT tableoid::regclass::text FROM memories WHERE namespace = %s LIMIT 1",
            (namespace,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_every_hot_path_statement_touches_one_partition_of_each_table(
    explained_url: str, partition_parents: dict[str, str],
) -> None:
    collected = hot_path.Plans()
    with hot_path.workload(explained_url) as workload:
        workload.prepare()
        before = hot_path.settled(lambda: _writes(explained_url))
        workload.run(collected)
    plans = collected.plans
    written = {
        name for name, count in hot_path.settled(lambda: _writes(explained_url)).items()
        if count != before.get(name, 0)
    }
    elsewhere = {name[-3:] for name, count in before.items() if count}
    parents = {child: parent for child, parent in partition_parents.items()
               if parent in NAMESPACE_TABLES}

    checked = [p for p in plans if not hot_path.is_background(p["Query Text"])]
    touched = {p["Query Text"]: _touched(p["Plan"], parents) for p in checked}
    # The namespace's partitions: where its rows were written (inserts name no partition).
    remainders = {name[-3:] for name in written}
    assert len(remainders) == 1, f"the workload wrote to {sorted(written)}"
    (remainder,) = remainders
    assert elsewhere - {remainder}, "a namespace in another partition was passed by"
    assert _partition_of(explained_url, NEIGHBOUR).endswith(remainder), (
        "the HNSW search's namespace is this partition's"
    )
    for text, found in touched.items():
        tables = [table for table, _ in found]
        assert len(tables) == len(set(tables)) and all(
            partition.endswith(remainder) for _, partition in found
        ), f"{sorted(found)} touched by:\n{text}"
    hot_path.assert_covered([hot_path.shape(text) for text in touched])
    graphs = [
        node for plan in checked for node in _nodes(plan["Plan"])
        if partition_parents.get(node.get("Index Name", "")) == "ix_memories_embedding_hnsw"
        and node.get("Actual Loops", 0) > 0
    ]
    assert graphs, "no search went through the partition's HNSW index"
