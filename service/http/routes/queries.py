"""GET /queries/{query_id}: the trace of one recorded retrieve."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.errors import ErrorResponse
from service.api.fields import MAX_BIGINT
from service.api.queries import QueryTraceResult
from service.auth import require_namespace
from service.db.traces import query_namespace, query_trace
from service.http.deps import AUTH_RESPONSES, DOCUMENT_BEARER, ComponentsDep, PrincipalDep
from service.http.middleware import annotate

router = APIRouter(
    tags=["retrieval"],
    dependencies=[DOCUMENT_BEARER],
    responses={**AUTH_RESPONSES, 404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)

QueryId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="A query id (`query_id`).")]


@router.get("/queries/{query_id}", response_model=QueryTraceResult)
async def read_query_trace(
    request: Request, query_id: QueryId, components: ComponentsDep, principal: PrincipalDep
) -> QueryTraceResult:
    """What one retrieve did: every candidate with its similarity, anchor or not, observed
    score and origin, the model's estimate, the final score, source and rank."""

    async def read(session: AsyncSession) -> QueryTraceResult:
        namespace = await query_namespace(session, query_id)
        annotate(request, namespace=namespace)
        require_namespace(principal, namespace)
        return await query_trace(session, namespace, query_id)

    # By id: the replica must have replayed this process's last write of any namespace.
    return await components.database.replicas.read(None, read)
