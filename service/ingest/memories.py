"""Memory storage: idempotent batch ingest (or update on ``external_id``), lookup, keyset
listing and deletion. No HTTP here.

The public face of the memory flow: the values it takes (:mod:`records
<service.ingest.records>`) and the edits of stored memories (:mod:`edits <service.ingest.edits>`)
are imported from here too; what it returns are the API's bodies (:mod:`service.api.memories`)."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import fields
from typing import NamedTuple

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.fields import MAX_BIGINT
from service.api.memories import IngestResult, MemoryPage, OnConflict, StoredMemory
from service.db import memories as memory_table
from service.db.namespaces import hold_namespace, namespace_state
from service.errors import IndexingBacklog, InvalidInput, NotFound
from service.ingest.edits import update_memory, update_stored
from service.ingest.records import MemoryPatch, NewMemory, stored_memory
from service.ingest.validation import repeats
from service.ingest.vectors import embed_ahead, model_ids, vectors_for
from service.providers.embedders import Embedder

__all__ = [
    "MemoryPatch",
    "NewMemory",
    "decode_cursor",
    "delete_memory",
    "encode_cursor",
    "get_memory",
    "ingest",
    "list_memories",
    "update_memory",
]


async def ingest(
    session: AsyncSession,
    embedder: Embedder | None,
    embedding_dim: int,
    namespace: str,
    items: Sequence[NewMemory],
    on_conflict: OnConflict = "keep",
    max_unindexed: int = 0,
) -> IngestResult:
    """Store a batch; a retry with the same external ids returns the same ids and creates nothing.
    With ``on_conflict="update"``, a stored external id whose item differs is updated to it.

    Existing external ids are looked up first so a retried batch costs no embedder calls; no
    database connection is held while the embedder works. The lookup and the writes happen
    under the namespace's row lock (:func:`~service.db.namespaces.hold_namespace`), so an erase
    of the namespace comes wholly before the batch (which then creates it afresh) or after it.
    An external id repeated within the batch is one memory, so its items must be the same.
    A batch that would create memories while ``max_unindexed`` (> 0) of the namespace's wait
    for the HNSW index is refused whole (:func:`_check_backlog`).
    """
    _check_repeated_external_ids(items)
    known, pending, new_external_ids, vectors, embedder = await _look_up_and_embed(
        session, embedder, embedding_dim, namespace, items, max_unindexed, on_conflict
    )
    created = 0
    anonymous_ids: dict[int, int] = {}  # request position -> id
    if pending:
        inserted = await _insert(
            session, embedder, namespace, items, pending, [vectors[p] for p in pending]
        )
        created = len(inserted)
        known.update({ext: mid for mid, ext in inserted if ext is not None})
        anonymous_ids = _anonymous_ids(items, pending, inserted)
        # A concurrent request may have inserted one of our external ids between our lookup
        # and our insert (ON CONFLICT DO NOTHING skipped it): fetch those ids now.
        missing = [ext for ext in new_external_ids if ext not in known]
        if missing:
            known.update(await memory_table.ids_by_external_id(session, namespace, missing))
    ids = [
        known[item.external_id] if item.external_id is not None else anonymous_ids[position]
        for position, item in enumerate(items)
    ]
    updated = 0
    if on_conflict == "update":
        inserted_positions = set(pending)
        stored = [item for p, item in enumerate(items) if p not in inserted_positions]
        updated = await update_stored(session, embedder, embedding_dim, namespace, stored)
    return IngestResult(
        ids=[int(i) for i in ids], created=created, existing=len(items) - created, updated=updated
    )


class _LookedUp(NamedTuple):
    """What an ingest found under the namespace's lock, and the vectors it needs to write."""

    known: dict[str, int]  # the stored ids of the batch's external ids
    pending: list[int]  # the positions to insert (:func:`_pending`)
    new_external_ids: set[str]
    vectors: dict[int, np.ndarray]  # request position -> the vector to insert
    embedder: Embedder | None  # answers the edits' new texts without waiting (embed_ahead)


async def _look_up_and_embed(
    session: AsyncSession,
    embedder: Embedder | None,
    embedding_dim: int,
    namespace: str,
    items: Sequence[NewMemory],
    max_unindexed: int,
    on_conflict: OnConflict,
) -> _LookedUp:
    """Under the namespace's row lock, held on return: what :class:`_LookedUp` holds, every
    vector the batch needs (the client's, checked, or the embedder's) computed with no
    transaction open, the new texts of the stored memories an ``update`` changes included."""
    external_ids = [item.external_id for item in items if item.external_id is not None]
    vectors: dict[int, np.ndarray] = {}  # request position -> the vector to store
    edits_embedded: set[str] = set()
    while True:
        # Under the namespace's row lock, so an erase waits for this transaction and cannot
        # take a memory it looked up (whose id it would acknowledge) or the row its inserts
        # reference.
        await hold_namespace(session, namespace)
        known: dict[str, int] = {}
        if external_ids:
            known = await memory_table.ids_by_external_id(session, namespace, external_ids)
        pending, new_external_ids = _pending(items, known)
        without_vector = [p for p in pending if p not in vectors]
        new_texts = [] if on_conflict != "update" else [
            text for text in await _edited_texts(session, namespace, items, known)
            if text not in edits_embedded
        ]
        if without_vector and max_unindexed > 0:
            await _check_backlog(session, namespace, max_unindexed)
        needs_embedder = bool(new_texts) or any(items[p].embedding is None for p in without_vector)
        if needs_embedder:
            # The embedder may take seconds (long texts, other ingests ahead): the transaction
            # ends (with its lock, and the namespace it may have created for a batch the
            # embedder could yet fail) rather than hold a pooled connection retrieves need.
            # The lookup is then redone under the lock: an erase may have taken what it found.
            await session.rollback()
        embedded = await vectors_for(
            embedder, embedding_dim, [items[p] for p in without_vector], without_vector
        )
        vectors.update(zip(without_vector, embedded, strict=True))
        embedder = await embed_ahead(embedder, new_texts)
        edits_embedded.update(new_texts)
        if not needs_embedder:
            return _LookedUp(known, pending, new_external_ids, vectors, embedder)


