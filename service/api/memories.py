"""The bodies of ``/memories``: the memories to ingest, the patch of one, and what ingest,
lookup, listing and edits answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from service.api.fields import (
    Embedding,
    ExternalId,
    NamespaceName,
    NonEmptyText,
    StrictModel,
    Timestamp,
)

#: What an ingest does with an item whose external_id is already stored: ``keep`` the stored
#: memory (idempotent retries), or ``update`` it to the item's content.
OnConflict = Literal["keep", "update"]


class MemoryIn(StrictModel):
    text: NonEmptyText
    embedding: Embedding | None = None
    external_id: ExternalId | None = None
    occurred_at: Timestamp | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestRequest(StrictModel):
    namespace: NamespaceName
    memories: Annotated[list[MemoryIn], Field(min_length=1)]
    on_conflict: OnConflict = Field(
        default="keep",
        description="An external_id already stored: keep the stored memory (idempotent "
        "retries), or update it to this item (a new text or embedding retires its "
        "observations).",
    )


class MemoryPatchIn(StrictModel):
    """The fields of a memory to change; at least one. ``occurred_at: null`` clears it."""

    text: NonEmptyText | None = None
    embedding: Embedding | None = None
    metadata: dict[str, Any] | None = None
    occurred_at: Timestamp | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> MemoryPatchIn:
        if not self.model_fields_set:
            raise ValueError("give at least one of text, embedding, metadata, occurred_at")
        for name in ("text", "embedding", "metadata"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null (only occurred_at can be cleared)")
        return self


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


@dataclass(frozen=True)
class MemoryPage:
    memories: list[StoredMemory]
    next_cursor: str | None


@dataclass(frozen=True)
class UpdatedMemory:
    """A memory after an edit, and how many of its observations the edit retired."""

    memory: StoredMemory
    retired_observations: int
