"""Python clients of the earm HTTP API: :class:`EarmClient` (sync) and :class:`AsyncEarmClient`.

Results are the API's own response types (the wire contract, :mod:`service.api`, read back by
pydantic), so they cannot drift from the service; the client imports nothing else of it::

    from service.client import EarmClient

    with EarmClient("http://127.0.0.1:8000", api_key="earm_...") as earm:
        earm.add("agent-42", [
            "Caroline went to a support group on 7 May.",
            {"text": "Melanie is planning a camping trip.", "external_id": "D1:7"},
        ])
        result = earm.retrieve("agent-42", "What did Caroline do on 7 May?", k=5)
        for memory in result.memories:
            print(memory.rank, memory.score, memory.source, memory.text)
        earm.feedback("agent-42", result.query_id, {result.memories[0].id: 1.0})
        print(earm.stats("agent-42").calls_saved)
        for candidate in earm.trace(result.query_id).candidates:   # why was it returned?
            print(candidate.rank, candidate.source, candidate.estimate, candidate.origin)

Any non-2xx answer raises :class:`EarmAPIError` with the API's stable error ``code``; transport
failures (connection refused, timeouts) raise httpx's exceptions unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter

from service.api.memories import (
    IngestResult,
    MemoryPage,
    OnConflict,
    StoredMemory,
    UpdatedMemory,
)
from service.api.namespaces import ErasedNamespace
from service.api.queries import QueryTraceResult, TracedCandidate
from service.api.rerank import CohereRerankOut
from service.api.retrieve import FeedbackResult, RetrieveResult
from service.api.stats import NamespaceReportOut, NamespaceStats, StatsListOut

__all__ = [
    "AsyncEarmClient",
    "CohereRerankOut",
    "EarmAPIError",
    "EarmClient",
    "ErasedNamespace",
    "FeedbackResult",
    "IngestResult",
    "Memory",
    "MemoryPage",
    "NamespaceReportOut",
    "NamespaceStats",
    "QueryTrace",
    "RetrieveResult",
    "StatsListOut",
    "TracedCandidate",
    "UpdatedMemory",
]

Memory = StoredMemory
QueryTrace = QueryTraceResult

#: A memory to add: its text, or the fields of ``POST /memories`` (text, embedding,
#: external_id, occurred_at, metadata).
MemoryInput = str | Mapping[str, Any]
#: Feedback scores: ``{memory: score}`` or ``[(memory, score), ...]``, each memory named by its
#: id (an int) or by the external_id it was stored under (a str).
ScoresInput = (
    Mapping[int, float]
    | Mapping[str, float]
    | Mapping[int | str, float]
    | Iterable[tuple[int | str, float]]
)

DEFAULT_TIMEOUT_S = 30.0

Result = TypeVar("Result")


class EarmAPIError(Exception):
    """The service answered with an error: HTTP ``status`` and the API's ``code`` (e.g.
    ``not_found``, ``validation_error``, ``limit_exceeded``, ``unauthenticated``)."""

    def __init__(self, status: int, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.code}: {self.message}"


def _error(response: httpx.Response) -> EarmAPIError:
    try:
        body = response.json()["error"]
        code, message = str(body["code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:500] or response.reason_phrase
    return EarmAPIError(response.status_code, code, message, response.headers.get("x-request-id"))


def _checked(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    raise _error(response)


def _memory_body(memory: MemoryInput) -> dict[str, Any]:
    if isinstance(memory, str):
        return {"text": memory}
    body = dict(memory)
    if "occurred_at" in body and hasattr(body["occurred_at"], "isoformat"):
        body["occurred_at"] = body["occurred_at"].isoformat()
    return body


def _scores_body(scores: ScoresInput) -> list[dict[str, Any]]:
    pairs = scores.items() if isinstance(scores, Mapping) else scores
    return [
        {"external_id": memory, "score": float(score)}
        if isinstance(memory, str)
        else {"memory_id": int(memory), "score": float(score)}
        for memory, score in pairs
    ]


def _retrieve_body(namespace: str, query: str, options: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"namespace": namespace, "query": query}
    for name, value in options.items():
        if value is None:
            continue
        if name == "query_embedding":
            value = [float(x) for x in value]  # numpy arrays too
        body[name] = value
    return body


def _rerank_body(
    namespace: str, query: str, documents: Sequence[str], top_n: int | None
) -> dict[str, Any]:
    # The model names the namespace: the one form every rerank client can send.
    return {"model": f"earm/{namespace}", "query": query, "documents": [*documents], "top_n": top_n}


def _ingest_body(
    namespace: str, memories: Sequence[MemoryInput], on_conflict: OnConflict
) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "memories": [_memory_body(m) for m in memories],
        "on_conflict": on_conflict,
    }


def _patch_body(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The PATCH body: only the fields given (``occurred_at=None`` clears it)."""
    body = dict(changes)
    if body.get("occurred_at") is not None and hasattr(body["occurred_at"], "isoformat"):
        body["occurred_at"] = body["occurred_at"].isoformat()
    if body.get("embedding") is not None:
        body["embedding"] = [float(x) for x in body["embedding"]]  # numpy arrays too
    return body


