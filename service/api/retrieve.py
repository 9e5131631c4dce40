"""The bodies of ``POST /retrieve`` and ``POST /feedback``: what a retrieve is asked and answers,
and the scores a client gives back for a recorded query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from service.api.fields import (
    JSON_NUMBER,
    DatabaseId,
    Embedding,
    ExternalId,
    NamespaceName,
    NonEmptyText,
    Score,
    StrictModel,
)

#: How a retrieve ranks its candidates (docs/api.md "Policies").
Policy = Literal["earm", "semantic", "full", "observed"]
#: The order of the returned memories.
Order = Literal["chronological", "relevance"]
#: Where a returned score came from.
Source = Literal["observed", "estimated", "semantic"]


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
    policy: Policy = "earm"
    budget: Annotated[
        int | None,
        Field(ge=0, description="Anchors to score; overrides the schedule (earm/observed)."),
        JSON_NUMBER,
    ] = None
    seed: Annotated[int, JSON_NUMBER] = 0
    order: Order = "chronological"
    filters: dict[str, Any] | None = Field(
        default=None, description="Only memories whose metadata contains this JSON object."
    )


@dataclass(frozen=True)
class RetrievedMemory:
    id: int
    external_id: str | None
    text: str
    occurred_at: datetime | None
    metadata: dict[str, Any]
    score: float
    source: Source
    similarity: float
    rank: int


@dataclass(frozen=True)
class Timings:
    """Milliseconds per phase of one retrieve."""

    embed_ms: float
    search_ms: float
    score_ms: float
    complete_ms: float
    record_ms: float
    total_ms: float


@dataclass(frozen=True)
class RetrieveResult:
    # None when nothing was recorded: the namespace has no memories (or no candidate passed
    # the filters), so there was nothing to score or learn from.
    query_id: int | None
    query_index: int | None
    policy: str  # the request's Policy, documented as a plain string in the API
    stage: int
    budget: int
    budget_reason: str  # why the budget is what it is (the policy and what it read)
    scorer_calls: int
    # Candidates observed for earlier askings of this query (its family), taken from
    # experience instead of scored again.
    reused: int
    # Candidates ranked by an estimate that near-paraphrases' observations weighed on
    # (paraphrase transfer, earm; observed and reused candidates are not counted).
    paraphrased: int
    # The share of the anchors after the head that were drawn to explore: the share the
    # namespace has learned (EARM_ANCHOR_POLICY=learned), 1 for the paper's rule (all of its
    # second half explores); None where there was no choice of anchors (semantic, full, a
    # budget covering every candidate, or one the head fills).
    exploration_share: float | None
    # HTTP requests the scorer made for those calls, retries included (0 for the local
    # scorer; one per batch of documents for a reranker).
    scorer_requests: int
    # The scorer rounds the anchors went out in, one after the other: the score phase waits
    # about this many scorer latencies (0: nothing scored; 2 where round two ran).
    scorer_rounds: int
    degraded: bool
    memories: list[RetrievedMemory]
    timings: Timings
    # Left out of the JSON while the stop rule is off, so the response is what it was.
    stopped_anchors: Annotated[
        int | None,
        Field(
            exclude_if=lambda stopped: stopped is None,
            description="Anchors the budget allowed that were not scored because the "
            "posterior expected fewer than EARM_STOP_EXPECTED unscored candidates to enter "
            "the top k (round two skipped). Absent when EARM_STOP_EXPECTED is 0.",
        ),
    ] = None
    # Left out of the JSON without a deadline, so the response is what it was.
    late: Annotated[
        int | None,
        Field(
            exclude_if=lambda late: late is None,
            description="Anchors sent to the scorer whose scores missed the answer deadline "
            "(EARM_SCORE_DEADLINE_MS): ranked by their estimates here, recorded to the query "
            "once they land. Absent when no deadline is set.",
        ),
    ] = None


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
class FeedbackResult:
    """Scores recorded, and how many of them replaced an earlier observation of their pair
    (the scorer's, or earlier feedback: the latest feedback wins)."""

    recorded: int
    replaced: int
