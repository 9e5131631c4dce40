"""What the LangChain, LangGraph and LlamaIndex integrations share: their clients of one earm
service, and how a retrieved or reranked memory is described to a framework."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from service.client import (
    DEFAULT_TIMEOUT_S,
    AsyncEarmClient,
    CohereRerankOut,
    EarmClient,
    RetrieveResult,
)

DEFAULT_URL = "http://127.0.0.1:8000"
#: Metadata keys that are earm's bookkeeping rather than context for a language model.
BOOKKEEPING_KEYS = (
    "id",
    "external_id",
    "namespace",
    "score",
    "source",
    "similarity",
    "rank",
    "query_id",
)


class EarmClients:
    """The clients of one earm service: an :class:`EarmClient` made on first use and kept (its
    connection pool serves every thread), and an :class:`AsyncEarmClient` per event loop (an
    httpx async pool belongs to the loop it was made in; ``asyncio.run`` makes a new one)."""

    def __init__(self, url: str, api_key: str | None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sync: EarmClient | None = None
        self._async: tuple[asyncio.AbstractEventLoop, AsyncEarmClient] | None = None

    def sync(self) -> EarmClient:
        with self._lock:
            if self._sync is None:
                self._sync = EarmClient(self.url, self.api_key, self.timeout)
            return self._sync

    def for_running_loop(self) -> AsyncEarmClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._async is None or self._async[0] is not loop:
                self._async = (loop, AsyncEarmClient(self.url, self.api_key, self.timeout))
            return self._async[1]


def retrieved(result: RetrieveResult, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(text, metadata) of each memory of a ``/retrieve`` result: earm's fields flat (times in
    ISO 8601), the memory's own metadata under ``metadata``."""
    return [
        (
            memory.text,
            {
                "id": memory.id,
                "external_id": memory.external_id,
                "namespace": namespace,
                "score": memory.score,
                "source": memory.source,
                "similarity": memory.similarity,
                "rank": memory.rank,
                "occurred_at": memory.occurred_at.isoformat() if memory.occurred_at else None,
                "query_id": result.query_id,
                "metadata": memory.metadata,
            },
        )
        for memory in result.memories
    ]


#: Metadata keys a reranker adapter adds to a document: earm's bookkeeping, for ``/feedback``.
RERANK_KEYS = ("relevance_score", "query_id", "memory_id")


def reranked(answer: CohereRerankOut) -> list[tuple[int, dict[str, Any]]]:
    """(index of the caller's document, the metadata earm adds to it) of each result of a
    ``/v1/rerank`` answer, best first."""
    earm = answer.meta.earm
    return [
        (
            result.index,
            {
                "relevance_score": result.relevance_score,
                "query_id": earm.query_id,
                "memory_id": memory_id,
            },
        )
        for result, memory_id in zip(answer.results, earm.memory_ids, strict=True)
    ]
