"""The body of ``GET /queries/{query_id}``: the trace of one recorded retrieve, every candidate
as it was ranked (the dashboard's query page shows the same)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from pydantic import Field


@dataclass(frozen=True)
class TracedCandidate:
    """One candidate of a retrieve, as it was ranked."""

    rank: Annotated[int, Field(description="1 = best; the first `returned` were returned.")]
    memory_id: int
    external_id: str | None
    text: Annotated[str | None, Field(description="The memory's text now (null: deleted).")]
    similarity: Annotated[float, Field(description="Cosine similarity to the query.")]
    anchor: Annotated[bool, Field(description="Sampled for the scorer (the query's budget).")]
    anchor_reason: Annotated[
        str | None,
        Field(
            description="Why an anchor was scored: head (among the most similar), estimate (the "
            "completion estimated it highest after the head was scored), explore (drawn at "
            "random from the rest); null for the other candidates and for queries recorded "
            "by a version that did not keep it."
        ),
    ]
    returned: bool
    observed_score: Annotated[
        float | None,
        Field(description="The pair's observed score (its current value: feedback replaces it)."),
    ]
    origin: Annotated[
        str | None,
        Field(description="Where the observation came from: scorer, feedback, reused (null: none)"),
    ]
    estimate: Annotated[
        float,
        Field(
            description="The policy's estimate when the query ranked (earm: the completion model "
            "with this query folded in); an unobserved candidate was ranked by it."
        ),
    ]
    score: Annotated[float, Field(description="The final score it was ranked by.")]
    source: Annotated[
        str, Field(description="observed | estimated | semantic, as returned.")
    ]


@dataclass(frozen=True)
class QueryTraceResult:
    """What one retrieve did: enough to answer "why was this returned, and what did it cost"."""

    query_id: int
    namespace: str
    query_index: int
    text: str
    policy: str
    stage: Annotated[int | None, Field(
        description="Budget stage (null: recorded by a version that kept no trace)."
    )]
    budget: int
    scorer_calls: int
    candidate_count: Annotated[int, Field(description="Semantic candidates (N).")]
    returned: int
    created_at: datetime
    timings: Annotated[
        dict[str, float] | None,
        Field(
            description="Milliseconds per phase up to recording (embed, search, score, "
            "complete); the record phase ends after the row is written, so it is not kept."
        ),
    ]
    prequential_error: float | None
    exploration_share: Annotated[
        float | None,
        Field(
            description="The share of the anchors after the head that were drawn to explore "
            "(null: there was no choice of anchors, or recorded by a version that did not "
            "keep it)."
        ),
    ]
    scorer_rounds: Annotated[
        int | None,
        Field(
            description="The scorer rounds the anchors went out in, one after the other, as "
            "the retrieve response's scorer_rounds (null: recorded by a version that did not "
            "keep it)."
        ),
    ]
    candidates: Annotated[
        list[TracedCandidate],
        Field(
            description="Every candidate, best first (empty for queries recorded with "
            "EARM_QUERY_TRACES=false or by a version that kept no trace)."
        ),
    ]
