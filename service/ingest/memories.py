"""Memory storage: idempotent batch ingest (or update on ``external_id``), edits, lookup,
keyset listing and deletion. No HTTP here.

A change of a memory's text or embedding retires its observations (they judged the old
content: :func:`service.db.experience.retire_observations`) and resets its model row; a change
of its metadata or ``occurred_at`` alone keeps them."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import experience
from service.db import memories as memory_table
from service.db.models import MAX_BIGINT
from service.db.namespaces import ensure_namespace, namespace_state
from service.errors import IndexingBacklog, InvalidInput, NotFound
from service.ingest.validation import repeats
from service.providers.embedders import Embedder, check_embedding, embed_texts


@dataclass(frozen=True)
class NewMemory:
    text: str
    embedding: Sequence[float] | None = None
    external_id: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# The results below are also the API's response bodies (service.http serves them as they are).


#: What an ingest does with an item whose external_id is already stored: ``keep`` the stored
#: memory (idempotent retries), or ``update`` it to the item's content.
OnConflict = Literal["keep", "update"]


@dataclass(frozen=True)
class MemoryPatch:
    """The fields of a memory to change (None: unchanged). ``occurred_at`` is changed when
    ``sets_occurred_at``, to None too (which clears it)."""

    text: str | None = None
    embedding: Sequence[float] | None = None
    metadata: dict[str, Any] | None = None
    occurred_at: datetime | None = None
    sets_occurred_at: bool = False


@dataclass(frozen=True)
class IngestResult:
    ids: list[int]
    created: int
    existing: int
    # Of the existing ones, those whose stored content changed (on_conflict "update" only).
    updated: int = 0


@dataclass(frozen=True)
class StoredMemory:
    """A stored memory, as lookup and listing return it (the embedding is not returned)."""

    id: int
    namespace: str
    external_id: str | None
    text: str
    occurred_at: datetime | None
    created_at: datetime
    metadata: dict[str, Any]
    embedding_model: str

    @classmethod
    def of(cls, row: memory_table.MemoryRow) -> StoredMemory:
        return cls(
            id=row.id,
            namespace=row.namespace,
            external_id=row.external_id,
            text=row.text,
            occurred_at=row.occurred_at,
            created_at=row.created_at,
            metadata=row.metadata,
            embedding_model=row.embedding_model,
        )


@dataclass(frozen=True)
class MemoryPage:
    memories: list[StoredMemory]
    next_cursor: str | None


@dataclass(frozen=True)
class UpdatedMemory:
    """A memory after an edit, and how many of its observations the edit retired."""

    memory: StoredMemory
    retired_observations: int


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

    Existing external ids are looked up first so a retried batch costs no embedder calls. An
    external id repeated within the batch is one memory, so its items must be the same.
    A batch that would create memories while ``max_unindexed`` (> 0) of the namespace's wait
    for the HNSW index is refused whole (:func:`_check_backlog`).
    """
    _check_repeated_external_ids(items)
    external_ids = [item.external_id for item in items if item.external_id is not None]
    known: dict[str, int] = {}
    if external_ids:
        known = await memory_table.ids_by_external_id(session, namespace, external_ids)
    pending, new_external_ids = _pending(items, known)
    if pending and max_unindexed > 0:
        await _check_backlog(session, namespace, max_unindexed)

    vectors = await _vectors_for(embedder, embedding_dim, [items[p] for p in pending], pending)
    await ensure_namespace(session, namespace)

    created = 0
    anonymous_ids: dict[int, int] = {}  # request position -> id
    if pending:
        inserted = await _insert(session, embedder, namespace, items, pending, vectors)
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
        updated = await _update_stored(session, embedder, embedding_dim, namespace, stored)
    return IngestResult(
        ids=[int(i) for i in ids], created=created, existing=len(items) - created, updated=updated
    )


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


async def _update_stored(
    session: AsyncSession,
    embedder: Embedder | None,
    embedding_dim: int,
    namespace: str,
    items: Sequence[NewMemory],
) -> int:
    """Update the stored memories of ``items`` (each under its external id) whose content
    differs from the item: the item is the whole memory, so its metadata and occurred_at
    replace the stored ones. Returns how many changed."""
    by_external_id = {item.external_id: item for item in items if item.external_id is not None}
    if not by_external_id:
        return 0
    rows = await memory_table.memories_by_external_id(session, namespace, list(by_external_id))
    rows.sort(key=lambda r: r.id)
    patches = [
        MemoryPatch(
            text=item.text,
            embedding=item.embedding,
            metadata=item.metadata,
            occurred_at=item.occurred_at,
            sets_occurred_at=True,
        )
        for item in (by_external_id[str(row.external_id)] for row in rows)
    ]
    changes = await _changes(embedder, embedding_dim, rows, patches)
    changed = [(row, change) for row, change in zip(rows, changes, strict=True) if change.differs]
    for row, change in changed:
        await _write(session, row, change)
    return len(changed)


