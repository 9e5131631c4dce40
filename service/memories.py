"""Memory storage: idempotent batch ingest, lookup, keyset listing and deletion. No HTTP here."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import Memory, Namespace
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
    """A client-supplied vector as float32, or a precise error."""
    array = np.asarray(vector, dtype=np.float64)
    if array.ndim != 1 or array.shape[0] != dim:
        raise DimensionMismatch(
            f"{what} has {array.shape[0] if array.ndim == 1 else array.shape} dimensions; "
            f"this deployment uses {dim}"
        )
    if not np.all(np.isfinite(array)):
        raise InvalidInput(f"{what} contains NaN or infinite values")
    if not np.any(array):
        raise InvalidInput(f"{what} is all zeros, which has no cosine similarity")
    return array.astype(np.float32)


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

    Existing external ids are looked up first so a retried batch costs no embedder calls.
    """
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
            "metadata": [Jsonb(item.metadata) for item in items],
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


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"m{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("m"):
            raise ValueError(raw)
        return int(raw[1:])
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput("cursor is not one this service returned") from exc


async def list_memories(
    session: AsyncSession,
    namespace: str,
    limit: int,
    cursor: str | None,
    external_id: str | None = None,
) -> MemoryPage:
    """Keyset pagination by id: stable under concurrent inserts, O(limit) per page. With
    ``external_id``, the one memory the client stored under it (the unique index answers)."""
    statement = select(Memory).where(Memory.namespace == namespace)
    if external_id is not None:
        statement = statement.where(Memory.external_id == external_id)
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
