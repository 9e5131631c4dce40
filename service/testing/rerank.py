"""The stand-in of a ``/rerank`` endpoint, and the protocol's request and response shapes (which
the benchmarks' lean rerank backend speaks too)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request

from service.testing.stand_in import BadRequest, answer_post, maybe_await, openai_app

#: (query, documents) -> one raw score per document, ``None`` to leave that document out.
RerankFn = Callable[[str, list[str]], "list[float | None] | Awaitable[list[float | None]]"]

#: Where the rerank stand-ins answer (providers put it under a version prefix or not).
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


def rerank_app(
    rerank: RerankFn, protocol: str = "rerank", model: str = "loopback-reranker"
) -> FastAPI:
    """A ``POST /rerank`` (also at ``/v1/rerank`` and ``/v2/rerank``) whose scores come from
    ``rerank``.

    ``protocol="rerank"`` speaks the shape Cohere v2, Jina, vLLM, llama.cpp and Infinity share
    (``{"model", "query", "documents", "top_n"}`` answered by ``{"results": [{"index",
    "relevance_score", "document"}]}``); ``protocol="tei"`` speaks text-embeddings-inference's
    (``{"query", "texts", "raw_scores"}`` answered by ``[{"index", "score"}]``). Like the real
    servers, results come sorted by descending score, so clients must map them by ``index``;
    ``top_n`` cuts the list. ``rerank`` may be a coroutine function, may raise
    :class:`~service.testing.HTTPFault`, and returns ``None`` for a document the server should
    leave out. Counters on ``app.state`` as in :func:`~service.testing.chat_completions_app`.
    """
    if protocol not in ("rerank", "tei"):
        raise ValueError(f"unknown rerank protocol {protocol!r}")
    app = openai_app(f"loopback {protocol}", model)

    async def answer(body: Any) -> Any:
        query, documents = rerank_request(body, protocol)
        scores = await maybe_await(rerank(query, documents))
        return rerank_response(body, documents, scores, protocol, model)

    for path in RERANK_PATHS:

        async def endpoint(request: Request) -> Any:
            return await answer_post(app, request, answer)

        app.post(path)(endpoint)

    return app


def rerank_request(body: Any, protocol: str) -> tuple[str, list[str]]:
    """The query and documents of a rerank request body of ``protocol`` (see
    :func:`rerank_app`); a :class:`ValueError` saying what is wrong if it has none."""
    documents_key = "texts" if protocol == "tei" else "documents"
    query = body.get("query") if isinstance(body, dict) else None
    documents = body.get(documents_key) if isinstance(body, dict) else None
    if not isinstance(query, str):
        raise BadRequest("'query' must be a string")
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise BadRequest(f"'{documents_key}' must be a list of strings")
    return query, list(documents)


def rerank_response(
    body: Any, documents: list[str], scores: list[float | None], protocol: str, model: str
) -> Any:
    """The answer of ``protocol`` to the rerank request ``body``, giving ``documents`` their
    ``scores`` (``None``: left out), sorted by descending score and cut to ``top_n``."""
    ranked = sorted(
        ((i, float(s)) for i, s in enumerate(scores) if s is not None), key=lambda r: -r[1]
    )
    if protocol == "tei":
        return [{"index": i, "score": s} for i, s in ranked]
    top_n = body.get("top_n")
    if isinstance(top_n, int):
        ranked = ranked[:top_n]
    return {
        "id": "rerank-loopback",
        "model": body.get("model") or model,
        "results": [
            {"index": i, "relevance_score": s, "document": {"text": documents[i]}}
            for i, s in ranked
        ],
        "usage": {"total_tokens": sum(len(d.split()) for d in documents)},
    }
