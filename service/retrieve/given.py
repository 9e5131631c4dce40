"""Reranking documents the caller gives (the rerank protocol, docs/api.md "Rerank protocol"):
each document is a memory of the namespace, found or stored by its text
(:mod:`service.ingest.documents`), and the documents, in the caller's order, are the candidates
of one retrieve through the whole pipeline (budget, anchors, a family's reuse, paraphrase
evidence, completion, the record). No HTTP here."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from service.api.retrieve import RetrievedMemory, RetrieveResult
from service.errors import EmbedderUnavailable, EmbeddingRequired, InvalidInput, LimitExceeded
from service.ingest.documents import document_ids
from service.ingest.retention import sighting_refresh_s
from service.retrieve.pipeline import RetrievalPipeline
from service.retrieve.request import RetrieveRequest
from service.retrieve.rerank import ESTIMATED


@dataclass(frozen=True)
class RerankRequest:
    namespace: str
    query: str
    documents: Sequence[str]  # the caller's order: its own first stage's ranking
    top_n: int | None = None  # how many of the answer the caller reads (None: all)


@dataclass(frozen=True)
class RerankedDocument:
    index: int  # the document's position in the request
    memory_id: int | None  # None: the call degraded before the document was stored
    relevance: float  # in [0, 1], never above the relevance of the document ranked before it


@dataclass(frozen=True)
class RerankResult:
    namespace: str
    query_id: int | None  # None: nothing was recorded (degraded before the retrieve)
    budget: int
    scorer_calls: int
    reused: int
    estimated: int  # documents ranked by the completion model's estimate, not a score
    degraded: bool
    documents: list[RerankedDocument]  # every index, best first
    stored: int  # memories created for documents not seen before
    timings: dict[str, float]
    # The retrieve the documents went through (None: degraded before it), for the metrics.
    retrieve: RetrieveResult | None


class RepeatedCalls:
    """The answers of recent rerank calls, so that a call identical to one answered within
    ``window_s`` (same namespace, query, documents in the same order, and ``top_n``) gets the
    same answer with nothing sent upstream and nothing recorded: for a reranker's caller an
    identical call is a cache hit, while a retrieve re-asked, or a call with other documents,
    explores further (its family's cells are reused, the budget goes to unobserved ones).

    In-process and bounded (the least recently answered calls go first): each replica keeps
    its own, so behind a load balancer a repeat may reach a replica that has not seen it and
    explore as a re-ask. A degraded answer is never kept. Written here, not taken from a
    library, because the core has no cache library and this is an ordered dict with a clock.
    """

    def __init__(
        self, window_s: float, capacity: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.capacity = capacity
        self._clock = clock
        self._answers: OrderedDict[bytes, tuple[float, RerankResult]] = OrderedDict()

    @staticmethod
    def _key(request: RerankRequest) -> bytes:
        digest = hashlib.sha256()
        for part in (request.namespace, request.query, str(request.top_n), *request.documents):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part.encode())
        return digest.digest()

    def answer(self, request: RerankRequest) -> RerankResult | None:
        """The earlier answer to this very call, as a repeat (no scorer calls, nothing stored),
        if one was kept within the window."""
        key = self._key(request)
        kept = self._answers.get(key)
        if kept is None:
            return None
        answered_at, result = kept
        if self._clock() - answered_at > self.window_s:
            del self._answers[key]
            return None
        # Every cell the earlier answer observed is taken from experience now.
        return replace(result, budget=0, scorer_calls=0, reused=result.scorer_calls + result.reused,
                       stored=0, retrieve=None, timings={})

    def remember(self, request: RerankRequest, result: RerankResult) -> None:
        if self.window_s <= 0 or result.degraded or result.query_id is None:
            return
        key = self._key(request)
        self._answers[key] = (self._clock(), result)
        self._answers.move_to_end(key)
        while len(self._answers) > self.capacity:
            self._answers.popitem(last=False)

    def forget_namespace(self, namespace: str) -> None:
        """Drop every answer of ``namespace`` (it was erased: its answers name queries and
        memories that are gone)."""
        for key in [k for k, (_, r) in self._answers.items() if r.namespace == namespace]:
            del self._answers[key]


async def rerank_documents(
    pipeline: RetrievalPipeline, request: RerankRequest, repeats: RepeatedCalls | None = None
) -> RerankResult:
    """Every document of ``request`` ranked, with a relevance in [0, 1]. Refused before anything
    is stored when a limit is exceeded or no embedder is configured; an embedder that fails
    degrades the answer to the caller's order (nothing recorded), as a failing scorer degrades
    a retrieve. With ``repeats``, a call identical to a recent one is answered as it was."""
    _check(pipeline, request)
    start = time.perf_counter()
    if repeats is not None and (repeated := repeats.answer(request)) is not None:
        return replace(repeated, timings={"total_ms": _ms_since(start)})
    try:
        documents = await document_ids(
            pipeline.writes,
            pipeline.embedder,
            request.namespace,
            request.documents,
            sighting_refresh_s(pipeline.retrieval.document_ttl_s),
        )
        documents_ms = _ms_since(start)
        ids = [documents.ids[text] for text in request.documents]
        result = await pipeline.retrieve(
            RetrieveRequest(
                namespace=request.namespace,
                query=request.query,
                k=len(set(ids)),
                order="relevance",
                given=tuple(dict.fromkeys(ids)),
                top_n=request.top_n,
            )
        )
    except EmbedderUnavailable:
        return _in_caller_order(request, _ms_since(start))
    timings = {"documents_ms": documents_ms} | asdict(result.timings)
    timings["total_ms"] = _ms_since(start)
    ranked = _ranked(ids, result.memories)
    answer = RerankResult(
        namespace=request.namespace,
        query_id=result.query_id,
        budget=result.budget,
        scorer_calls=result.scorer_calls,
        reused=result.reused,
        estimated=sum(1 for _, source in ranked if source == ESTIMATED),
        degraded=result.degraded,
        documents=[document for document, _ in ranked],
        stored=documents.stored,
        timings=timings,
        retrieve=result,
    )
    if repeats is not None:
        repeats.remember(request, answer)
    return answer


def _check(pipeline: RetrievalPipeline, request: RerankRequest) -> None:
    limits = pipeline.limits
    if pipeline.embedder is None:
        raise EmbeddingRequired(
            "the rerank protocol stores each new document as a memory with its embedding, and "
            "this deployment has no embedder (EARM_EMBEDDER=none): configure one "
            "(EARM_EMBEDDER=local or openai)"
        )
    if not request.documents:
        raise InvalidInput("no documents to rerank")
    if len(request.documents) > limits.max_candidates:
        raise LimitExceeded(
            f"{len(request.documents)} documents; the limit is "
            f"EARM_MAX_CANDIDATES={limits.max_candidates}"
        )
    for index, text in enumerate(request.documents):
        if len(text) > limits.max_text_chars:
            raise LimitExceeded(
                f"documents[{index}] has {len(text)} characters; the limit is "
                f"EARM_MAX_TEXT_CHARS={limits.max_text_chars}"
            )
    if len(request.query) > limits.max_text_chars:
        raise LimitExceeded(
            f"query has {len(request.query)} characters; the limit is "
            f"EARM_MAX_TEXT_CHARS={limits.max_text_chars}"
        )


def _ranked(
    ids: Sequence[int], memories: Sequence[RetrievedMemory]
) -> list[tuple[RerankedDocument, str | None]]:
    """Every index of the request, best first, with the source of its score: a memory's
    indexes (a repeated text) together, in request order. The relevance is the score capped
    by the one ranked before it: under the anchor rule an unscored candidate below the scored
    ones may be estimated above a low observed score, and rerank clients read the list as
    sorted. A document the retrieve did not answer (deleted, or its namespace erased, while the
    call ran) comes last, at 0."""
    indexes: dict[int, list[int]] = {}
    for index, memory_id in enumerate(ids):
        indexes.setdefault(memory_id, []).append(index)
    ranked: list[tuple[RerankedDocument, str | None]] = []
    ceiling = 1.0
    for memory in memories:
        ceiling = min(ceiling, max(0.0, memory.score))
        for index in indexes.pop(memory.id, []):
            ranked.append((RerankedDocument(index, memory.id, ceiling), memory.source))
    for index in sorted(i for rest in indexes.values() for i in rest):
        ranked.append((RerankedDocument(index, ids[index], 0.0), None))
    return ranked


def _in_caller_order(request: RerankRequest, total_ms: float) -> RerankResult:
    """The answer when the embedder failed: the caller's own ranking, relevance falling from 1
    by position, nothing stored or recorded."""
    n = len(request.documents)
    return RerankResult(
        namespace=request.namespace,
        query_id=None,
        budget=0,
        scorer_calls=0,
        reused=0,
        estimated=0,
        degraded=True,
        documents=[RerankedDocument(i, None, (n - i) / n) for i in range(n)],
        stored=0,
        timings={"total_ms": total_ms},
        retrieve=None,
    )


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)
