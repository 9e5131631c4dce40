"""Edits of stored memories: ``PATCH /memories/{id}``, and the updates of an ingest with
``on_conflict="update"``.

A change of a memory's text or embedding retires its observations (they judged the old
content: :func:`service.db.experience.retire_observations`) and resets its model row; a change
of its metadata or ``occurred_at`` alone keeps them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.memories import UpdatedMemory
from service.db import experience
from service.db import memories as memory_table
from service.db.namespaces import namespace_state
from service.errors import NotFound
from service.ingest.records import MemoryPatch, NewMemory, stored_memory
from service.ingest.vectors import embed_ahead, model_ids, vectors_for
from service.providers.embedders import Embedder


async def update_stored(
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
    row = await _stored(session, memory_id)
    if patch.embedding is None and patch.text is not None and patch.text != row.text:
        # The embedder may take seconds: the read's transaction ends first rather than hold
        # a pooled connection retrieves need, and the row is read again after.
        await session.rollback()
        embedder = await embed_ahead(embedder, [patch.text])
        row = await _stored(session, memory_id)
    (change,) = await _changes(embedder, embedding_dim, [row], [patch])
    retired = await _write(session, row, change)
    return UpdatedMemory(stored_memory(await _stored(session, memory_id)), retired)


async def _stored(session: AsyncSession, memory_id: int) -> memory_table.MemoryRow:
    row = await memory_table.get_memory(session, memory_id)
    if row is None:
        raise NotFound(f"memory {memory_id} does not exist")
    return row


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
    computed = await vectors_for(embedder, embedding_dim, contents, positions)
    vectors = dict(zip(positions, computed, strict=True))
    models = dict(zip(positions, model_ids(embedder, contents, range(len(contents))), strict=True))
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
        session, row.namespace, row.id, change.values, content_changed=change.content_changed
    ):
        raise NotFound(f"memory {row.id} does not exist")
    if change.content_changed:
        return await experience.retire_observations(session, row.namespace, [row.id])
    return 0
