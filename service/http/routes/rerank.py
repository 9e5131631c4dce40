"""The rerank protocol: ``/v1/rerank`` and ``/v2/rerank`` (Cohere v2, Jina, vLLM) and ``/rerank``
(that shape, or text-embeddings-inference's). Translates a protocol's body to a rerank of given
documents (``service.retrieve.given``) and the answer back; which namespace learns comes from
the model name, a header or a setting."""

from __future__ import annotations

import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from service.api.errors import ErrorResponse
from service.api.rerank import (
    AnyRerankIn,
    CohereRerankIn,
    CohereRerankOut,
    EarmRerankOut,
    RerankApiVersionOut,
    RerankMetaOut,
    RerankResultDocumentOut,
    RerankResultOut,
    TeiRankOut,
    TeiRerankIn,
)
from service.auth import require_namespace
from service.checks import NAMESPACE_PATTERN, namespace_name
from service.errors import InvalidInput
from service.http.deps import (
    AUTH_RESPONSES,
    DOCUMENT_BEARER,
    ComponentsDep,
    MetricsDep,
    PrincipalDep,
)
from service.http.genai_spans import describe_rerank, rerank_span
from service.http.middleware import FastJSONRoute, annotate
from service.retrieve.given import RerankRequest, RerankResult, rerank_documents
from service.settings_groups import IntegrationSettings

MODEL_PREFIX = "earm/"
EARM_HEADER = "X-Earm"

router = APIRouter(
    tags=["rerank protocol"],
    route_class=FastJSONRoute,
    dependencies=[DOCUMENT_BEARER],
    responses={
        **AUTH_RESPONSES,
        200: {
            "headers": {
                EARM_HEADER: {
                    "description": "What earm did for the call, as JSON (the `earm` object).",
                    "schema": {"type": "string"},
                }
            }
        },
        400: {"model": ErrorResponse},
        413: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
    },
)

NamespaceHeader = Annotated[
    str | None,
    Header(
        alias="X-Earm-Namespace",
        pattern=NAMESPACE_PATTERN,
        description="The namespace that learns from the call, for a model not `earm/<namespace>`.",
    ),
]


def rerank_namespace(
    model: str | None, header: str | None, settings: IntegrationSettings
) -> str:
    """The namespace a call names: a model ``earm/<namespace>``, else the header, else the
    deployment's ``EARM_RERANK_NAMESPACE``."""
    named = model[len(MODEL_PREFIX):] if model and model.startswith(MODEL_PREFIX) else None
    if named is not None:
        try:
            namespace_name(named)
        except ValueError as exc:
            raise InvalidInput(f"model {model!r}: {exc}") from None
        if header is not None and header != named:
            raise InvalidInput(
                f"model {model!r} and X-Earm-Namespace {header!r} name different namespaces"
            )
        return named
    if header is not None:
        return header
    if settings.rerank_namespace is not None:
        return settings.rerank_namespace
    raise InvalidInput(
        f"model {model!r} names no namespace: send model 'earm/<namespace>', or the "
        "X-Earm-Namespace header, or configure EARM_RERANK_NAMESPACE"
    )


#: What every rerank route depends on, passed on as one value.
_Deps = tuple[ComponentsDep, PrincipalDep, MetricsDep]


async def _rerank(
    request: Request,
    deps: _Deps,
    model: str | None,
    header: str | None,
    query: str,
    documents: list[str],
    top_n: int | None,
) -> RerankResult:
    """The documents reranked in the namespace that ``model`` or ``header`` (or the setting)
    names, whichever protocol shape asked."""
    components, principal, metrics = deps
    rerank = RerankRequest(
        rerank_namespace(model, header, components.integrations), query, documents, top_n
    )
    annotate(request, namespace=rerank.namespace, documents=len(rerank.documents))
    require_namespace(principal, rerank.namespace)
    with rerank_span(model, rerank.namespace, len(rerank.documents), top_n) as span:
        result = await rerank_documents(
            components.pipeline, rerank, components.repeated_reranks
        )
        describe_rerank(span, result)
    if result.stored:
        components.indexer.notify()
    if result.retrieve is not None:
        metrics.observe_retrieve(result.retrieve, components.pipeline.scorer.name)
    annotate(request, scorer_calls=result.scorer_calls, degraded=result.degraded)
    return result