async def update_memory(
    session: AsyncSession,
    embedder: Embedder | None,
    embedding_dim: int,
    memory_id: int,
    patch: MemoryPatch,
) -> UpdatedMemory:
    """Edit a stored memory (``PATCH /memories/{id}``); the caller has authorised its
    namespace. NotFound for an unknown (or concurrently deleted) memory."""
    row = await memory_table.get_memory(session, memory_id)
    if row is None:
        raise NotFound(f"memory {memory_id} does not exist")
    (change,) = await _changes(embedder, embedding_dim, [row], [patch])
    retired = await _write(session, row, change)
    updated = await memory_table.get_memory(session, memory_id)
    if updated is None:
        raise NotFound(f"memory {memory_id} does not exist")
    return UpdatedMemory(StoredMemory.of(updated), retired)


@dataclass(frozen=True)
class _Change:
    """The columns a patch sets on a stored memory (``MemoryRow`` attribute names), and whether
    its content (text or vector) changes, which retires its observations."""

    values: dict[str, Any]
    content_changed: bool
    differs: bool  # whether anything would change at all


async def _changes(
    embedder: Embedder | None,
    embedding_dim: int,
    rows: Sequence[memory_table.MemoryRow],
    patches: Sequence[MemoryPatch],
) -> list[_Change]:
    """What each patch changes of its row. A vector is written when it differs from the stored
    one: a client vector, or a new text sent without one, embedded as at ingest (one batched
    call for all the rows)."""
    new_texts = [
        p.text is not None and p.text != row.text for row, p in zip(rows, patches, strict=True)
    ]
    positions = [i for i, p in enumerate(patches) if p.embedding is not None or new_texts[i]]
    contents = [
        NewMemory(text=patches[i].text or rows[i].text, embedding=patches[i].embedding)
        for i in positions
    ]
    computed = await _vectors_for(embedder, embedding_dim, contents, positions)
    vectors = dict(zip(positions, computed, strict=True))
    models = dict(zip(positions, _model_ids(embedder, contents, range(len(contents))), strict=True))
    changes = []
    for i, (row, patch) in enumerate(zip(rows, patches, strict=True)):
        values: dict[str, Any] = {}
        if patch.text is not None:
            values["text"] = patch.text
        if patch.metadata is not None:
            values["metadata"] = patch.metadata
        if patch.sets_occurred_at:
            values["occurred_at"] = patch.occurred_at
        if i in vectors and not np.array_equal(vectors[i], np.asarray(row.embedding, np.float32)):
            values["embedding"], values["embedding_model"] = vectors[i], models[i]
        differs = any(
            name == "embedding" or getattr(row, name) != value for name, value in values.items()
        )
        changes.append(_Change(values, new_texts[i] or "embedding" in values, differs))
    return changes


async def _write(session: AsyncSession, row: memory_table.MemoryRow, change: _Change) -> int:
    """Write ``change`` to ``row``'s memory; a new text or vector retires its observations
    (they judged the old content): returns how many."""
    if not change.differs:  # e.g. the stored vector sent again
        return 0
    # The namespace's lock, as a delete takes it: retiring writes the running mean and the
    # memory's model row, which a refit rewrites under the same lock. Taken after any embedder
    # call (:func:`_changes`), which must not hold up the namespace.
    await namespace_state(session, row.namespace, for_update=True)
    if not await memory_table.update_memory(
        session, row.id, change.values, content_changed=change.content_changed
    ):
        raise NotFound(f"memory {row.id} does not exist")
    if change.content_changed:
        return await experience.retire_observations(session, row.namespace, [row.id])
    return 0


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
        _model_ids(embedder, items, pending),
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
        for item, position in zip(items, positions, strict=True)
    ]
    to_embed = [i for i, vector in enumerate(vectors) if vector is None]
    if to_embed:
        computed = await embed_texts(embedder, [items[i].text for i in to_embed])
        for i, vector in zip(to_embed, computed, strict=True):
            vectors[i] = vector
    filled = [vector for vector in vectors if vector is not None]
    assert len(filled) == len(vectors), "the embedder returns a vector for every text"
    return filled


async def get_memory(session: AsyncSession, memory_id: int) -> StoredMemory:
    memory = await memory_table.get_memory(session, memory_id)
    if memory is None:
        raise NotFound(f"memory {memory_id} does not exist")
    return StoredMemory.of(memory)


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
    return MemoryPage([StoredMemory.of(row) for row in page], next_cursor)


async def delete_memory(session: AsyncSession, memory_id: int, namespace: str) -> None:
    """Delete a memory; its observations and model parameters go with it (FK cascade).

    The namespace's row is locked first, with the lock every writer of model state takes
    (:func:`service.db.namespaces.namespace_state`): a refit rewrites ``memory_factors`` under
    that lock, and a delete that took the memory's row first deadlocked with it (the delete
    waiting for the memory's parameters, the refit waiting to reference the memory)."""
    await namespace_state(session, namespace, for_update=True)
    if not await memory_table.delete_memory(session, memory_id):
        raise NotFound(f"memory {memory_id} does not exist")
