"""Every table of a namespace's data is hash-partitioned by the namespace, and keyed by it.

Until now ``memories.id`` and ``queries.id`` were primary keys alone and every foreign key
between the tables named ids only, which neither Postgres partitioning nor Citus can split: a
primary key, unique constraint or foreign key of a partitioned (distributed) table must include
the key it is split by. This revision makes the namespace (its name, the column every table
already had and every statement already filters on; docs/operations.md "Partitions" says why
not a numeric id) part of every key:

- ``memories``, ``queries``: primary key (namespace, id). Ids stay globally unique: one
  identity sequence per table, shared by its partitions, continuing where the old one stopped.
- ``scores`` (namespace, query_id, memory_id); ``score_history`` (namespace, id);
  ``memory_factors`` (namespace, memory_id); ``rerank_documents`` gains the column and is keyed
  (namespace, memory_id). Their foreign keys name (namespace, query_id) and (namespace,
  memory_id), so an observation can no longer point into another namespace.
- All six are ``PARTITION BY HASH (namespace)`` with :data:`MODULUS` partitions each
  (``memories_p00`` … ``memories_p15``): a namespace's rows of every table sit in partitions of
  the same remainder, and a statement that names the namespace reads one of them. Each
  ``memories`` partition has its own partial HNSW index (``WHERE indexed``, m = 16,
  ef_construction = 128 as before): a graph over its share of the namespaces.
- ``memory_locator`` and ``query_locator`` (id → namespace, unpartitioned): the routes that
  name an id and no namespace (``GET/PATCH/DELETE /memories/{id}``, ``GET /queries/{id}``) read
  the namespace there, by primary key, so that what follows reads one partition. Written in the
  statement that inserts the row, deleted with it.
- Indexes the new primary keys make redundant are not recreated: ``ix_memories_namespace_id``,
  ``ix_scores_namespace``, ``ix_score_history_namespace``, ``ix_memory_factors_namespace``;
  ``ix_scores_memory_id`` and ``ix_score_history_memory_id`` lead with the namespace now.

The data moves in one transaction that holds every one of these tables ACCESS EXCLUSIVE from
its first statement to its commit (nothing reads or writes them meanwhile; docs/changelog.md
has the duration measured at 100k memories): each old table is renamed, a partitioned one
created in its place with the same columns (``LIKE``), every row copied in the old table's
physical order (so a namespace's observations keep their order, which a refit sums them in),
the old table dropped, and the keys and indexes built on the loaded partitions. ``downgrade``
moves the rows back into the 0016 tables the same way.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import context, op

from service.db import citus

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Partitions per table. Fixed here: changing it means moving every row again.
MODULUS = 16


def _modulus() -> int:
    """:data:`MODULUS`, unless the caller asks for another count (``earm bench tenancy`` builds
    a one-partition baseline: every namespace under one HNSW graph, as before this revision),
    or the database is Citus's, whose shards split the namespaces already
    (``service.db.citus.PARTITIONS``)."""
    asked = context.config.attributes.get("partitions")
    if asked:
        return int(asked)
    return citus.PARTITIONS if citus.is_citus(op.get_bind()) else MODULUS

#: The tables that hold a namespace's data, parents before children (the copy order).
TABLES = (
    "memories", "queries", "scores", "score_history", "memory_factors", "rerank_documents"
)
#: Tables whose identity sequence must continue: ids are handed out once.
_IDENTITIES = ("memories", "queries", "score_history")
_OLD = "{}_0016"
_NEW = "{}_0017"

_HNSW = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128) WHERE indexed"
)

#: The keys and indexes of the partitioned tables (built after the copy, on full partitions).
PARTITIONED_KEYS = (
    "ALTER TABLE memories ADD CONSTRAINT pk_memories PRIMARY KEY (namespace, id)",
    "ALTER TABLE memories ADD CONSTRAINT uq_memories_namespace_external_id "
    "UNIQUE (namespace, external_id)",
    "ALTER TABLE memories ADD CONSTRAINT fk_memories_namespace_namespaces "
    "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE",
    _HNSW,
    "CREATE INDEX ix_memories_namespace_text_md5 ON memories (namespace, md5(text), id)",
    "CREATE INDEX ix_memories_unindexed ON memories (namespace, id) WHERE NOT indexed",
    "ALTER TABLE queries ADD CONSTRAINT pk_queries PRIMARY KEY (namespace, id)",
    "ALTER TABLE queries ADD CONSTRAINT uq_queries_namespace_query_index "
    "UNIQUE (namespace, query_index)",
    "ALTER TABLE queries ADD CONSTRAINT fk_queries_namespace_namespaces "
    "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE",
    "CREATE INDEX ix_queries_namespace_family_key ON queries (namespace, family_key) "
    "WHERE family_key IS NOT NULL",
    "ALTER TABLE scores ADD CONSTRAINT pk_scores PRIMARY KEY (namespace, query_id, memory_id)",
    "ALTER TABLE scores ADD CONSTRAINT fk_scores_query_id_queries FOREIGN KEY "
    "(namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE",
    "ALTER TABLE scores ADD CONSTRAINT fk_scores_memory_id_memories FOREIGN KEY "
    "(namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE",
    "CREATE INDEX ix_scores_namespace_memory_id ON scores (namespace, memory_id)",
    "ALTER TABLE score_history ADD CONSTRAINT pk_score_history PRIMARY KEY (namespace, id)",
    "ALTER TABLE score_history ADD CONSTRAINT fk_score_history_query_id_queries FOREIGN KEY "
    "(namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE",
    "ALTER TABLE score_history ADD CONSTRAINT fk_score_history_memory_id_memories FOREIGN KEY "
    "(namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE",
    "CREATE INDEX ix_score_history_namespace_query_id_memory_id "
    "ON score_history (namespace, query_id, memory_id)",
    "CREATE INDEX ix_score_history_namespace_memory_id ON score_history (namespace, memory_id)",
    "ALTER TABLE memory_factors ADD CONSTRAINT pk_memory_factors "
    "PRIMARY KEY (namespace, memory_id)",
    "ALTER TABLE memory_factors ADD CONSTRAINT fk_memory_factors_memory_id_memories "
    "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE",
    "ALTER TABLE rerank_documents ADD CONSTRAINT pk_rerank_documents "
    "PRIMARY KEY (namespace, memory_id)",
    "ALTER TABLE rerank_documents ADD CONSTRAINT fk_rerank_documents_memory_id_memories "
    "FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE",
    "CREATE INDEX ix_rerank_documents_last_seen_at ON rerank_documents (last_seen_at)",
)

#: The same, of the 0016 tables (migrations 0001-0016), for the downgrade.
PLAIN_KEYS = (
    "ALTER TABLE memories ADD CONSTRAINT pk_memories PRIMARY KEY (id)",
    "ALTER TABLE memories ADD CONSTRAINT uq_memories_namespace_external_id "
    "UNIQUE (namespace, external_id)",
    "ALTER TABLE memories ADD CONSTRAINT fk_memories_namespace_namespaces "
    "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE",
    _HNSW,
    "CREATE INDEX ix_memories_namespace_id ON memories (namespace, id)",
    "CREATE INDEX ix_memories_namespace_text_md5 ON memories (namespace, md5(text), id)",
    "CREATE INDEX ix_memories_unindexed ON memories (namespace, id) WHERE NOT indexed",
    "ALTER TABLE queries ADD CONSTRAINT pk_queries PRIMARY KEY (id)",
    "ALTER TABLE queries ADD CONSTRAINT uq_queries_namespace_query_index "
    "UNIQUE (namespace, query_index)",
    "ALTER TABLE queries ADD CONSTRAINT fk_queries_namespace_namespaces "
    "FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE",
    "CREATE INDEX ix_queries_namespace_family_key ON queries (namespace, family_key) "
    "WHERE family_key IS NOT NULL",
    "ALTER TABLE scores ADD CONSTRAINT pk_scores PRIMARY KEY (query_id, memory_id)",
    "ALTER TABLE scores ADD CONSTRAINT fk_scores_query_id_queries FOREIGN KEY (query_id) "
    "REFERENCES queries (id) ON DELETE CASCADE",
    "ALTER TABLE scores ADD CONSTRAINT fk_scores_memory_id_memories FOREIGN KEY (memory_id) "
    "REFERENCES memories (id) ON DELETE CASCADE",
    "CREATE INDEX ix_scores_memory_id ON scores (memory_id)",
    "CREATE INDEX ix_scores_namespace ON scores (namespace)",
    "ALTER TABLE score_history ADD CONSTRAINT pk_score_history PRIMARY KEY (id)",
    "ALTER TABLE score_history ADD CONSTRAINT fk_score_history_query_id_queries "
    "FOREIGN KEY (query_id) REFERENCES queries (id) ON DELETE CASCADE",
    "ALTER TABLE score_history ADD CONSTRAINT fk_score_history_memory_id_memories "
    "FOREIGN KEY (memory_id) REFERENCES memories (id) ON DELETE CASCADE",
    "CREATE INDEX ix_score_history_query_id_memory_id ON score_history (query_id, memory_id)",
    "CREATE INDEX ix_score_history_memory_id ON score_history (memory_id)",
    "CREATE INDEX ix_score_history_namespace ON score_history (namespace)",
    "ALTER TABLE memory_factors ADD CONSTRAINT pk_memory_factors PRIMARY KEY (memory_id)",
    "ALTER TABLE memory_factors ADD CONSTRAINT fk_memory_factors_memory_id_memories "
    "FOREIGN KEY (memory_id) REFERENCES memories (id) ON DELETE CASCADE",
    "CREATE INDEX ix_memory_factors_namespace ON memory_factors (namespace)",
    "ALTER TABLE rerank_documents ADD CONSTRAINT pk_rerank_documents PRIMARY KEY (memory_id)",
    "ALTER TABLE rerank_documents ADD CONSTRAINT fk_rerank_documents_memory_id_memories "
    "FOREIGN KEY (memory_id) REFERENCES memories (id) ON DELETE CASCADE",
    "CREATE INDEX ix_rerank_documents_last_seen_at ON rerank_documents (last_seen_at)",
)

_LOCATORS = {"memory_locator": "memories", "query_locator": "queries"}


def _lock_and_rename(suffix: str, drop_first: Sequence[str] = ()) -> None:
    """Take every table the move rewrites, in one statement (so in one order, and before any
    row is read: a writer that got in first is waited for, none gets in after), drop the
    tables of ``drop_first``, and rename the others, their identity sequences with them, out
    of the new tables' way."""
    op.execute(
        f"LOCK TABLE namespaces, {', '.join([*TABLES, *drop_first])} IN ACCESS EXCLUSIVE MODE"
    )
    for table in drop_first:
        op.execute(f"DROP TABLE {table}")
    # The copy reads each table from its first page: a synchronised scan could start where
    # another scan of it is, and a namespace's rows would be copied in another order.
    op.execute("SET LOCAL synchronize_seqscans = off")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RENAME TO {suffix.format(table)}")
    for table in _IDENTITIES:
        op.execute(
            f"ALTER SEQUENCE {table}_id_seq RENAME TO {suffix.format(table)}_id_seq"
        )


