"""Memory storage: idempotent batch ingest, lookup, keyset listing and deletion. No HTTP here."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import MAX_BIGINT, Memory, Namespace
from service.embedders import Embedder, EmbedderError
from service.errors import (
    DimensionMismatch,
    EmbedderUnavailable,
    EmbeddingRequired,
    InvalidInput,
    NotFound,
)
from service.retrieval.store import namespace_state


@dataclass(frozen=True)
class NewMemory:
    text: str
    embedding: Sequence[float] | None = None
    external_id: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestResult:
    ids: list[int]
    created: int
    existing: int


@dataclass(frozen=True)
class MemoryPage:
    memories: list[Memory]
    next_cursor: str | None


def check_embedding(vector: Sequence[float], dim: int, what: str) -> np.ndarray:
    """A client-supplied vector (a memory's or a query's) as float32, or a precise error.

    The checks look at the float32 values pgvector stores, not at the JSON numbers: 1e-50 is
    not zero but becomes 0, 1e39 is finite but becomes infinite. pgvector's cosine distance
    also sums the squares in float32, so the squared length must be positive and finite there
    too (384 x 1e-30 or 384 x 1e38 have none); a vector without one would make every
    similarity to it NaN, and the content prior divide by its zero norm."""
    with np.errstate(over="ignore", under="ignore"):
        array = np.asarray(vector, dtype=np.float32)
        squared_length = np.sum(np.square(array), dtype=np.float32)
    if array.ndim != 1 or array.shape[0] != dim:
        raise DimensionMismatch(
            f"{what} has {array.shape[0] if array.ndim == 1 else array.shape} dimensions; "
            f"this deployment uses {dim}"
        )
    if not np.all(np.isfinite(array)):
        raise InvalidInput(
            f"{what} has NaN, infinite or out-of-range values: vectors are stored as 32-bit "
            "floats, whose magnitude ends at 3.4e38"
        )
    if not np.any(array):
        raise InvalidInput(
            f"{what} is all zeros as 32-bit floats (magnitudes below 1.4e-45 round to 0), "
            "which has no cosine similarity"
        )
    if not 0 < squared_length < np.inf:
        raise InvalidInput(
            f"{what} has no length in 32-bit floats (its squared length "
            f"{'overflows' if squared_length else 'rounds to 0'}): scale it, e.g. to unit length"
        )
    return array


def repeats(keys: Iterable[Hashable | None]) -> Iterator[tuple[int, int]]:
    """(first position, position) of each key that occurred before; None keys are skipped."""
    first_positions: dict[Hashable, int] = {}
    for position, key in enumerate(keys):
        if key is not None:
            first = first_positions.setdefault(key, position)
            if first != position:
                yield first, position


async def embed_texts(embedder: Embedder | None, texts: Sequence[str]) -> np.ndarray:
    """Embed texts with the configured embedder, translating its failures to a domain error."""
    if embedder is None:
        raise EmbeddingRequired(
            "no embedder is configured (EARM_EMBEDDER=none): send embeddings with the request"
        )
    try:
        return await embedder.embed(list(texts))
    except EmbedderError as exc:
        raise EmbedderUnavailable(f"the embedder failed: {exc}") from exc


async def ensure_namespace(session: AsyncSession, namespace: str) -> None:
    await session.execute(insert(Namespace).values(name=namespace).on_conflict_do_nothing())


async def ingest(
    session: AsyncSession,
    embedder: Embedder | None,
    embedding_dim: int,
    namespace: str,
    items: Sequence[NewMemory],
) -> IngestResult:
    """Store a batch; a retry with the same external ids returns the same ids and creates nothing.

    Existing external ids are looked up first so a retried batch costs no embedder calls. An
    external id repeated within the batch is one memory, so its items must be the same.
    """
    for first, position in repeats(item.external_id for item in items):
        if differing := _differing_fields(items[first], items[position]):
            raise InvalidInput(
                f"memories[{first}] and memories[{position}] share external_id "
                f"{items[first].external_id!r} but differ in {', '.join(differing)}: "
                "one of them would be lost"
            )
    external_ids = [item.external_id for item in items if item.external_id is not None]
    known: dict[str, int] = {}
    if external_ids:
        rows = await session.execute(
            select(Memory.external_id, Memory.id).where(
                Memory.namespace == namespace, Memory.external_id.in_(external_ids)
            )
        )
        known = {external_id: memory_id for external_id, memory_id in rows}

    # Items to insert: new external ids (first occurrence only) and all anonymous items.
    pending: list[int] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        if item.external_id is None:
            pending.append(position)
        elif item.external_id not in known and item.external_id not in seen:
            seen.add(item.external_id)
            pending.append(position)

    vectors = await _vectors_for(embedder, embedding_dim, [items[p] for p in pending], pending)
    await ensure_namespace(session, namespace)

    ids: list[int | None] = [None] * len(items)
    created = 0
    if pending:
        model_ids = _model_ids(embedder, items, pending)
        inserted = await _insert_memories(
            session, namespace, [items[p] for p in pending], vectors, model_ids
        )
        created = len(inserted)
        inserted_by_external = {ext: mid for mid, ext in inserted if ext is not None}
        # The INSERT draws identity values in request order (ORDER BY ordinality), so the
        # sorted ids of the anonymous rows line up with their request positions.
        anonymous_ids = iter(sorted(mid for mid, ext in inserted if ext is None))
        known.update(inserted_by_external)
        for p in pending:
            if items[p].external_id is None:
                ids[p] = next(anonymous_ids)
        # A concurrent request may have inserted one of our external ids between our lookup
        # and our insert (ON CONFLICT DO NOTHING skipped it): fetch those ids now.
        missing = [ext for ext in seen if ext not in known]
        if missing:
            rows = await session.execute(
                select(Memory.external_id, Memory.id).where(
                    Memory.namespace == namespace, Memory.external_id.in_(missing)
                )
            )
            known.update(dict(rows.all()))
    for position, item in enumerate(items):
        if item.external_id is not None:
            ids[position] = known[item.external_id]
    return IngestResult(ids=[int(i) for i in ids], created=created, existing=len(items) - created)


def _differing_fields(one: NewMemory, other: NewMemory) -> list[str]:
    return [f.name for f in fields(NewMemory) if getattr(one, f.name) != getattr(other, f.name)]


_INSERT_SQL = """
    INSERT INTO memories (namespace, external_id, text, embedding, embedding_model, occurred_at,
                          metadata)
    SELECT %(namespace)s::text, e, t, v, mdl, o, md
    FROM unnest(%(external_ids)s::text[], %(texts)s::text[], %(embeddings)b::vector[],
                %(models)s::text[], %(occurred_at)s::timestamptz[], %(metadata)s::jsonb[])
        WITH ORDINALITY AS u(e, t, v, mdl, o, md, ord)
    ORDER BY ord
    ON CONFLICT (namespace, external_id) DO NOTHING
    RETURNING id, external_id