def _earm(result: RerankResult, top_n: int | None) -> EarmRerankOut:
    documents = result.documents[:top_n]
    return EarmRerankOut(
        namespace=result.namespace,
        query_id=result.query_id,
        budget=result.budget,
        scorer_calls=result.scorer_calls,
        reused=result.reused,
        estimated=result.estimated,
        degraded=result.degraded,
        memory_ids=[d.memory_id for d in documents],
        timings=result.timings,
    )


def _set_earm_header(response: Response, earm: EarmRerankOut) -> None:
    response.headers[EARM_HEADER] = json.dumps(earm.model_dump(), separators=(",", ":"))


def _cohere_answer(body: CohereRerankIn, result: RerankResult) -> CohereRerankOut:
    texts = body.texts()
    results = []
    for document in result.documents[: body.top_n]:
        item = RerankResultOut(index=document.index, relevance_score=document.relevance)
        if body.return_documents:
            item.document = RerankResultDocumentOut(text=texts[document.index])
        results.append(item)
    return CohereRerankOut(
        id=uuid.uuid4().hex,
        model=body.model,
        results=results,
        meta=RerankMetaOut(
            api_version=RerankApiVersionOut(version="2"), earm=_earm(result, body.top_n)
        ),
    )


def _tei_answer(body: TeiRerankIn, result: RerankResult) -> list[TeiRankOut]:
    answer = []
    for document in result.documents:
        rank = TeiRankOut(index=document.index, score=document.relevance)
        if body.return_text:
            rank.text = body.texts[document.index]
        answer.append(rank)
    return answer


async def _cohere(
    request: Request, response: Response, body: CohereRerankIn, deps: _Deps, header: str | None
) -> CohereRerankOut:
    result = await _rerank(
        request, deps, body.model, header, body.query, body.texts(), body.top_n
    )
    answer = _cohere_answer(body, result)
    _set_earm_header(response, answer.meta.earm)
    return answer


async def _tei(
    request: Request, response: Response, body: TeiRerankIn, deps: _Deps, header: str | None
) -> list[TeiRankOut]:
    result = await _rerank(request, deps, None, header, body.query, body.texts, None)
    _set_earm_header(response, _earm(result, None))
    return _tei_answer(body, result)


_COHERE_DOC = (
    "Rerank documents (Cohere v2 / Jina / vLLM shape): every document gets a relevance in "
    "[0, 1], best first; earm scores a budget of them with the configured scorer and completes "
    "the rest from what it learned. `meta.earm` says what it did."
)


@router.post("/v1/rerank", response_model=CohereRerankOut, response_model_exclude_unset=True,
             description=_COHERE_DOC)
@router.post("/v2/rerank", response_model=CohereRerankOut, response_model_exclude_unset=True,
             description=_COHERE_DOC)
async def cohere_rerank(
    request: Request,
    response: Response,
    body: CohereRerankIn,
    components: ComponentsDep,
    principal: PrincipalDep,
    metrics: MetricsDep,
    x_earm_namespace: NamespaceHeader = None,
) -> CohereRerankOut:
    return await _cohere(
        request, response, body, (components, principal, metrics), x_earm_namespace
    )


@router.post(
    "/rerank",
    response_model=CohereRerankOut | list[TeiRankOut],
    response_model_exclude_unset=True,
    description="Rerank in the Cohere shape (a body with `documents`) or in "
    "text-embeddings-inference's (a body with `texts`, answered by `[{index, score, text?}]` "
    "best first, with the `earm` object in the X-Earm header).",
)
async def any_rerank(
    request: Request,
    response: Response,
    body: AnyRerankIn,
    components: ComponentsDep,
    principal: PrincipalDep,
    metrics: MetricsDep,
    x_earm_namespace: NamespaceHeader = None,
) -> CohereRerankOut | list[TeiRankOut]:
    deps = (components, principal, metrics)
    if isinstance(body, TeiRerankIn):
        return await _tei(request, response, body, deps, x_earm_namespace)
    return await _cohere(request, response, body, deps, x_earm_namespace)
