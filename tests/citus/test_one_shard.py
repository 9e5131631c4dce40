"""On Citus, every statement a hot-path request runs is one task on the shard of its namespace
(or of the id a locator is distributed by), or a documented exception: a statement Citus runs
in steps (a CTE or subquery planned on its own), each step one such task, or one that writes
locators of several ids, one task per shard of those ids. The workload is
:mod:`tests.hot_path`'s, on the coordinator of a Citus database at 4 shards on 2 workers.

What is observed is what the coordinator sends the workers: the database has Citus report
every command it sends (``citus.log_remote_commands``) and the server every statement it runs
(``log_statement``), both as messages to the client, which a handler on every pooled
connection attributes to the statement running on it. A command that names shards is a task.
auto_explain, which the single-node test reads, cannot be used on Citus: with ``log_analyze``
the coordinator refuses an ``INSERT … SELECT`` it pulls through itself ("EXPLAIN ANALYZE is
currently not supported for INSERT ... SELECT commands via coordinator": the ingest fails);
without it, explaining a distributed plan fetches every task's plan from its worker at the
statement's end, in the statement's transaction, which aborts that transaction when a remote
EXPLAIN fails (a task reading intermediate results already gone) and fails parameterised
statements ("could not create distributed plan").

The writes are read from the workers' per-shard write counters: every row of a namespace
table inserted, updated or deleted by the workload is in the namespace's shard group, on its
worker. Excluded, as on a single node: the indexer's statements (``tests.hot_path.BACKGROUND``;
finding the namespace with a backlog runs one task per shard).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg.errors import Diagnostic

from service.testing.citus import CitusCluster
from tests import hot_path
from tests.hot_path import NAMESPACE, NEIGHBOUR, OTHER

#: Settings of the coordinator's database only (not propagated to the workers): every
#: statement and every command sent to a worker, reported to the client.
REPORTED = {
    "log_statement": "all",
    "client_min_messages": "log",
    "log_parameter_max_length": "0",
    "citus.log_remote_commands": "on",
}
#: Statements of more than one task, each task one shard, by a marker of their text; what
#: they cost at the tests' 4 shards on 2 workers (docs/sharding.md has it). A step's result
#: (a data-modifying CTE's rows) goes back to the coordinator and out again, to every worker,
#: as an intermediate result; a worker that receives one joins the transaction, whose commit
#: is then two-phase on both workers.
SEVERAL_TASKS = {
    # The rows pulled through the coordinator (INSERT … SELECT from unnest) into the
    # namespace's shard, then their locators: one task per shard their ids hash to (up to
    # every shard), the ids an intermediate result.
    "ingest": "INSERT INTO memory_locator (id, namespace) SELECT id",
    # Steps of the namespace's shard (4 to 6) and the new query's locator on its id's shard.
    "record": "INSERT INTO query_locator",
    "late record": "clock_timestamp() FROM q, t",  # 4 steps
    "online update": "WITH same_model AS (",  # 2 steps
    "feedback": "), old AS ( SELECT s.memory_id, s.score",  # 3 steps, then 1 more statement
    # The memory, then its locator on the shard of its id.
    "delete": "DELETE FROM memory_locator WHERE id = ANY(",
    # The erasure's locators: the erased ids are known only once erased, so every shard.
    "erase": "DELETE FROM memory_locator WHERE id IN (SELECT id FROM erased)",
    "erase queries": "DELETE FROM query_locator WHERE id IN (SELECT id FROM erased)",
}
_STATEMENT = re.compile(r"(?:statement|execute [^:]*): (?P<text>.*)", re.DOTALL)
_PORT = re.compile(r":(\d+) connectionId")
_SHARD_NAME = re.compile(r"\b\w+_\d{6,}\b")
_SHARDS_SQL = """
    SELECT s.shard_name, s.table_name::text, s.colocation_id, d.shardminvalue, s.nodeport
    FROM citus_shards s JOIN pg_dist_shard d USING (shardid)
