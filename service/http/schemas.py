"""Request and response bodies of the HTTP API (v1)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from service.db.models import MAX_BIGINT
from service.ingest.validation import storable_text_problem
from service.providers.scorer_health import MAX_AGE_S, MIN_CALLS, WINDOW_CALLS

NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

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
# Ids beyond MAX_BIGINT can name nothing, so they are refused at the edge (422) instead of
# reaching SQL.
DatabaseId = Annotated[int, Field(ge=1, le=MAX_BIGINT)]
MemoryId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A memory id.")]
# NaN and infinities are legal in Python's JSON parser; refuse them at the edge.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Embedding = Annotated[list[FiniteFloat], Field(min_length=1)]


def _storable(value: str) -> str:
    # Postgres text cannot hold NUL characters or lone surrogates: refuse them (422).
    if problem := storable_text_problem(value):
        raise ValueError(problem)
    return value


def _not_blank(value: str) -> str:
    # Only whitespace says nothing to embed or to score, and a scorer would see an empty text.
    if not value.strip():
        raise ValueError("is only whitespace")
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
    # Python accepts (found by the fuzz test: -21:13 was a 500).
    if value.tzinfo is not None:
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("is out of range once converted to UTC") from None
    return value


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


class RetrieveIn(StrictModel):
    namespace: NamespaceName
    query: NonEmptyText
    query_embedding: Embedding | None = None
    k: Annotated[int, Field(ge=1, description="Memories to return.")] = 10
    candidates: Annotated[int, Field(ge=1, description="Semantic candidates (N).")] = 200
    policy: Literal["earm", "semantic", "full", "observed"] = "earm"
    budget: Annotated[
        int | None,
        Field(ge=0, description="Anchors to score; overrides the schedule (earm/observed)."),
    ] = None
    seed: int = 0
    order: Literal["chronological", "relevance"] = "chronological"
    filters: dict[str, Any] | None = Field(
        default=None, description="Only memories whose metadata contains this JSON object."
    )


class RetrievedMemoryOut(BaseModel):
    id: int
    external_id: str | None
    text: str
    occurred_at: datetime | None
    metadata: dict[str, Any]
    score: float
    source: Literal["observed", "estimated", "semantic"]
    similarity: float
    rank: int


class Timings(BaseModel):
    embed_ms: float
    search_ms: float
    score_ms: float
    complete_ms: float
    record_ms: float
    total_ms: float


class RetrieveOut(BaseModel):
    query_id: int
    query_index: int
    policy: str
    stage: int
    budget: int
    scorer_calls: int
    degraded: bool
    memories: list[RetrievedMemoryOut]
    timings: Timings


class FeedbackScore(StrictModel):
    memory_id: DatabaseId
    score: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class FeedbackIn(StrictModel):
    namespace: NamespaceName
    query_id: DatabaseId
    scores: Annotated[list[FeedbackScore], Field(min_length=1)]


class FeedbackOut(BaseModel):
    recorded: int
    already_observed: int


class NamespaceStatsOut(BaseModel):
    namespace: str
    memories: int
    memories_unindexed: int = Field(
        description="Memories not in the HNSW index yet (the background indexer's backlog); "
        "searches find them by an exact scan meanwhile."
    )
    queries: int = Field(description="Queries recorded (the next query's index).")
    observations: int = Field(description="Observed cells: scorer scores and feedback.")
    density: float = Field(description="observations / (memories × queries); 0 while either is 0.")
    stage: int = Field(description="Budget stage of the next query.")
    next_budget: int = Field(
        description="Anchors the next default request will score: the schedule's ratio times "
        "min(default candidates, memories)."
    )
    next_budget_ratio: float
    scorer_calls: int = Field(description="Scorer calls made by recorded queries.")
    full_rerank_calls: int = Field(description="Calls full reranking would have made for them.")
    calls_saved: float | None = Field(description="1 − scorer_calls / full_rerank_calls.")
    estimated_share: float | None = Field(
        description="Share of returned memories whose score came from the completion model."
    )
    prequential_error: float | None = Field(
        description="Mean absolute error of the completion on anchors with history over the "
        "last 100 queries, each predicted before it was learned from (null: none yet)."
    )
    prequential_anchors: int = Field(description="Anchors that error is measured on.")
    last_refit_at: datetime | None


class ScorerHealthOut(BaseModel):
    """Health of the relevance scorer of the process that answered (not per namespace)."""

    name: str = Field(description="The scorer (`EARM_SCORER`): `local` or `openai`.")
    recent_calls: int = Field(
        description=f"Scorer calls in the health window: the last {WINDOW_CALLS}, none older "
        f"than {MAX_AGE_S:g} s."
    )
    recent_success_rate: float | None = Field(
        description="Share of those calls that returned a score (null: no recent calls)."
    )
    healthy: bool = Field(
        description=f"false once at least {MIN_CALLS} recent calls were made and fewer than "
        "half succeeded: retrieves answer degraded and learning stalls."
    )


class NamespaceReportOut(NamespaceStatsOut):
    scorer: ScorerHealthOut


class StatsListOut(BaseModel):
    namespaces: list[NamespaceStatsOut]
    scorer: ScorerHealthOut
