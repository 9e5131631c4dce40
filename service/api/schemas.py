"""Request and response bodies of the HTTP API (v1)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

NamespaceName = Annotated[
    str,
    Field(
        pattern=NAMESPACE_PATTERN,
        description="Letters, digits, '.', '_', ':', '-'; starts with a letter or digit; ≤ 128 chars.",
        examples=["agent-42"],
    ),
]
# NaN and infinities are legal in Python's JSON parser; refuse them at the edge.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Embedding = Annotated[list[FiniteFloat], Field(min_length=1)]
NonEmptyText = Annotated[str, Field(min_length=1)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryIn(StrictModel):
    text: NonEmptyText
    embedding: Embedding | None = None
    external_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    occurred_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestRequest(StrictModel):
    namespace: NamespaceName
    memories: Annotated[list[MemoryIn], Field(min_length=1)]


class IngestResponse(BaseModel):
    ids: list[int]
    created: int
    existing: int


class MemoryOut(BaseModel):
    id: int
    namespace: str
    external_id: str | None
    text: str
    occurred_at: datetime | None
    created_at: datetime
    metadata: dict[str, Any]
    embedding_model: str


class MemoryPageOut(BaseModel):
    memories: list[MemoryOut]
    next_cursor: str | None


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    status: Literal["ready"]
    schema_revision: str | None