def _create_like(table: str, source: str, partitioned: bool) -> None:
    """``table`` with ``source``'s columns (types, defaults, NOT NULL, checks, identity with
    a sequence of its own, storage: ``queries.embedding`` stays MAIN, migration 0013);
    partitioned: hash-partitioned by the namespace into :data:`MODULUS` partitions."""
    like = (
        f"LIKE {source} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING STORAGE "
        "INCLUDING CONSTRAINTS"
    )
    if not partitioned:
        op.execute(f"CREATE TABLE {table} ({like})")
        return
    op.execute(f"CREATE TABLE {table} ({like}) PARTITION BY HASH (namespace)")
    _create_partitions(table)


def _create_partitions(table: str) -> None:
    modulus = _modulus()
    for remainder in range(modulus):
        op.execute(
            f"CREATE TABLE {table}_p{remainder:02d} PARTITION OF {table} "
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})"
        )


def _continue_identities(old: str) -> None:
    """Each new identity sequence continues from where the old one stopped (not from the
    largest id left: ids of deleted rows are not handed out again)."""
    for table in _IDENTITIES:
        op.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), last_value, is_called) "
            f"FROM {old.format(table)}_id_seq"
        )


def _drop(suffix: str) -> None:
    for table in reversed(TABLES):
        op.execute(f"DROP TABLE {suffix.format(table)}")


