"""Documents as memories: the texts a client sends to the rerank protocol are memories of its
namespace, identified by their text (docs/api.md "Rerank protocol"). The first time a text is
seen it is stored (no external id, no metadata) with the configured embedder's vector; the same
text later, or ingested through ``/memories``, is that memory, so its history counts. No HTTP
here. Their retention rule is :mod:`service.ingest.retention`'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import documents as document_table
from service.db import memories as memory_table
from service.db.namespaces import hold_namespace
from service.db.writes import Writes
from service.providers.embedders import Embedder, embed_texts


@dataclass(frozen=True)
class Documents:
    ids: dict[str, int]  # text -> memory id
    stored: int  # memories created for texts not seen before


async def document_ids(
    writes: Writes,
    embedder: Embedder | None,
    namespace: str,
    texts: Sequence[str],
    sighting_refresh_s: float,
) -> Documents:
    """The memory id of each distinct text, storing the texts not seen yet, and the sighting of
    the documents among them recorded (:func:`service.ingest.retention.sighting_refresh_s`).

    Known texts cost one read. New ones are embedded (a bulk call, off the event loop, with no
    connection held), then stored under the namespace's row lock, so an erase comes wholly
    before or after, and under the namespace's text lock, so two calls that both saw a text as
    new store it once. Never refused for the indexer's backlog (``EARM_MAX_UNINDEXED``): these
    memories are candidates because the caller named them, not because a search found them.
    The store is a write of the namespace's memories (``writes``: service.db.writes)."""
    distinct = list(dict.fromkeys(texts))

    async def look_up(session: AsyncSession) -> dict[str, int]:
        known = await memory_table.ids_by_text(session, namespace, distinct, sighting_refresh_s)
        await session.commit()  # the sightings it refreshed
        return known

    # None: the sightings are no write a client reads back (nothing to note).
    known = await writes.transaction(None, look_up, memories=False)
    new = [text for text in distinct if text not in known]
    if not new:
        return Documents(known, 0)
    vectors = await embed_texts(embedder, new, bulk=True)
    assert embedder is not None, "embed_texts refuses to embed without an embedder"
    model_id = embedder.model_id

    async def store(session: AsyncSession) -> tuple[dict[str, int], int]:
        stored = await _store_new(session, model_id, namespace, new, vectors, sighting_refresh_s)
        await session.commit()
        return stored

    stored, inserted = await writes.transaction(namespace, store, memories=True)
    return Documents(known | stored, inserted)


async def _store_new(
    session: AsyncSession,
    model_id: str,
    namespace: str,
    texts: Sequence[str],
    vectors: np.ndarray,
    sighting_refresh_s: float,
) -> tuple[dict[str, int], int]:
    """Under the locks, the ids of ``texts`` (those another call stored meanwhile, and the
    rest inserted now, marked as documents) and how many were inserted."""
    await hold_namespace(session, namespace)
    await memory_table.lock_texts(session, namespace)
    known = await memory_table.ids_by_text(session, namespace, texts, sighting_refresh_s)
    positions = [i for i, text in enumerate(texts) if text not in known]
    if not positions:
        return known, 0
    inserted = await memory_table.insert_memories(
        session,
        namespace,
        [None] * len(positions),
        [texts[i] for i in positions],
        [vectors[i] for i in positions],
        [model_id] * len(positions),
        [None] * len(positions),
        [{}] * len(positions),
    )
    # The INSERT draws identity values in the given order, so sorted ids line up with texts.
    ids = sorted(memory_id for memory_id, _ in inserted)
    new = {texts[i]: memory_id for i, memory_id in zip(positions, ids, strict=True)}
    await document_table.record_documents(session, namespace, ids)
    return known | new, len(new)
