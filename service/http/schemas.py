"""Request and response bodies of the HTTP API (v1).

Most response bodies are the domain's own result dataclasses, served as they are (FastAPI takes
dataclasses as response models): ``IngestResult``, ``StoredMemory``, ``MemoryPage``
(``service.ingest.memories``), ``RetrieveResult`` (``service.retrieve.pipeline``),
``FeedbackResult`` (``service.retrieve.learning``), ``NamespaceStats`` (``service.db.stats``),
``ScorerHealthSnapshot`` (``service.providers.scorer_health``). Only the envelopes of
``/stats`` are declared here.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    model_validator,
)
from pydantic_core import PydanticCustomError

from service.checks import NAMESPACE_PATTERN
from service.db.models import MAX_BIGINT
from service.db.stats import NamespaceStats
from service.ingest.validation import storable_text_problem
from service.providers.scorer_health import ScorerHealthSnapshot
from service.retrieve.refit_health import RefitHealthSnapshot

NamespaceName = Annotated[
    str,
    Field(
        pattern=NAMESPACE_PATTERN,
        description=(
            "Letters, digits, '.', '_', ':', '-'; starts with a letter or digit; ≤ 128 chars."
        ),
        examples=["agent-42"],
    ),
]


def _json_number(value: Any) -> Any:
    # JSON has one number type, so 10.0 is the integer 10 (pydantic refuses 10.5 itself); but
    # pydantic's lax mode also read true as 1 and "10" as 10, which JSON does not.
    if isinstance(value, bool | str):
        raise PydanticCustomError(
            "int_type", "Input should be a valid integer, not a {kind}",
            {"kind": "boolean" if isinstance(value, bool) else "string"},
        )
    return value


# Placed after an integer's constraints (placed before, they would be lost from its JSON
# schema). For JSON bodies only: path and query parameters are strings, parsed as integers.
JSON_NUMBER = BeforeValidator(_json_number)
# Ids beyond MAX_BIGINT can name nothing, so they are refused at the edge (422) instead of
# reaching SQL.
DatabaseId = Annotated[int, Field(ge=1, le=MAX_BIGINT), JSON_NUMBER]
MemoryId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A memory id.")]
# Strict: a number (an integer too), never a boolean or a string; checked by pydantic-core
# alone, as a Python check per element would cost more than parsing a batch of vectors.
# NaN and infinities are legal in Python's JSON parser; refuse them at the edge.
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Embedding = Annotated[list[FiniteFloat], Field(min_length=1)]
#: A relevance score, observed or given as feedback.
Score = Annotated[FiniteFloat, Field(ge=0.0, le=1.0)]


def _storable(value: str) -> str:
    # Postgres text cannot hold NUL characters or lone surrogates: refuse them (422).
    if problem := storable_text_problem(value):
        raise ValueError(problem)
    return value


def _not_blank(value: str) -> str:
    # Only whitespace and invisible format characters (Unicode category Cf: zero-width spaces
    # and joiners, the byte order mark) say nothing to embed or to score, and a scorer would
    # see an empty text.
    if not any(not char.isspace() and unicodedata.category(char) != "Cf" for char in value):
        raise ValueError("has no visible character (only whitespace or format characters)")
    return value


def _iso_8601_only(value: Any) -> Any:
    # pydantic also reads a number, or a string of one, as Unix time: in seconds, or in
    # milliseconds past 2e10 (so -62135596801, meant as year 1, was a date in 1968). Only an
    # ISO-8601 string says which instant it means.
    if not isinstance(value, str) or _is_number(value):
        raise ValueError("must be an ISO-8601 date-time string, e.g. 2023-05-08T13:56:00Z")
    return value


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _representable(value: datetime) -> datetime:
    # A time Postgres and Python can both give back: within years 1..9999 once in UTC. It is
    # passed on in UTC (the same instant): Postgres rejects UTC offsets beyond ±15:59, which
    # Python accepts (found by the fuzz test: -21:13 was a 500). A time without an offset is
    # UTC: left naive, Postgres would read it in the session's time zone, and a naive value
    # never equals the stored (aware) one, so re-ingesting it would count as an update.
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


NonEmptyText = Annotated[
    str, Field(min_length=1), AfterValidator(_storable), AfterValidator(_not_blank)
]
ExternalId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_storable)]
Timestamp = Annotated[
    datetime, BeforeValidator(_iso_8601_only), AfterValidator(_representable)
]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryIn(StrictModel):
    text: NonEmptyText
    embedding: Embedding | None = None
    external_id: ExternalId | None = None
    occurred_at: Timestamp | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestRequest(StrictModel):
    namespace: NamespaceName
    memories: Annotated[list[MemoryIn], Field(min_length=1)]
    on_conflict: Literal["keep", "update"] = Field(
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
    # Refits failing do not make the process unready (every request still answers), so they
    # are a detail here, not the status.
    refits: Annotated[
        RefitHealthSnapshot,
        Field(description="How this process's full refits have gone (they fail no request)."),
    ]


class RetrieveIn(StrictModel):
    namespace: NamespaceName
    query: NonEmptyText
    query_embedding: Embedding | None = None
    k: Annotated[int, Field(ge=1, description="Memories to return."), JSON_NUMBER] = 10
    candidates: Annotated[
        int | None,
        Field(ge=1, description="Semantic candidates (N). Default: EARM_DEFAULT_CANDIDATES."),
        JSON_NUMBER,
    ] = None
    policy: Literal["earm", "semantic", "full", "observed"] = "earm"
    budget: Annotated[
        int | None,
        Field(ge=0, description="Anchors to score; overrides the schedule (earm/observed)."),
        JSON_NUMBER,
    ] = None
    seed: Annotated[int, JSON_NUMBER] = 0
    order: Literal["chronological", "relevance"] = "chronological"
    filters: dict[str, Any] | None = Field(
        default=None, description="Only memories whose metadata contains this JSON object."
    )


class FeedbackScore(StrictModel):
    """A score for one memory, named by its id or by its external_id (exactly one)."""

    memory_id: DatabaseId | None = None
    external_id: ExternalId | None = None
    score: Score

    @model_validator(mode="after")
    def _one_memory(self) -> FeedbackScore:
        if (self.memory_id is None) == (self.external_id is None):
            raise ValueError("give exactly one of memory_id and external_id")
        return self

    @property
    def memory(self) -> int | str:
        return self.memory_id if self.memory_id is not None else str(self.external_id)


class FeedbackIn(StrictModel):
    namespace: NamespaceName
    query_id: DatabaseId
    scores: Annotated[list[FeedbackScore], Field(min_length=1)]


@dataclass(frozen=True)
class NamespaceReportOut(NamespaceStats):
    """One namespace's stats and the scorer's health."""

    scorer: ScorerHealthSnapshot


@dataclass(frozen=True)
class StatsListOut:
    """The stats of every namespace the API key may use, and the scorer's health."""

    namespaces: list[NamespaceStats]
    scorer: ScorerHealthSnapshot