"""


@dataclass
class Statement:
    text: str
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command, worker port)


@dataclass
class Commands:
    """The statements the coordinator runs while :attr:`recording`, each with the commands
    Citus sends the workers for it."""

    recording: bool = False
    statements: list[Statement] = field(default_factory=list)

    def connected(self, dbapi_connection: Any, connection_record: Any) -> None:
        running: list[Statement] = []  # the connection's statement, once it has run one
        hot_path.driver_connection(dbapi_connection).add_notice_handler(
            lambda diagnostic: self._notice(diagnostic, running)
        )

    def _notice(self, diagnostic: Diagnostic, running: list[Statement]) -> None:
        message = diagnostic.message_primary or ""
        if diagnostic.severity_nonlocalized == "LOG" and (found := _STATEMENT.match(message)):
            running[:] = [Statement(found["text"])]
            if self.recording:
                self.statements.append(running[0])
        elif message.startswith("issuing ") and running:
            port = _PORT.search(diagnostic.message_detail or "")
            assert port is not None, diagnostic.message_detail
            running[0].commands.append((message.removeprefix("issuing "), int(port[1])))


@dataclass(frozen=True)
class Shard:
    table: str
    group: tuple[int, str]  # (colocation id, hash range): the shards of one namespace or id
    port: int


@pytest.fixture(scope="module")
def reported_url(citus_database: Callable[[str], str], citus_cluster: CitusCluster) -> str:
    name = "earm_citus_one_shard"
    url = citus_database(name)
    with psycopg.connect(citus_cluster.coordinator.libpq(name), autocommit=True) as conn:
        conn.execute("SET citus.enable_ddl_propagation = off")  # the coordinator's sessions
        hot_path.set_for_every_session(conn, name, REPORTED)
    return url


def _shards(cluster: CitusCluster, database: str) -> dict[str, Shard]:
    with psycopg.connect(cluster.coordinator.libpq(database)) as conn:
        return {
            name: Shard(table, (colocation, str(low)), port)
            for name, table, colocation, low, port in conn.execute(_SHARDS_SQL)
        }


def _group_of(cluster: CitusCluster, database: str, namespace: str) -> tuple[int, str]:
    with psycopg.connect(cluster.coordinator.libpq(database)) as conn:
        row = conn.execute(
            "SELECT s.colocation_id, d.shardminvalue FROM citus_shards s "
            "JOIN pg_dist_shard d USING (shardid) WHERE s.shardid = "
            "get_shard_id_for_distribution_column('namespaces', %s::text)", (namespace,)
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _writes(cluster: CitusCluster, database: str) -> dict[str, int]:
    """Rows inserted, updated and deleted so far, by shard, over the workers."""
    counts: dict[str, int] = {}
    for worker in cluster.workers:
        with psycopg.connect(worker.libpq(database), autocommit=True) as conn:
            conn.execute("SET citus.override_table_visibility = off")  # shards are hidden
            counts |= {str(name): int(count) for name, count in conn.execute(
                "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables"
            )}
    return counts


def _tasks(statement: Statement, shards: dict[str, Shard]) -> list[set[Shard]]:
    """The shards each task of the statement named (a command naming none is not a task:
    transaction control, settings, intermediate results)."""
    tasks = [{shards[name] for name in _SHARD_NAME.findall(command) if name in shards}
             for command, _ in statement.commands]
    return [task for task in tasks if task]


def _documented(
    statements: list[Statement], shards: dict[str, Shard], group: tuple[int, str]
) -> set[str]:
    """Asserts every task of ``statements`` is on one shard, the namespace's if it is of a
    namespace table, and every statement of several tasks is of :data:`SEVERAL_TASKS`;
    returns which of those ran."""
    several: set[str] = set()
    undocumented: list[str] = []
    for statement in statements:
        tasks = _tasks(statement, shards)
        for task in tasks:
            assert len({shard.group for shard in task}) == 1, (
                f"a task of several shards: {task}\n{statement.text}"
            )
            assert all(s.group == group for s in task if s.group[0] == group[0]), (
                f"a task off the namespace's shard: {task}\n{statement.text}"
            )
        if len(tasks) > 1:
            text = hot_path.shape(statement.text)
            named = {name for name, marker in SEVERAL_TASKS.items()
                     if hot_path.shape(marker) in text}
            several |= named
            if not named:
                undocumented.append(f"{len(tasks)} tasks: {text}")
    assert not undocumented, "\n".join(undocumented)
    return several


def test_every_hot_path_statement_is_one_task_on_its_namespace_shard(
    reported_url: str, citus_cluster: CitusCluster,
) -> None:
    database = reported_url.rsplit("/", 1)[1]
    collected = Commands()
    with hot_path.workload(reported_url) as workload:
        workload.prepare()
        before = hot_path.settled(lambda: _writes(citus_cluster, database))
        workload.run(collected)
    after = hot_path.settled(lambda: _writes(citus_cluster, database))
    shards = _shards(citus_cluster, database)
    group = _group_of(citus_cluster, database, NAMESPACE)
    worker = {shard.port for shard in shards.values() if shard.group == group}
    assert _group_of(citus_cluster, database, NEIGHBOUR) == group, "the neighbour shares it"
    elsewhere = _group_of(citus_cluster, database, OTHER)
    assert {s.port for s in shards.values() if s.group == elsewhere}.isdisjoint(worker), (
        "a namespace on the other worker was passed by"
    )

    checked = [s for s in collected.statements
               if _tasks(s, shards) and not hot_path.is_background(s.text)]
    several = _documented(checked, shards, group)
    assert several == set(SEVERAL_TASKS), f"not seen: {set(SEVERAL_TASKS) - several}"
    hot_path.assert_covered([hot_path.shape(s.text) for s in checked])

    # Every row of a namespace table the workload wrote: in the namespace's shard group.
    written = {shards[name] for name, count in after.items()
               if name in shards and count != before.get(name, 0)}
    namespace_tables = {s for s in written if s.group[0] == group[0]}
    assert namespace_tables and {s.group for s in namespace_tables} == {group}, (
        f"the workload wrote to {sorted(map(str, namespace_tables))}"
    )
    assert {s.port for s in namespace_tables} == worker, "on the namespace's worker"
