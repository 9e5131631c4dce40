"""/memories: batch ingest, edits, lookup, listing, deletion."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, status
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.errors import ErrorResponse
from service.api.fields import MAX_BIGINT, ExternalId, NamespaceName
from service.api.memories import (
    IngestRequest,
    IngestResult,
    MemoryPage,
    MemoryPatchIn,
    StoredMemory,
    UpdatedMemory,
)
from service.auth import Principal, require_namespace
from service.db.replicas import MEMORIES
from service.db.writes import writes_to
from service.errors import LimitExceeded
from service.http.deps import (
    AUTH_RESPONSES,
    DOCUMENT_BEARER,
    ComponentsDep,
    LimitsDep,
    PrincipalDep,
    WritesDep,
)
from service.http.genai_spans import MemoryOperation, describe_ingest, memory_span, name_store
from service.http.middleware import FastJSONRoute, annotate
from service.ingest import memories
from service.ingest.validation import check_metadata, check_text_length
from service.tracing import Span

MemoryId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A memory id.")]

router = APIRouter(
    tags=["memories"],
    route_class=FastJSONRoute,
    dependencies=[DOCUMENT_BEARER],
    responses={
        **AUTH_RESPONSES,
        400: {"model": ErrorResponse},
        413: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
    },
)


@router.post("/memories", status_code=status.HTTP_201_CREATED, response_model=IngestResult)
async def ingest_memories(
    request: Request,
    body: IngestRequest,
    components: ComponentsDep,
    writes: WritesDep,
    limits: LimitsDep,
    principal: PrincipalDep,
) -> IngestResult:
    annotate(request, namespace=body.namespace)
    require_namespace(principal, body.namespace)
    if len(body.memories) > limits.max_batch:
        raise LimitExceeded(
            f"{len(body.memories)} memories in one request; the limit is {limits.max_batch}"
        )
    for position, item in enumerate(body.memories):
        check_text_length(item.text, limits.max_text_chars, f"memories[{position}].text")
        check_metadata(
            item.metadata,
            limits.max_metadata_bytes,
            limits.max_metadata_depth,
            f"memories[{position}].metadata",
        )
    operation: MemoryOperation = (
        "upsert_memory" if body.on_conflict == "update" else "create_memory"
    )
    with memory_span(operation, body.namespace) as span:

        async def store(session: AsyncSession) -> IngestResult:
            result = await memories.ingest(
                session,
                components.embedder,
                limits.embedding_dim,
                body.namespace,
                [
                    memories.NewMemory(
                        text=item.text,
                        embedding=item.embedding,
                        external_id=item.external_id,
                        occurred_at=item.occurred_at,
                        metadata=item.metadata,
                    )
                    for item in body.memories
                ],
                body.on_conflict,
                limits.max_unindexed,
            )
            await session.commit()
            return result

        result = await writes.transaction(body.namespace, store, memories=True)
        describe_ingest(
            span, result, [item.text for item in body.memories],
            [item.metadata for item in body.memories],
        )
    if result.created or result.updated:
        components.indexer.notify()
    return result


async def _namespace_of(
    request: Request, session: AsyncSession, principal: Principal, memory_id: int, span: Span
) -> str:
    """The namespace of the memory a request names by id (404 without one), named on the
    request's log line and its span, once the caller may act on it (403 otherwise), and as
    the namespace the write ``session`` writes."""
    namespace = (await memories.get_memory(session, memory_id)).namespace
    name_store(span, namespace)
    annotate(request, namespace=namespace)
    require_namespace(principal, namespace)
    writes_to(session, namespace)
    return namespace


@router.patch(
    "/memories/{memory_id}",
    response_model=UpdatedMemory,
    responses={404: {"model": ErrorResponse}},
)
async def patch_memory(
    request: Request,
    memory_id: MemoryId,
    body: MemoryPatchIn,
    components: ComponentsDep,
    writes: WritesDep,
    limits: LimitsDep,
    principal: PrincipalDep,
) -> UpdatedMemory:
    """Change a memory's text, embedding, metadata or occurred_at (the memory keeps its id).
    A new text (re-embedded unless a vector is sent) or embedding retires the memory's
    observations: they judged the old content."""
    with memory_span(
        "update_memory", attributes={"gen_ai.memory.record.id": str(memory_id)}
    ) as span:

        async def update(session: AsyncSession) -> UpdatedMemory:
            await _namespace_of(request, session, principal, memory_id, span)
            if body.text is not None:
                check_text_length(body.text, limits.max_text_chars, "text")
            check_metadata(
                body.metadata, limits.max_metadata_bytes, limits.max_metadata_depth, "metadata"
            )
            result = await memories.update_memory(
                session,
                components.embedder,
                limits.embedding_dim,
                memory_id,
                memories.MemoryPatch(
                    text=body.text,
                    embedding=body.embedding,
                    metadata=body.metadata,
                    occurred_at=body.occurred_at,
                    sets_occurred_at="occurred_at" in body.model_fields_set,
                ),
            )
            await session.commit()
            return result

        result = await writes.transaction(None, update, memories=True)
    if body.text is not None or body.embedding is not None:  # maybe a vector to index
        components.indexer.notify()
    return result


@router.get(
    "/memories/{memory_id}", response_model=StoredMemory, responses={404: {"model": ErrorResponse}}
)
async def read_memory(
    request: Request, memory_id: MemoryId, components: ComponentsDep, principal: PrincipalDep
) -> StoredMemory:
    # By id: the namespace is known only from the row, so the replica must have replayed this
    # process's last memory write of any namespace.
    memory = await components.database.replicas.read(
        None, lambda session: memories.get_memory(session, memory_id), MEMORIES
    )
    annotate(request, namespace=memory.namespace)
    require_namespace(principal, memory.namespace)
    return memory


@router.get("/memories", response_model=MemoryPage)
async def list_memories(
    namespace: Annotated[NamespaceName, Query()],
    components: ComponentsDep,
    limits: LimitsDep,
    principal: PrincipalDep,
    request: Request,
    limit: Annotated[int, Query(ge=1)] = 100,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    external_id: Annotated[
        ExternalId | None, Query(description="Only the memory stored under this external_id.")
    ] = None,
) -> MemoryPage:
    annotate(request, namespace=namespace)
    require_namespace(principal, namespace)
    if limit > limits.max_page_size:
        raise LimitExceeded(f"limit {limit} exceeds the page size limit {limits.max_page_size}")
    return await components.database.replicas.read(
        namespace,
        lambda session: memories.list_memories(session, namespace, limit, cursor, external_id),
        MEMORIES,
    )


@router.delete(
    "/memories/{memory_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"model": ErrorResponse}},
)
async def delete_memory(
    request: Request,
    memory_id: MemoryId,
    writes: WritesDep,
    principal: PrincipalDep,
) -> Response:
    with memory_span(
        "delete_memory", attributes={"gen_ai.memory.record.id": str(memory_id)}
    ) as span:

        async def delete(session: AsyncSession) -> None:
            namespace = await _namespace_of(request, session, principal, memory_id, span)
            await memories.delete_memory(session, memory_id, namespace)
            await session.commit()

        await writes.transaction(None, delete, memories=True)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