"""


# A JSON string, or a number in exponent form with a positive exponent: json.dumps writes
# every float from 1e16 up (and no int) that way.
_STRING_OR_LARGE_FLOAT = re.compile(r'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?e\+[0-9]+')


def metadata_json(metadata: dict[str, Any]) -> str:
    """JSON text of a metadata object in which every float reads back from JSONB as a float.

    JSONB stores numbers as numeric, which prints 1e308 (from json.dumps's "1e+308") as a
    309-digit integer, so it read back as an int. Such floats are written out in full with a
    ".0", which numeric keeps; the decimal is exact, so it reads back as the same float."""
    text = json.dumps(metadata)
    if "e+" not in text:
        return text
    return _STRING_OR_LARGE_FLOAT.sub(
        lambda match: match[0] if match[0].startswith('"') else f"{float(match[0]):.1f}", text
    )


async def _insert_memories(
    session: AsyncSession,
    namespace: str,
    items: Sequence[NewMemory],
    vectors: Sequence[np.ndarray],
    model_ids: Sequence[str],
) -> list[tuple[int, str | None]]:
    """One multi-row INSERT; vectors travel in pgvector's binary format (the engine registers
    its adapters on every connection), with no per-value text formatting or parsing."""
    connection = await session.connection()
    conn = (await connection.get_raw_connection()).driver_connection
    cursor = await conn.execute(
        _INSERT_SQL,
        {
            "namespace": namespace,
            "external_ids": [item.external_id for item in items],
            "texts": [item.text for item in items],
            "embeddings": [np.asarray(v, dtype=np.float32) for v in vectors],
            "models": list(model_ids),
            "occurred_at": [item.occurred_at for item in items],
            "metadata": [Jsonb(item.metadata, dumps=metadata_json) for item in items],
        },
    )
    return [(int(mid), ext) for mid, ext in await cursor.fetchall()]


def _model_ids(
    embedder: Embedder | None, items: Sequence[NewMemory], pending: Sequence[int]
) -> list[str]:
    return [
        "client" if items[p].embedding is not None else (embedder.model_id if embedder else "")
        for p in pending
    ]


async def _vectors_for(
    embedder: Embedder | None,
    embedding_dim: int,
    items: Sequence[NewMemory],
    positions: Sequence[int],
) -> list[np.ndarray]:
    """Client vectors checked as given; the rest embedded in one batched call."""
    vectors: list[np.ndarray | None] = [
        check_embedding(item.embedding, embedding_dim, f"memories[{position}].embedding")
        if item.embedding is not None
        else None
        for item, position in zip(items, positions)
    ]
    to_embed = [i for i, vector in enumerate(vectors) if vector is None]
    if to_embed:
        computed = await embed_texts(embedder, [items[i].text for i in to_embed])
        for i, vector in zip(to_embed, computed):
            vectors[i] = vector
    return vectors  # type: ignore[return-value]


async def get_memory(session: AsyncSession, memory_id: int) -> Memory:
    memory = await session.get(Memory, memory_id)
    if memory is None:
        raise NotFound(f"memory {memory_id} does not exist")
    return memory


_CURSOR = re.compile(r"m[1-9][0-9]{0,18}")


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"m{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The id :func:`encode_cursor` wrote, or InvalidInput for anything it cannot have written:
    int() also reads signs, spaces and underscores, and an id past bigint failed in SQL (500)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except ValueError:  # not ASCII, not base64 (binascii.Error) or not UTF-8 underneath
        raw = ""
    if not _CURSOR.fullmatch(raw) or int(raw[1:]) > MAX_BIGINT:
        raise InvalidInput("cursor is not one this service returned")
    return int(raw[1:])


async def list_memories(
    session: AsyncSession, namespace: str, limit: int, cursor: str | None
) -> MemoryPage:
    """Keyset pagination by id: stable under concurrent inserts, O(limit) per page."""
    statement = select(Memory).where(Memory.namespace == namespace)
    if cursor is not None:
        statement = statement.where(Memory.id > decode_cursor(cursor))
    rows = (await session.scalars(statement.order_by(Memory.id).limit(limit + 1))).all()
    page = list(rows[:limit])
    next_cursor = encode_cursor(page[-1].id) if len(rows) > limit else None
    return MemoryPage(page, next_cursor)


async def delete_memory(session: AsyncSession, memory_id: int, namespace: str) -> None:
    """Delete a memory; its observations and model parameters go with it (FK cascade).

    The namespace's row is locked first, with the lock every writer of model state takes
    (:func:`service.retrieval.store.namespace_state`): a refit rewrites ``memory_factors`` under that lock, and a delete that took the
    memory's row first deadlocked with it (the delete waiting for the memory's parameters, the
    refit waiting to reference the memory)."""
    await namespace_state(session, namespace, for_update=True)
    result = await session.execute(delete(Memory).where(Memory.id == memory_id))
    if result.rowcount == 0:
        raise NotFound(f"memory {memory_id} does not exist")
