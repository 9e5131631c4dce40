"""What a retrieve is asked: the pipeline's request. What it answers is the API's response body
(``service.api.retrieve``: ``RetrieveResult``, ``RetrievedMemory``, ``Timings``), which the
pipeline builds as it is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.api.retrieve import Order, Policy


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
