"""The spans of earm's operations as the OpenTelemetry GenAI conventions name them: memory
operations (``gen_ai.memory.client``: ingest, search, update, delete, erase of a store, a
namespace being the store) and the rerank protocol (``gen_ai.rerank.client``). Each is a
CLIENT span under the request's server span, with ``earm.*`` attributes for what earm did;
the records' content, the query text and the scores only with ``EARM_TRACE_CONTENT``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

from service.api.memories import IngestResult
from service.api.retrieve import RetrieveResult
from service.retrieve.given import RerankResult
from service.tracing import Attributes, Span, current

PROVIDER = "earm"

MemoryOperation = Literal[
    "create_memory", "upsert_memory", "update_memory", "delete_memory", "search_memory",
    "delete_memory_store",
]


def memory_span(
    operation: MemoryOperation, namespace: str | None = None, attributes: Attributes | None = None
) -> AbstractContextManager[Span]:
    """The span of one memory operation (named by the operation alone: a namespace in every
    span name would make as many names as namespaces)."""
    return current().span(
        operation,
        {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            **({"gen_ai.memory.store.id": namespace} if namespace is not None else {}),
            **(attributes or {}),
        },
        kind="client",
    )


def name_store(span: Span, namespace: str) -> None:
    """The store of an operation on a memory by id, known once the memory is read."""
    span.set({"gen_ai.memory.store.id": namespace})


def _records(records: Iterable[dict[str, Any]]) -> str:
    """``gen_ai.memory.records``: JSON, as the conventions record structured content."""
    return json.dumps(list(records), default=str, separators=(",", ":"))


def describe_ingest(span: Span, result: IngestResult, texts: Sequence[str],
                    metadata: Sequence[dict[str, Any] | None]) -> None:
    if not span.recording:
        return
    attributes: dict[str, Any] = {
        "gen_ai.memory.record.count": len(result.ids),
        "earm.created": result.created,
        "earm.existing": result.existing,
        "earm.updated": result.updated,
    }
    if len(result.ids) == 1:
        attributes["gen_ai.memory.record.id"] = str(result.ids[0])
    if current().content:
        attributes["gen_ai.memory.records"] = _records(
            {"id": str(memory_id), "content": text, "metadata": meta}
            for memory_id, text, meta in zip(result.ids, texts, metadata, strict=True)
        )
    span.set(attributes)


def describe_retrieve(span: Span, query: str, result: RetrieveResult) -> None:
    if not span.recording:
        return
    attributes: dict[str, Any] = {
        "gen_ai.memory.record.count": len(result.memories),
        "earm.policy": result.policy,
        "earm.stage": result.stage,
        "earm.budget": result.budget,
        "earm.anchors": result.scorer_calls,
        "earm.rounds": result.scorer_rounds,
        "earm.scorer_requests": result.scorer_requests,
        "earm.reused": result.reused,
        "earm.estimated": sum(memory.source == "estimated" for memory in result.memories),
        "earm.degraded": result.degraded,
    }
    if result.query_id is not None:
        attributes["earm.query_id"] = result.query_id
    if current().content:
        attributes["gen_ai.memory.query.text"] = query
        attributes["gen_ai.memory.records"] = _records(
            {"id": str(m.id), "content": m.text, "metadata": m.metadata, "score": m.score}
            for m in result.memories
        )
    span.set(attributes)


def rerank_span(
    model: str | None, namespace: str, documents: int, top_n: int | None
) -> AbstractContextManager[Span]:
    """The span of one rerank protocol call (the proposed ``gen_ai.rerank.client``)."""
    return current().span(
        "rerank" if model is None else f"rerank {model}",
        {
            "gen_ai.operation.name": "rerank",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.memory.store.id": namespace,
            "gen_ai.rerank.candidate.count": documents,
            **({"gen_ai.request.model": model} if model is not None else {}),
            **({"gen_ai.rerank.top_n": top_n} if top_n is not None else {}),
        },
        kind="client",
    )


def describe_rerank(span: Span, result: RerankResult) -> None:
    if not span.recording:
        return
    attributes: dict[str, Any] = {
        "earm.budget": result.budget,
        "earm.anchors": result.scorer_calls,
        "earm.reused": result.reused,
        "earm.estimated": result.estimated,
        "earm.degraded": result.degraded,
        "earm.stored": result.stored,
    }
    if result.retrieve is not None:
        attributes["earm.stage"] = result.retrieve.stage
        attributes["earm.rounds"] = result.retrieve.scorer_rounds
    if result.query_id is not None:
        attributes["earm.query_id"] = result.query_id
    if current().content:
        # In the order of the documents sent, as the caller numbers them.
        by_index = {document.index: document.relevance for document in result.documents}
        attributes["gen_ai.rerank.scores"] = [by_index[i] for i in sorted(by_index)]
    span.set(attributes)
