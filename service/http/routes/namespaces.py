"""/namespaces/{namespace}: erase a namespace."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.errors import ErrorResponse
from service.api.fields import NamespaceName
from service.api.namespaces import ErasedNamespace
from service.auth import require_namespace
from service.db.namespaces import erase_namespace
from service.http.deps import (
    AUTH_RESPONSES,
    DOCUMENT_BEARER,
    ComponentsDep,
    PrincipalDep,
    WritesDep,
)
from service.http.genai_spans import memory_span
from service.http.middleware import FastJSONRoute, annotate

router = APIRouter(
    tags=["memories"],
    route_class=FastJSONRoute,
    dependencies=[DOCUMENT_BEARER],
    responses={
        **AUTH_RESPONSES,
        404: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
    },
)


@router.delete("/namespaces/{namespace}", response_model=ErasedNamespace)
async def delete_namespace(
    request: Request,
    namespace: Annotated[NamespaceName, Path()],
    components: ComponentsDep,
    writes: WritesDep,
    principal: PrincipalDep,
) -> ErasedNamespace:
    """Erase everything of a namespace in one transaction: memories, queries, observations,
    their history and the learned model. Answers what was deleted."""
    annotate(request, namespace=namespace)
    require_namespace(principal, namespace)
    with memory_span("delete_memory_store", namespace):

        async def erase(session: AsyncSession) -> ErasedNamespace:
            erased = await erase_namespace(session, namespace)
            await session.commit()
            return erased

        erased = await writes.transaction(namespace, erase, memories=True)
    components.repeated_reranks.forget_namespace(namespace)
    return erased
