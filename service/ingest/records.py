"""The values the memory flow takes and returns: a new memory, a patch of a stored one, and the
results of ingest, lookup, listing and edits (also the API's response bodies: service.http
serves them as they are)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from service.db import memories as memory_table


@dataclass(frozen=True)
class NewMemory:
    text: str
    embedding: Sequence[float] | None = None
    external_id: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


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
