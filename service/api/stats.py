"""The bodies of ``GET /stats``: one namespace's counts, budget, savings and completion quality,
or every namespace the API key may use, each with the scorer's health (also what ``/metrics``
reports as the ``earm_scorer_*`` gauges)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from pydantic import Field

#: Completion quality is measured over this many most recent queries of a namespace.
PREQUENTIAL_WINDOW = 100


@dataclass(frozen=True)
class NamespaceStats:
    """One namespace's counts, budget, savings and completion quality."""

    namespace: str
    memories: int
    memories_unindexed: Annotated[
        int,
        Field(
            description="Memories not in the HNSW index yet (the background indexer's backlog); "
            "searches find them by an exact scan meanwhile."
        ),
    ]
    queries: Annotated[int, Field(description="Queries recorded (the next query's index).")]
    observations: Annotated[
        int,
        Field(
            description="Observed cells the model learns from: scorer scores and feedback, "
            "without those retired by an edit of their memory."
        ),
    ]
    # The observed share of the experience matrix as it stands (current memories × recorded
    # queries).
    density: Annotated[
        float, Field(description="observations / (memories × queries); 0 while either is 0.")
    ]
    stage: Annotated[int, Field(description="Budget stage of the next query.")]
    next_budget: Annotated[
        int,
        Field(
            description="Anchors the next default request will score: the schedule's ratio times "
            "min(default candidates, memories)."
        ),
    ]
    next_budget_ratio: float
    scorer_calls: Annotated[int, Field(description="Scorer calls made by recorded queries.")]
    scorer_requests: Annotated[
        int, Field(description="HTTP requests the scorer made for them, retries included.")
    ]
    full_rerank_calls: Annotated[
        int, Field(description="Calls full reranking would have made for them.")
    ]
    reused_cells: Annotated[
        int,
        Field(
            description="Cells repeated queries took from the observations of their earlier "
            "askings instead of scoring them again."
        ),
    ]
    reuse_saved_calls: Annotated[
        int,
        Field(
            description="Scorer calls that saved: budget a repeated query did not spend because "
            "its family had observed the candidates already."
        ),
    ]
    # None before any query scored anything.
    calls_saved: Annotated[
        float | None, Field(description="1 − scorer_calls / full_rerank_calls.")
    ]
    estimated_share: Annotated[
        float | None,
        Field(description="Share of returned memories whose score came from the completion model."),
    ]
    # Each anchor predicted before it was folded in (leave-one-out).
    prequential_error: Annotated[
        float | None,
        Field(
            description="Mean absolute error of the completion on anchors with history over the "
            f"last {PREQUENTIAL_WINDOW} queries, each predicted before it was learned from "
            "(null: none yet)."
        ),
    ]
    prequential_anchors: Annotated[int, Field(description="Anchors that error is measured on.")]
    last_refit_at: datetime | None

#: The scorer's health is judged on at most this many most recent calls...
WINDOW_CALLS = 100
#: ...none older than this: a scorer not called for a while has no recent calls.
MAX_AGE_S = 300.0
#: Fewer recent calls than this are too few to call the scorer unhealthy.
MIN_CALLS = 10


@dataclass(frozen=True)
class ScorerHealthSnapshot:
    """Health of the relevance scorer of the process that answered (not per namespace)."""

    # What /stats (`scorer`) returns and /metrics (`earm_scorer_*` gauges) reports.
    name: Annotated[
        str,
        Field(description="The scorer (`EARM_SCORER`): `local`, `openai`, `rerank` or `tei`."),
    ]
    recent_calls: Annotated[
        int,
        Field(
            description=f"Scorer calls in the health window: the last {WINDOW_CALLS}, none older "
            f"than {MAX_AGE_S:g} s."
        ),
    ]
    recent_success_rate: Annotated[
        float | None,
        Field(description="Share of those calls that returned a score (null: no recent calls)."),
    ]
    healthy: Annotated[
        bool,
        Field(
            description=f"false once at least {MIN_CALLS} recent calls were made and fewer than "
            "half succeeded: retrieves answer degraded and learning stalls."
        ),
    ]


@dataclass(frozen=True)
class NamespaceReportOut(NamespaceStats):
    """One namespace's stats and the scorer's health."""

    scorer: ScorerHealthSnapshot


@dataclass(frozen=True)
class StatsListOut:
    """The stats of every namespace the API key may use, and the scorer's health."""

    namespaces: list[NamespaceStats]
    scorer: ScorerHealthSnapshot
