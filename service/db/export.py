"""A namespace's rows for ``earm namespace export`` and ``earm namespace import``: read as JSON
objects in one snapshot, written back in batches under new ids (the file format and the id
mapping are ``service.namespace_file``'s).

What travels, table by table (every table that holds a namespace's data, migrations 0001-0015):

- ``namespaces``: the namespace's row, i.e. its counters (query index, the running mean's sum
  and count, scorer calls and requests, reuse counters, queries since the last refit), its last
  refit time and content prior (γ and w). Without them the imported namespace would rank by
  another mean and prior, restart the budget schedule and refit at another time.
- ``memories``: text, external id, embedding and its model, metadata, ``occurred_at``, creation
  and last content change (an edit retires observations older than it).
- ``queries``: every column: text, embedding and family key (what later retrieves reuse and
  take paraphrase evidence from), the query's model parameters (its ``query_factors`` row, in
  the query's record), its quality counters and its
  trace (``GET /queries/{id}``, the dashboard).
- ``scores``: the observations, retired ones included, with their anchor kinds (the anchor rule
  learns its exploring share from them) and feedback (``source = 'feedback'``).
- ``score_history``: the values feedback replaced.
- ``memory_factors``: the memory side of the learned model, with its sufficient statistics.

Deliberately not exported: ``api_keys`` and ``auth_settings``, which belong to the deployment,
not to a namespace (a key's patterns may cover many namespaces, and a secret's hash should not
travel with a tenant's data); ``alembic_version``, the deployment's schema (the file records
the revision it was written at). ``memories.indexed`` is not exported either: imported memories
arrive unindexed, as ingested ones do, and the background indexer puts them in the HNSW index
(until then the search finds them by an exact scan, so they are found at once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import driver_connection
from service.db.statements import execute, fetch_all, fetch_value


@dataclass(frozen=True)
class RecordKind:
    """One kind of record of the file: the table it comes from, its columns as the file names
    them (every column but the namespace and, for ``score_history``, its id, which nothing
    references), and the order rows are read in (ids ascending, and import gives new ids in
    the same order, so whatever depends on id order stays the same; observations by their
    (query id, memory id) key, which the new ids keep, for the same reason)."""

    name: str
    table: str
    columns: tuple[str, ...]
    order_by: str
    # The column that names the namespace (``namespaces`` is keyed by its name).
    namespace_column: str = "namespace"
    # Columns a file from an earlier schema lacks (import writes NULL, their meaning there).
    optional: tuple[str, ...] = ()
    # What the export reads, when not ``table`` alone.
    source: str = ""

    @property
    def fields(self) -> frozenset[str]:
        """The keys of one record of this kind in the file."""
        return frozenset(self.columns) | {"kind"}

    @property
    def required(self) -> frozenset[str]:
        """The keys every record of this kind has, whichever schema exported it."""
        return self.fields - set(self.optional)


NAMESPACE = RecordKind(
    "namespace", "namespaces",
    ("created_at", "next_query_index", "score_sum", "score_count", "scorer_calls",
     "scorer_requests", "full_rerank_calls", "reused_cells", "reuse_saved_calls",
     "queries_since_refit", "last_refit_at", "content_slope", "content_weights", "factor_reg",
     "score_scales"),
    "name", namespace_column="name", optional=("factor_reg", "score_scales"),
)
MEMORY = RecordKind(
    "memory", "memories",
    ("id", "external_id", "text", "embedding", "embedding_model", "occurred_at", "created_at",
     "metadata", "content_changed_at"),
    "id",
)
QUERY = RecordKind(
    "query", "queries",
    ("id", "query_index", "text", "embedding", "policy", "candidates", "budget", "scorer_calls",
     "created_at", "bias", "slope", "factors", "prequential_abs_error", "prequential_count",
     "returned_count", "returned_estimated", "family_key", "reused_memory_ids", "stage",
     "timings", "trace_memory_ids", "trace_similarities", "trace_estimates", "trace_scores",
     "trace_sources", "trace_origins", "trace_anchors", "trace_anchor_reasons",
     "exploration_share", "scorer_rounds"),
    "id", optional=("scorer_rounds",),
    # The parameters are a row of their own since migration 0022; the file keeps them here.
    source="(SELECT q.*, f.bias, f.slope, f.factors FROM queries q LEFT JOIN query_factors f "
    "ON f.namespace = q.namespace AND f.query_id = q.id) AS queries",
)
#: The query columns import writes to ``query_factors`` (a query without them has no row).
_QUERY_PARAMETERS = ("bias", "slope", "factors")
OBSERVATION = RecordKind(
    "observation", "scores",
    ("query_id", "memory_id", "score", "similarity", "source", "anchor_kind", "created_at",
     "retired_at", "scored_by", "raw_score"),
    # The order a refit reads them in (experience.namespace_observations).
    "query_id, memory_id", optional=("scored_by", "raw_score"),
)
REPLACED_OBSERVATION = RecordKind(
    "replaced_observation", "score_history",
    ("query_id", "memory_id", "score", "source", "observed_at", "retired_at", "replaced_at",
     "scored_by", "raw_score"),
    "id", optional=("scored_by", "raw_score"),
)
MODEL_ROW = RecordKind(
    "model_row", "memory_factors",
    ("memory_id", "bias", "factors", "observation_count", "statistics"),
    "memory_id",
)
#: Every kind, in the order the file holds them: each refers only to kinds before it.
RECORD_KINDS = (NAMESPACE, MEMORY, QUERY, OBSERVATION, REPLACED_OBSERVATION, MODEL_ROW)


def _select_sql(kind: RecordKind) -> str:
    """One JSON object per row, built by Postgres: numbers in their shortest exact form (a
    ``real`` reads back as the same float32, a ``float8`` as the same float64), vectors and
    ``bytea`` as their text forms, which the import's casts read back as they were.

    A refit and the feedback re-solve read observations in key order and sum them in that
    order (which decides the last bit of the model); the import's new ids keep the order of
    the old ones, so the import refits to the same bits.
    """
    pairs = ", ".join(f"'{column}', {column}" for column in kind.columns)
    return (
        f"SELECT json_build_object('kind', '{kind.name}', {pairs})::text "
        f"FROM {kind.source or kind.table} "
        f"WHERE {kind.namespace_column} = %(namespace)s ORDER BY {kind.order_by}"
    )


async def begin_snapshot(session: AsyncSession) -> None:
    """Make the session's transaction a read-only snapshot, so an export taken while the
    namespace serves is one consistent state (no observation without its query). Call first."""
    await session.connection(
        execution_options={"isolation_level": "REPEATABLE READ", "postgresql_readonly": True}
    )


async def namespace_exists(session: AsyncSession, namespace: str) -> bool:
    found = await fetch_value(
        session, "SELECT 1 FROM namespaces WHERE name = %(namespace)s", {"namespace": namespace}
    )
    return found is not None


async def stream_records(session: AsyncSession, namespace: str) -> AsyncIterator[tuple[str, str]]:
    """Every record of the namespace as (kind, JSON text), kind by kind in file order, streamed
    row by row from the server (never the whole namespace in memory)."""
    conn = await driver_connection(session)
    for kind in RECORD_KINDS:
        cursor = conn.cursor()
        async for (record,) in cursor.stream(_select_sql(kind), {"namespace": namespace}):
            yield kind.name, record


#: The table that says which namespace holds each id of a kind (migration 0017).
_LOCATORS = {"memory": "memory_locator", "query": "query_locator"}


def _insert_sql(kind: RecordKind) -> str:
    """Insert a batch of records (a JSON array of objects, each cast to the table's column
    types by ``json_populate_recordset``) into the namespace ``%(namespace)s``; memories and
    queries with their locator rows, in the same statement."""
    own = [c for c in kind.columns if kind is not QUERY or c not in _QUERY_PARAMETERS]
    columns = [*own, kind.namespace_column]
    values = [*own, "%(namespace)s"]
    if kind is MEMORY:
        columns.append("indexed")
        values.append("false")
    insert = (
        f"INSERT INTO {kind.table} ({', '.join(columns)}) SELECT {', '.join(values)} "
        f"FROM json_populate_recordset(NULL::{kind.table}, %(records)s::json)"
        # A namespace created since the import checked it is not overwritten (none inserted).
        + (" ON CONFLICT DO NOTHING" if kind is NAMESPACE else "")
    )
    locator = _LOCATORS.get(kind.name)
    if locator is None:
        return insert
    solved = (
        "), solved AS (INSERT INTO query_factors (namespace, query_id, bias, slope, factors) "
        "SELECT %(namespace)s, id, bias, slope, factors FROM json_to_recordset(%(records)s::json)"
        " AS r(id bigint, bias float8, slope float8, factors real[]) WHERE bias IS NOT NULL"
        if kind is QUERY else ""
    )
    return (
        f"WITH inserted AS ({insert} RETURNING id), located AS ("
        f"INSERT INTO {locator} (id, namespace) SELECT id, %(namespace)s FROM inserted"
        f"{solved}) SELECT count(*) FROM inserted"
    )


_INSERT_SQL = {kind.name: _insert_sql(kind) for kind in RECORD_KINDS}


async def insert_records(
    session: AsyncSession, kind: RecordKind, namespace: str, records_json: str
) -> int:
    """Insert ``records_json`` (a JSON array of records of ``kind``, ids already the new ones)
    into ``namespace``; how many rows were inserted."""
    parameters = {"namespace": namespace, "records": records_json}
    if kind.name in _LOCATORS:
        return int(await fetch_value(session, _INSERT_SQL[kind.name], parameters))
    return await execute(session, _INSERT_SQL[kind.name], parameters)


_ALLOCATE_IDS_SQL = (
    "SELECT nextval(pg_get_serial_sequence(%(table)s, 'id')) FROM generate_series(1, %(n)s)"
)


async def allocate_ids(session: AsyncSession, table: str, count: int) -> list[int]:
    """``count`` new ids of ``table`` (``memories`` or ``queries``), ascending: ids no other
    row has or will get, so the imported rows keep globally unique ids."""
    if count == 0:
        return []
    rows: Sequence[tuple[Any, ...]] = await fetch_all(
        session, _ALLOCATE_IDS_SQL, {"table": table, "n": count}
    )
    return sorted(int(row[0]) for row in rows)
