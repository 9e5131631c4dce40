"""The values the memory flow takes: a new memory and a patch of a stored one. What it returns
(the results of ingest, lookup, listing and edits) are the API's response bodies, defined by the
contract (``service.api.memories``); :func:`stored_memory` builds one of a stored row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.api.memories import StoredMemory
from service.db import memories as memory_table


@dataclass(frozen=True)
class NewMemory:
    text: str
    embedding: Sequence[float] | None = None
    external_id: str | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryPatch:
    """The fields of a memory to change (None: unchanged). ``occurred_at`` is changed when
    ``sets_occurred_at``, to None too (which clears it)."""

    text: str | None = None
    embedding: Sequence[float] | None = None
    metadata: dict[str, Any] | None = None
    occurred_at: datetime | None = None
    sets_occurred_at: bool = False


def stored_memory(row: memory_table.MemoryRow) -> StoredMemory:
    """A stored row as lookup and listing answer it (without its embedding)."""
    return StoredMemory(
        id=row.id,
        namespace=row.namespace,
        external_id=row.external_id,
        text=row.text,
        occurred_at=row.occurred_at,
        created_at=row.created_at,
        metadata=row.metadata,
        embedding_model=row.embedding_model,
    )
