"""earm's schema on Citus: where each table goes, and the step of ``earm migrate`` that puts it
there. docs/sharding.md says why each table goes where it does and what was measured.

A database counts as Citus when it has the ``citus`` extension (created by the operator with
the workers registered, as Citus's own set-up does). On such a database the migrations create
the schema on the coordinator as on any Postgres, with one partition per table
(:data:`PARTITIONS`) unless the schema was created before Citus was there, and then
:func:`distribute` distributes it:

- every table of a namespace's data by its namespace, co-located with ``namespaces`` (by its
  name): one namespace's rows of every table sit in one shard group, on one worker, and a
  statement that names the namespace runs there alone;
- the locators (id → namespace) by id, co-located with each other: a by-id route reads one
  shard of them. Their foreign keys to the rows cross distribution columns, which Citus
  refuses, so they are dropped: earm deletes a locator row in the statement that deletes its
  row, and an erased namespace's locators with it (``service.db.namespaces``);
- keys and the deployment's settings as reference tables (a copy on every node);
- ``alembic_version`` stays on the coordinator.

Foreign keys between the namespace tables are dropped while they move and added back after:
Citus checks a key between distributed tables only once both are distributed and co-located.
Every step is skipped when done, so running it again changes nothing.

The search's settings are ``SET LOCAL`` (``service.db.candidate_sql.search_settings``); the
coordinator passes them to the workers with ``citus.propagate_set_commands = 'local'``, set
here on the database.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

log = logging.getLogger(__name__)

#: Partitions per table of a schema created on Citus: the shards split the namespaces already,
#: and every hash partition of a distributed table is a distributed table of its own (32
#: shards of 16 partitions would be 512 HNSW graphs per table).
PARTITIONS = 1

REFERENCE_TABLES = ("api_keys", "auth_settings")
#: The tables of a namespace's data, each distributed by ``namespace`` beside ``namespaces``.
NAMESPACE_TABLES = (
    "memories", "queries", "scores", "score_history", "memory_factors", "query_factors",
    "rerank_documents",
)
LOCATOR_TABLES = ("memory_locator", "query_locator")
#: The locators' keys to their rows, dropped for good (see the module docstring).
LOCATOR_KEYS = (
    ("memory_locator", "fk_memory_locator_namespace_memories"),
    ("query_locator", "fk_query_locator_namespace_queries"),
)
#: Foreign keys between the namespace tables: dropped while they move, then added back.
NAMESPACE_KEYS = (
    ("memories", "fk_memories_namespace_namespaces",
     "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE"),
    ("queries", "fk_queries_namespace_namespaces",
     "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE"),
    ("scores", "fk_scores_query_id_queries",
     "FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE"),
    ("scores", "fk_scores_memory_id_memories",
     "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE"),
    ("score_history", "fk_score_history_query_id_queries",
     "FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE"),
    ("score_history", "fk_score_history_memory_id_memories",
     "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE"),
    ("memory_factors", "fk_memory_factors_memory_id_memories",
     "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE"),
    ("query_factors", "fk_query_factors_query_id_queries",
     "FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE"),
    ("rerank_documents", "fk_rerank_documents_memory_id_memories",
     "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE"),
)


def is_citus(connection: Connection) -> bool:
    """Whether the database has the citus extension."""
    return bool(connection.scalar(text("SELECT EXISTS (SELECT FROM pg_extension "
                                       "WHERE extname = 'citus')")))


def distribute(connection: Connection) -> list[str]:
    """Distribute the schema (at head) of the Citus database of ``connection``, which must be
    in autocommit mode (Citus moves existing rows in transactions of its own); returns the
    tables it distributed now (none when they all were)."""
    placed = _placed(connection)
    moved = [table for table in (*REFERENCE_TABLES, "namespaces", *NAMESPACE_TABLES,
                                 *LOCATOR_TABLES) if table not in placed]
    if moved:
        _move(connection, placed)
    database = connection.scalar(text("SELECT current_database()"))
    connection.execute(text(
        f'ALTER DATABASE "{database}" SET citus.propagate_set_commands = \'local\''
    ))
    if moved:
        log.info("distributed earm's tables on Citus", extra={"tables": moved})
    return moved


def _placed(connection: Connection) -> set[str]:
    rows = connection.execute(text(
        "SELECT logicalrelid::regclass::text FROM pg_dist_partition"
    )).scalars()
    return {str(name) for name in rows}


def _move(connection: Connection, placed: set[str]) -> None:
    for table, key in LOCATOR_KEYS:
        connection.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {key}"))
    if "namespaces" not in placed:
        for table, key, _ in NAMESPACE_KEYS:
            connection.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {key}"))
    moves = [
        *((table, f"SELECT create_reference_table('{table}')") for table in REFERENCE_TABLES),
        ("namespaces", "SELECT create_distributed_table('namespaces', 'name')"),
        *((table, f"SELECT create_distributed_table('{table}', 'namespace', "
                  "colocate_with => 'namespaces')") for table in NAMESPACE_TABLES),
        ("memory_locator", "SELECT create_distributed_table('memory_locator', 'id')"),
        ("query_locator", "SELECT create_distributed_table('query_locator', 'id', "
                          "colocate_with => 'memory_locator')"),
    ]
    for table, statement in moves:
        if table in placed:
            continue
        connection.execute(text(statement))
        # The rows were copied to the shards; the coordinator's own copy is left behind.
        connection.execute(text(
            f"SELECT truncate_local_data_after_distributing_table('{table}')"
        ))
    if "namespaces" not in placed:
        for table, key, definition in NAMESPACE_KEYS:
            connection.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT {key} {definition}"))
