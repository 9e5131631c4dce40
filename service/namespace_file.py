"""The namespace file of ``earm namespace export`` and ``earm namespace import``: one
namespace's memories, queries, observations, feedback and learned model, so a tenant can move
between deployments, be backed up, or be handed to its owner.

JSON Lines, UTF-8, streamed in both directions (one record per line; nothing holds the whole
namespace in memory but the maps from old to new ids):

1. a header: ``{"format": "earm-namespace", "version": 1, "namespace", "embedding_model",
   "embedding_dim", "schema_revision", "exported_at"}``: the embedding model id and dimension
   of the exporting deployment (vectors of another model live in another space), and the
   schema revision the rows were read at;
2. the records, one per line, each ``{"kind": ..., <its table's columns>}``, kinds in this
   order: ``namespace`` (one), ``memory``, ``query``, ``observation``, ``replaced_observation``,
   ``model_row`` (the tables and why each travels: ``service.db.export``);
3. a trailer, ``{"kind": "end", "records": {<kind>: <count>}}``: a file without it, or whose
   counts differ, is truncated.

Memory and query ids are the exporting deployment's; import allocates new ones (in the same
order) and rewrites every reference: observations, replaced observations and model rows by
memory and query, a query's reused and traced memory ids. A traced memory deleted before the
export gets a new id no memory has, so its trace still shows it as deleted.

Import checks each record before it is written (``service.namespace_validation``: every field
by the live API's rules and the model's invariants), and is one transaction: a refused or
broken file leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from service.checks import namespace_name
from service.db import export
from service.db.export import RECORD_KINDS, RecordKind
from service.errors import ConfigurationError, EarmError, NotFound
from service.namespace_validation import RecordChecker, RecordLimits, nesting

FORMAT = "earm-namespace"
VERSION = 1
END = "end"
#: Records inserted per statement.
BATCH_SIZE = 500
_KINDS = {kind.name: kind for kind in RECORD_KINDS}


class ImportRefused(ConfigurationError):
    """The file cannot be imported into this deployment (another embedding model or dimension,
    an existing namespace, a malformed or truncated file); nothing was written."""


@dataclass(frozen=True)
class Deployment:
    """What vectors the deployment stores (its embedder's model id and the dimension), and
    the limits on what it stores (an import's records are held to them)."""

    embedding_model: str
    embedding_dim: int
    limits: RecordLimits
    schema_revision: str | None = None


@dataclass
class Counts:
    """Records per kind (the trailer's, or what an import wrote)."""

    records: dict[str, int] = field(default_factory=lambda: {k.name: 0 for k in RECORD_KINDS})

    def describe(self) -> str:
        return ", ".join(f"{kind} {n}" for kind, n in self.records.items())


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


async def export_namespace(
    session: AsyncSession, namespace: str, deployment: Deployment, out: TextIO
) -> Counts:
    """Write the namespace's file to ``out``, from one snapshot; NotFound (nothing written) for
    a namespace that does not exist."""
    await export.begin_snapshot(session)
    if not await export.namespace_exists(session, namespace):
        raise NotFound(f"namespace {namespace!r} does not exist")
    out.write(_line({
        "format": FORMAT, "version": VERSION, "namespace": namespace,
        "embedding_model": deployment.embedding_model, "embedding_dim": deployment.embedding_dim,
        "schema_revision": deployment.schema_revision,
        "exported_at": datetime.now(UTC).isoformat(),
    }))
    counts = Counts()
    async for kind, record in export.stream_records(session, namespace):
        out.write(record + "\n")
        counts.records[kind] += 1
    out.write(_line({"kind": END, "records": counts.records}))
    return counts


@dataclass(frozen=True)
class Imported:
    namespace: str
    counts: Counts


async def import_namespace(
    session: AsyncSession, lines: Iterable[str], deployment: Deployment, as_name: str | None
) -> Imported:
    """Write the file's namespace (named ``as_name`` if given) in the session's transaction,
    which the caller commits; ImportRefused, having written nothing the caller commits, for a
    file this deployment cannot take."""
    reader = _Reader(iter(lines), deployment.limits)
    header = _check_header(reader.header(), deployment)
    namespace = _target_name(as_name or header["namespace"])
    if await export.namespace_exists(session, namespace):
        raise _exists(namespace)
    writer = _Writer(session, namespace, RecordChecker(deployment.limits))
    try:
        trailer = await writer.write_all(reader.records())
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0]
        raise ImportRefused(f"malformed file near line {reader.number}: {detail}") from None
    if writer.counts.records[export.NAMESPACE.name] != 1:
        raise ImportRefused("the file holds no namespace record")
    if trailer != writer.counts.records:
        raise ImportRefused(
            f"the file's trailer counts {trailer}, but it holds {writer.counts.records}"
        )
    return Imported(namespace, writer.counts)


def _exists(namespace: str) -> ImportRefused:
    return ImportRefused(
        f"namespace {namespace!r} already exists here: erase it first "
        f"(DELETE /namespaces/{namespace}) or import with --as NEWNAME"
    )


def _target_name(name: Any) -> str:
    try:
        return namespace_name(name if isinstance(name, str) else "")
    except ValueError as exc:
        raise ImportRefused(str(exc)) from None


def _check_header(header: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
    if header.get("format") != FORMAT:
        raise ImportRefused(f"not an earm namespace file (its first line has no format {FORMAT!r})")
    if header.get("version") != VERSION:
        raise ImportRefused(
            f"the file is in format version {header.get('version')!r}; this earm reads "
            f"version {VERSION}"
        )
    if header.get("embedding_dim") != deployment.embedding_dim:
        raise ImportRefused(
            f"the file holds {header.get('embedding_dim')}-dimensional embeddings, this "
            f"deployment stores {deployment.embedding_dim}-dimensional ones (EARM_EMBEDDING_DIM)"
        )
    if header.get("embedding_model") != deployment.embedding_model:
        raise ImportRefused(
            f"the file's embeddings are from model {header.get('embedding_model')!r}, this "
            f"deployment embeds with {deployment.embedding_model!r} (EARM_EMBEDDER, "
            "EARM_EMBEDDER_MODEL): their similarities would not compare"
        )
    return header


def _malformed(number: int, kind: str | None, problem: str) -> ImportRefused:
    """The refusal of the record on line ``number`` (of ``kind``, if known)."""
    record = f", {'an' if kind[:1] in 'aeiou' else 'a'} {kind} record" if kind else ""
    return ImportRefused(f"malformed file at line {number}{record}: {problem}")


class _Reader:
    """The file's lines parsed one at a time, with the number of the last one read."""

    def __init__(self, lines: Iterator[str], limits: RecordLimits) -> None:
        self._lines = lines
        self._max_depth = limits.max_metadata_depth
        self.number = 0

    def _next(self) -> dict[str, Any] | None:
        line = next(self._lines, None)
        if line is None:
            return None
        self.number += 1
        try:
            record = json.loads(line)
        except ValueError:
            raise ImportRefused(f"line {self.number} is not JSON (a truncated file?)") from None
        except RecursionError:  # nested deeper than the parser goes, far beyond any limit
            deepest = nesting(line)
            raise _malformed(
                self.number, deepest.kind, f"{deepest.field or 'the line'} is nested "
                f"{deepest.depth} levels deep; the limit is {self._max_depth}",
            ) from None
        if not isinstance(record, dict):
            raise ImportRefused(f"line {self.number} is not a JSON object")
        return record

    def header(self) -> dict[str, Any]:
        header = self._next()
        if header is None:
            raise ImportRefused("the file is empty")
        return header

    def records(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Each record, with its line number, up to the trailer, which ends the iteration
        (nothing may follow it); a file that ends before it is truncated."""
        while (record := self._next()) is not None:
            yield self.number, record
            if record.get("kind") == END:
                if self._next() is not None:
                    raise ImportRefused(f"line {self.number} follows the trailer")
                return
        raise ImportRefused(f"the file ends at line {self.number} without its trailer: truncated")


class _Writer:
    """Batches of records of one kind at a time, written under new ids."""

    def __init__(self, session: AsyncSession, namespace: str, checker: RecordChecker) -> None:
        self.session = session
        self.namespace = namespace
        self.checker = checker
        self.counts = Counts()
        self.ids = _IdMap()
        self._kind_index = -1
        self._batch: list[dict[str, Any]] = []

    async def write_all(self, records: Iterator[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """Write every record, each checked first; the trailer's counts (the reader ends with
        the trailer)."""
        trailer: dict[str, Any] = {}
        for number, record in records:
            name = record.get("kind")
            if name == END:
                trailer = record
                continue
            kind = _KINDS.get(name) if isinstance(name, str) else None
            if kind is None:
                raise _malformed(number, None, f"unknown record kind {name!r}")
            await self._switch_to(kind)
            _check_fields(kind, record)
            try:
                self.checker.check(kind, record)
            except EarmError as exc:
                raise _malformed(number, kind.name, exc.message) from None
            self._batch.append(record)
            if len(self._batch) >= BATCH_SIZE:
                await self._flush()
        await self._flush()
        return _trailer_counts(trailer)

    async def _switch_to(self, kind: RecordKind) -> None:
        index = RECORD_KINDS.index(kind)
        if index == self._kind_index and kind is not export.NAMESPACE:
            return
        if index <= self._kind_index or (self._kind_index < 0 and kind is not export.NAMESPACE):
            raise ImportRefused(
                f"a {kind.name} record out of order (the file holds one namespace record, then "
                f"{', '.join(k.name for k in RECORD_KINDS[1:])} records, in that order)"
            )
        await self._flush()
        self._kind_index = index

    async def _flush(self) -> None:
        if not self._batch:
            return
        kind = RECORD_KINDS[self._kind_index]
        await self.ids.rewrite(self.session, kind, self._batch)
        written = await export.insert_records(
            self.session, kind, self.namespace, json.dumps(self._batch)
        )
        if kind is export.NAMESPACE and not written:
            raise _exists(self.namespace)  # created since the check, by an ingest or an import
        self.counts.records[kind.name] += written
        self._batch = []


def _check_fields(kind: RecordKind, record: dict[str, Any]) -> None:
    if not kind.required <= record.keys() <= kind.fields:
        missing = sorted(kind.required - record.keys())
        unknown = sorted(record.keys() - kind.fields)
        raise ImportRefused(f"a {kind.name} record lacks {missing} or has unknown {unknown}")


def _trailer_counts(trailer: dict[str, Any]) -> dict[str, Any]:
    counts = trailer.get("records")
    if not isinstance(counts, dict):
        raise ImportRefused("the trailer has no record counts")
    return counts


class _IdMap:
    """Old memory and query ids to the new ones, filled as their records are written."""

    def __init__(self) -> None:
        self.memories: dict[int, int] = {}
        self.queries: dict[int, int] = {}

    async def rewrite(
        self, session: AsyncSession, kind: RecordKind, records: list[dict[str, Any]]
    ) -> None:
        """Give ``records`` their new ids, and their references the new ids of what they name."""
        if kind is export.MEMORY:
            await self._allocate(session, "memories", self.memories, records)
        elif kind is export.QUERY:
            await self._allocate(session, "queries", self.queries, records)
            await self._map_traced_memories(session, records)
        elif kind is not export.NAMESPACE:
            for record in records:
                record["memory_id"] = _mapped(self.memories, record["memory_id"], "memory")
                if "query_id" in record:
                    record["query_id"] = _mapped(self.queries, record["query_id"], "query")

    @staticmethod
    async def _allocate(
        session: AsyncSession, table: str, ids: dict[int, int], records: list[dict[str, Any]]
    ) -> None:
        new_ids = await export.allocate_ids(session, table, len(records))
        for record, new_id in zip(records, new_ids, strict=True):
            old_id = _an_id(record["id"])
            if old_id in ids:
                raise ImportRefused(f"{table} id {old_id} appears twice in the file")
            ids[old_id] = record["id"] = new_id

    async def _map_traced_memories(
        self, session: AsyncSession, records: list[dict[str, Any]]
    ) -> None:
        """A query's reused and traced memories, deleted ones given ids no memory has."""
        columns = ("reused_memory_ids", "trace_memory_ids")
        vanished = sorted({
            m for record in records for column in columns
            for m in _id_list(record[column]) if m not in self.memories
        })
        fresh = await export.allocate_ids(session, "memories", len(vanished))
        self.memories.update(zip(vanished, fresh, strict=True))
        for record in records:
            for column in columns:
                if record[column] is not None:
                    record[column] = [self.memories[m] for m in _id_list(record[column])]


def _an_id(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ImportRefused(f"{value!r} is not an id")
    return value


def _id_list(value: Any) -> list[int]:
    """A record's array of memory ids (empty for NULL)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ImportRefused(f"{value!r} is not an array of ids")
    return [_an_id(m) for m in value]


def _mapped(ids: dict[int, int], old_id: Any, what: str) -> int:
    new_id = ids.get(_an_id(old_id))
    if new_id is None:
        raise ImportRefused(f"a record names {what} {old_id}, which the file does not hold")
    return new_id