async def _edited_texts(
    session: AsyncSession, namespace: str, items: Sequence[NewMemory], known: dict[str, int]
) -> list[str]:
    """The texts an ``update`` gives stored memories in place of theirs, without a vector: what
    the update will embed."""
    stored = await memory_table.memories_by_external_id(session, namespace, list(known))
    text_of = {row.external_id: row.text for row in stored}
    return [
        item.text for item in items
        if item.embedding is None and item.external_id in text_of
        and item.text != text_of[item.external_id]
    ]


async def _check_backlog(session: AsyncSession, namespace: str, max_unindexed: int) -> None:
    """IndexingBacklog when ``max_unindexed`` or more of the namespace's memories wait for the
    HNSW index. Checked before any embedder call or write, so a refused batch costs little and
    stores nothing. A soft limit: concurrent batches may each pass it, and a batch that passes
    may take the backlog past it by its size."""
    backlog = await memory_table.unindexed_backlog(session, namespace, max_unindexed)
    if backlog >= max_unindexed:
        raise IndexingBacklog(
            f"namespace {namespace!r} has {backlog} or more memories waiting for the search "
            f"index, the limit EARM_MAX_UNINDEXED={max_unindexed}: nothing of this batch was "
            "stored. Retry later, once the indexer has caught up; to index faster run more "
            "`earm worker` processes, or raise EARM_MAX_UNINDEXED"
        )


def _check_repeated_external_ids(items: Sequence[NewMemory]) -> None:
    for first, position in repeats(item.external_id for item in items):
        if differing := _differing_fields(items[first], items[position]):
            raise InvalidInput(
                f"memories[{first}] and memories[{position}] share external_id "
                f"{items[first].external_id!r} but differ in {', '.join(differing)}: "
                "one of them would be lost"
            )


def _pending(items: Sequence[NewMemory], known: dict[str, int]) -> tuple[list[int], set[str]]:
    """Positions of the items to insert: new external ids (first occurrence only) and all
    anonymous items; and those new external ids."""
    pending: list[int] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        if item.external_id is None:
            pending.append(position)
        elif item.external_id not in known and item.external_id not in seen:
            seen.add(item.external_id)
            pending.append(position)
    return pending, seen


async def _insert(
    session: AsyncSession,
    embedder: Embedder | None,
    namespace: str,
    items: Sequence[NewMemory],
    pending: Sequence[int],
    vectors: Sequence[np.ndarray],
) -> list[tuple[int, str | None]]:
    batch = [items[p] for p in pending]
    return await memory_table.insert_memories(
        session,
        namespace,
        [item.external_id for item in batch],
        [item.text for item in batch],
        vectors,
        model_ids(embedder, items, pending),
        [item.occurred_at for item in batch],
        [item.metadata for item in batch],
    )


def _anonymous_ids(
    items: Sequence[NewMemory], pending: Sequence[int], inserted: Sequence[tuple[int, str | None]]
) -> dict[int, int]:
    """The ids of the inserted items without an external id, by request position."""
    # The INSERT draws identity values in request order (ORDER BY ordinality), so the
    # sorted ids of the anonymous rows line up with their request positions.
    anonymous_ids = iter(sorted(mid for mid, ext in inserted if ext is None))
    return {p: next(anonymous_ids) for p in pending if items[p].external_id is None}


def _differing_fields(one: NewMemory, other: NewMemory) -> list[str]:
    return [f.name for f in fields(NewMemory) if getattr(one, f.name) != getattr(other, f.name)]


async def get_memory(session: AsyncSession, memory_id: int) -> StoredMemory:
    memory = await memory_table.get_memory(session, memory_id)
    if memory is None:
        raise NotFound(f"memory {memory_id} does not exist")
    return stored_memory(memory)


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
    session: AsyncSession,
    namespace: str,
    limit: int,
    cursor: str | None,
    external_id: str | None = None,
) -> MemoryPage:
    """Keyset pagination by id: stable under concurrent inserts, O(limit) per page. With
    ``external_id``, the one memory the client stored under it."""
    after_id = decode_cursor(cursor) if cursor is not None else None
    found = await memory_table.memories_after(
        session, namespace, after_id, limit + 1, external_id
    )
    page = found[:limit]
    next_cursor = encode_cursor(page[-1].id) if len(found) > limit else None
    return MemoryPage([stored_memory(row) for row in page], next_cursor)


async def delete_memory(session: AsyncSession, memory_id: int, namespace: str) -> None:
    """Delete a memory; its observations and model parameters go with it (FK cascade).

    The namespace's row is locked first, with the lock every writer of model state takes
    (:func:`service.db.namespaces.namespace_state`): a refit rewrites ``memory_factors`` under
    that lock, and a delete that took the memory's row first deadlocked with it (the delete
    waiting for the memory's parameters, the refit waiting to reference the memory)."""
    await namespace_state(session, namespace, for_update=True)
    if not await memory_table.delete_memory(session, namespace, memory_id):
        raise NotFound(f"memory {memory_id} does not exist")