def _stats_params(namespace: str | None) -> dict[str, str] | None:
    return {"namespace": namespace} if namespace is not None else None


def _list_params(
    namespace: str, limit: int, cursor: str | None, external_id: str | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"namespace": namespace, "limit": limit}
    if cursor is not None:
        params["cursor"] = cursor
    if external_id is not None:
        params["external_id"] = external_id
    return params


#: A TypeAdapter compiles its validator once; the result types are a fixed few.
_adapters: dict[type[Any], TypeAdapter[Any]] = {}


def _result(result_type: type[Result], payload: Any) -> Result:
    adapter = _adapters.get(result_type)
    if adapter is None:
        adapter = _adapters[result_type] = TypeAdapter(result_type)
    validated: Result = adapter.validate_python(payload)
    return validated


def _stats_result(payload: Any) -> NamespaceReportOut | StatsListOut:
    if "namespaces" in payload:
        return _result(StatsListOut, payload)
    return _result(NamespaceReportOut, payload)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class EarmClient:
    """Synchronous client over one ``httpx.Client`` (connection pooling); a context manager.

    ``base_url`` e.g. ``http://127.0.0.1:8000``; ``api_key`` is sent as a bearer token;
    ``timeout`` in seconds applies to every request (a full-budget ``/retrieve`` with an LLM
    scorer can take seconds).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(
            base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return _checked(self._http.request(method, path, **kwargs))

    def _parse(self, result_type: type[Result], method: str, path: str, **kwargs: Any) -> Result:
        return _result(result_type, self._call(method, path, **kwargs).json())

    def add(
        self, namespace: str, memories: Sequence[MemoryInput], on_conflict: OnConflict = "keep"
    ) -> IngestResult:
        """``POST /memories``: ids in input order; idempotent on ``external_id`` (``keep``), or
        ``on_conflict="update"`` to update stored external ids to the new content."""
        body = _ingest_body(namespace, memories, on_conflict)
        return self._parse(IngestResult, "POST", "/memories", json=body)

    def patch_memory(self, memory_id: int, **changes: Any) -> UpdatedMemory:
        """``PATCH /memories/{id}``: changes among text, embedding, metadata, occurred_at."""
        return self._parse(
            UpdatedMemory, "PATCH", f"/memories/{int(memory_id)}", json=_patch_body(changes)
        )

    def delete_namespace(self, namespace: str) -> ErasedNamespace:
        """``DELETE /namespaces/{namespace}``: erase everything of it; what was deleted."""
        return self._parse(ErasedNamespace, "DELETE", f"/namespaces/{namespace}")

    def retrieve(self, namespace: str, query: str, **options: Any) -> RetrieveResult:
        """``POST /retrieve``; options: k, candidates, policy, budget, seed, order, filters,
        query_embedding."""
        return self._parse(
            RetrieveResult, "POST", "/retrieve", json=_retrieve_body(namespace, query, options)
        )

    def rerank(
        self, namespace: str, query: str, documents: Sequence[str], top_n: int | None = None
    ) -> CohereRerankOut:
        """``POST /v1/rerank``: results best first; ``meta.earm`` has the query and memories."""
        body = _rerank_body(namespace, query, documents, top_n)
        return self._parse(CohereRerankOut, "POST", "/v1/rerank", json=body)

    def feedback(self, namespace: str, query_id: int, scores: ScoresInput) -> FeedbackResult:
        """``POST /feedback``: scores in [0, 1] for memories of a past query (by id or
        external_id); each replaces the pair's earlier observation."""
        body = {"namespace": namespace, "query_id": query_id, "scores": _scores_body(scores)}
        return self._parse(FeedbackResult, "POST", "/feedback", json=body)

    def stats(self, namespace: str | None = None) -> NamespaceReportOut | StatsListOut:
        """``GET /stats``: one namespace's stats, or (no namespace) those of every visible one
        (``.namespaces``); both with the answering process's scorer health (``.scorer``)."""
        return _stats_result(self._call("GET", "/stats", params=_stats_params(namespace)).json())

    def trace(self, query_id: int) -> QueryTrace:
        """``GET /queries/{id}``: what one retrieve did, every candidate with its similarity,
        anchor or not, observed score and origin, estimate, final score, source and rank."""
        return self._parse(QueryTrace, "GET", f"/queries/{int(query_id)}")

    def get(self, memory_id: int) -> Memory:
        return self._parse(Memory, "GET", f"/memories/{int(memory_id)}")

    def list(
        self,
        namespace: str,
        limit: int = 100,
        cursor: str | None = None,
        external_id: str | None = None,
    ) -> MemoryPage:
        """One page of a namespace's memories by id; pass ``page.next_cursor`` for the next.
        With ``external_id``: the memory stored under it, if any."""
        params = _list_params(namespace, limit, cursor, external_id)
        return self._parse(MemoryPage, "GET", "/memories", params=params)

    def delete(self, memory_id: int) -> None:
        self._call("DELETE", f"/memories/{int(memory_id)}")

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> EarmClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncEarmClient:
    """The same API over one ``httpx.AsyncClient``; an async context manager."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=_headers(api_key), timeout=timeout
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return _checked(await self._http.request(method, path, **kwargs))

    async def _parse(
        self, result_type: type[Result], method: str, path: str, **kwargs: Any
    ) -> Result:
        return _result(result_type, (await self._call(method, path, **kwargs)).json())

    async def add(
        self, namespace: str, memories: Sequence[MemoryInput], on_conflict: OnConflict = "keep"
    ) -> IngestResult:
        body = _ingest_body(namespace, memories, on_conflict)
        return await self._parse(IngestResult, "POST", "/memories", json=body)

    async def patch_memory(self, memory_id: int, **changes: Any) -> UpdatedMemory:
        return await self._parse(
            UpdatedMemory, "PATCH", f"/memories/{int(memory_id)}", json=_patch_body(changes)
        )

    async def delete_namespace(self, namespace: str) -> ErasedNamespace:
        return await self._parse(ErasedNamespace, "DELETE", f"/namespaces/{namespace}")

    async def retrieve(self, namespace: str, query: str, **options: Any) -> RetrieveResult:
        return await self._parse(
            RetrieveResult, "POST", "/retrieve", json=_retrieve_body(namespace, query, options)
        )

    async def rerank(
        self, namespace: str, query: str, documents: Sequence[str], top_n: int | None = None
    ) -> CohereRerankOut:
        body = _rerank_body(namespace, query, documents, top_n)
        return await self._parse(CohereRerankOut, "POST", "/v1/rerank", json=body)

    async def feedback(self, namespace: str, query_id: int, scores: ScoresInput) -> FeedbackResult:
        body = {"namespace": namespace, "query_id": query_id, "scores": _scores_body(scores)}
        return await self._parse(FeedbackResult, "POST", "/feedback", json=body)

    async def stats(self, namespace: str | None = None) -> NamespaceReportOut | StatsListOut:
        params = _stats_params(namespace)
        return _stats_result((await self._call("GET", "/stats", params=params)).json())

    async def trace(self, query_id: int) -> QueryTrace:
        return await self._parse(QueryTrace, "GET", f"/queries/{int(query_id)}")

    async def get(self, memory_id: int) -> Memory:
        return await self._parse(Memory, "GET", f"/memories/{int(memory_id)}")

    async def list(
        self,
        namespace: str,
        limit: int = 100,
        cursor: str | None = None,
        external_id: str | None = None,
    ) -> MemoryPage:
        params = _list_params(namespace, limit, cursor, external_id)
        return await self._parse(MemoryPage, "GET", "/memories", params=params)

    async def delete(self, memory_id: int) -> None:
        await self._call("DELETE", f"/memories/{int(memory_id)}")

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncEarmClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
