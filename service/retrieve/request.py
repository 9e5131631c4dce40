"""What a retrieve is asked and what it answers: the pipeline's request and result, which are
also the API's request options and response body (service.http serves the result as it is)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from service.retrieve.rerank import Policy, Source

Order = Literal["chronological", "relevance"]


@dataclass(frozen=True)
class RetrieveRequest:
    namespace: str
    query: str
    query_embedding: Sequence[float] | None = None
    k: int = 10
    # Semantic candidates (N); None: the deployment's EARM_DEFAULT_CANDIDATES.
    candidates: int | None = None
    policy: Policy = "earm"
    budget: int | None = None
    seed: int = 0
    order: Order = "chronological"
    filters: dict[str, Any] | None = None
    # Memories of the namespace that are the candidates, the first the most relevant by the
    # caller's own first stage, instead of a semantic search (the rerank protocol); their
    # order is the semantic ranking the budget and the anchors work from.
    given: tuple[int, ...] | None = None
    # How many of the ranking the caller reads when fewer than k: the rerank protocol ranks
    # every document, its caller reads the top_n it asked for (the stop rule's k).
    top_n: int | None = None

    @property
    def read(self) -> int:
        """How many of the ranking the caller reads: the top the stop rule protects."""
        return self.k if self.top_n is None else min(self.top_n, self.k)

    def semantic_candidates(self, default: int) -> int:
        """The semantic candidates (N) asked for; ``default``: the deployment's."""
        if self.given is not None:
            return len(self.given)
        return default if self.candidates is None else self.candidates


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