def upgrade() -> None:
    _lock_and_rename(_OLD)
    for table in TABLES:
        if table == "rerank_documents":
            op.execute(
                "CREATE TABLE rerank_documents (namespace text NOT NULL, "
                "LIKE rerank_documents_0016 INCLUDING DEFAULTS) PARTITION BY HASH (namespace)"
            )
            _create_partitions("rerank_documents")
            op.execute(
                "INSERT INTO rerank_documents (namespace, memory_id, last_seen_at) "
                "SELECT m.namespace, d.memory_id, d.last_seen_at FROM rerank_documents_0016 d "
                "JOIN memories_0016 m ON m.id = d.memory_id"
            )
            continue
        _create_like(table, _OLD.format(table), partitioned=True)
        op.execute(f"INSERT INTO {table} SELECT * FROM {_OLD.format(table)}")
    _continue_identities(_OLD)
    _drop(_OLD)
    for statement in PARTITIONED_KEYS:
        op.execute(statement)
    for locator, table in _LOCATORS.items():
        op.execute(
            f"CREATE TABLE {locator} (id bigint NOT NULL, namespace text NOT NULL, "
            f"CONSTRAINT pk_{locator} PRIMARY KEY (id))"
        )
        op.execute(f"INSERT INTO {locator} (id, namespace) SELECT id, namespace FROM {table}")
        # After the rows: one check of them all, not one per row inserted.
        op.execute(
            f"ALTER TABLE {locator} ADD CONSTRAINT fk_{locator}_namespace_{table} "
            f"FOREIGN KEY (namespace, id) REFERENCES {table} (namespace, id) ON DELETE CASCADE"
        )
    # Statistics for the planner at once, not at autovacuum's first pass over the partitions.
    op.execute(f"ANALYZE {', '.join(TABLES)}, {', '.join(_LOCATORS)}")


def downgrade() -> None:
    _lock_and_rename(_NEW, drop_first=tuple(_LOCATORS))
    for table in TABLES:
        if table == "rerank_documents":
            op.execute(
                # Named as 0016 named them (the old table still holds the default names).
                "CREATE TABLE rerank_documents ("
                "memory_id bigint CONSTRAINT rerank_documents_memory_id_not_null NOT NULL, "
                "last_seen_at timestamptz DEFAULT now() "
                "CONSTRAINT rerank_documents_last_seen_at_not_null NOT NULL)"
            )
            op.execute(
                "INSERT INTO rerank_documents (memory_id, last_seen_at) "
                "SELECT memory_id, last_seen_at FROM rerank_documents_0017"
            )
            continue
        _create_like(table, _NEW.format(table), partitioned=False)
        op.execute(f"INSERT INTO {table} SELECT * FROM {_NEW.format(table)}")
    _continue_identities(_NEW)
    _drop(_NEW)
    for statement in PLAIN_KEYS:
        op.execute(statement)
    op.execute(f"ANALYZE {', '.join(TABLES)}")
