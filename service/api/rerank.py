"""Request and response bodies of the rerank protocol (docs/api.md "Rerank protocol"): the shape
Cohere v2, Jina and vLLM share at ``/v1/rerank`` and ``/v2/rerank``, and at ``/rerank`` that
shape or text-embeddings-inference's, told apart by the body (``documents`` or ``texts``).

The fields the protocols define that earm has no use for (a token cut, relevant spans,
truncation) are accepted and ignored, so their clients work unchanged; anything else is refused
as on every route."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, StrictBool, Tag

from service.api.fields import JSON_NUMBER, NonEmptyText, StrictModel

TopN = Annotated[
    int | None, Field(ge=1, description="Results to return, best first (default: all)."),
    JSON_NUMBER,
]


class RerankDocumentIn(StrictModel):
    text: NonEmptyText


class CohereRerankIn(StrictModel):
    model: str | None = Field(
        default=None,
        description="`earm/<namespace>` names the namespace that learns from the call; any "
        "other model needs the X-Earm-Namespace header or EARM_RERANK_NAMESPACE.",
        examples=["earm/agent-42"],
    )
    query: NonEmptyText
    documents: Annotated[list[NonEmptyText | RerankDocumentIn], Field(min_length=1)]
    top_n: TopN = None
    return_documents: StrictBool = False
    # Accepted and ignored: the upstream reranker and its limits are earm's configuration.
    max_tokens_per_doc: Annotated[int | None, Field(ge=1), JSON_NUMBER] = None
    # Cohere v1's name for it: the cohere SDK's v1 Client (Mem0's reranker) always sends it.
    max_chunks_per_doc: Annotated[int | None, Field(ge=1), JSON_NUMBER] = None
    relevant_spans: dict[str, Any] | None = None
    priority: Annotated[int | None, JSON_NUMBER] = None

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class TeiRerankIn(StrictModel):
    query: NonEmptyText
    texts: Annotated[list[NonEmptyText], Field(min_length=1)]
    raw_scores: StrictBool = Field(
        default=False,
        description="Accepted for TEI's clients: earm's relevance is already a score in [0, 1] "
        "(no logit behind it), so the scores are the same either way.",
    )
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Literal["left", "right", "Left", "Right"] | None = None


def _protocol(body: Any) -> str:
    return "tei" if isinstance(body, dict) and "texts" in body else "cohere"


#: The body of ``POST /rerank``: text-embeddings-inference's if it has ``texts``, else Cohere's.
AnyRerankIn = Annotated[
    Annotated[CohereRerankIn, Tag("cohere")] | Annotated[TeiRerankIn, Tag("tei")],
    Discriminator(_protocol),
]


class EarmRerankOut(BaseModel):
    """What earm did for the call: the query it recorded (``/feedback`` and ``GET
    /queries/{id}`` take it), what it cost, and each result's memory."""

    namespace: str
    query_id: int | None = Field(description="null: nothing was recorded (degraded).")
    budget: int
    scorer_calls: int = Field(description="Documents sent to the upstream reranker.")
    reused: int = Field(description="Documents an earlier asking of the query had scored.")
    estimated: int = Field(description="Results ranked by the completion model's estimate.")
    degraded: bool
    memory_ids: list[int | None] = Field(description="The memory of each result, in order.")
    timings: dict[str, float]


class RerankResultDocumentOut(BaseModel):
    text: str


class RerankResultOut(BaseModel):
    index: int
    relevance_score: float
    document: RerankResultDocumentOut | None = None  # only with return_documents


class RerankApiVersionOut(BaseModel):
    version: str


class RerankMetaOut(BaseModel):
    api_version: RerankApiVersionOut
    earm: EarmRerankOut


class CohereRerankOut(BaseModel):
    id: str
    model: str | None
    results: list[RerankResultOut]
    meta: RerankMetaOut


class TeiRankOut(BaseModel):
    index: int
    score: float
    text: str | None = None  # only with return_text
