"""/retrieve and /feedback: translate JSON to the pipeline and back."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.api.errors import ErrorResponse
from service.api.retrieve import FeedbackIn, FeedbackResult, RetrieveIn, RetrieveResult
from service.auth import require_namespace
from service.errors import LimitExceeded
from service.http.deps import (
    AUTH_RESPONSES,
    DOCUMENT_BEARER,
    LimitsDep,
    MetricsDep,
    PipelineDep,
    PrincipalDep,
)
from service.http.genai_spans import describe_retrieve, memory_span
from service.http.middleware import FastJSONRoute, annotate
from service.ingest.validation import check_metadata
from service.retrieve.pipeline import RetrieveRequest

router = APIRouter(
    tags=["retrieval"],
    route_class=FastJSONRoute,
    dependencies=[DOCUMENT_BEARER],
    responses={
        **AUTH_RESPONSES,
        400: {"model": ErrorResponse},
        404: {"model": ErrorResponse},
        413: {"model": ErrorResponse},
        422: {"model": ErrorResponse},
        503: {"model": ErrorResponse},
    },
)


@router.post("/retrieve", response_model=RetrieveResult)
async def retrieve(
    request: Request,
    body: RetrieveIn,
    pipeline: PipelineDep,
    limits: LimitsDep,
    principal: PrincipalDep,
    metrics: MetricsDep,
) -> RetrieveResult:
    """Semantic candidates, a budget of them scored, the rest completed, top-k returned."""
    annotate(request, namespace=body.namespace, policy=body.policy)
    require_namespace(principal, body.namespace)
    check_metadata(
        body.filters, limits.max_metadata_bytes, limits.max_metadata_depth, "filters"
    )
    with memory_span("search_memory", body.namespace) as span:
        result = await pipeline.retrieve(RetrieveRequest(**body.model_dump()))
        describe_retrieve(span, body.query, result)
    annotate(
        request,
        scorer_calls=result.scorer_calls,
        scorer_requests=result.scorer_requests,
        degraded=result.degraded,
    )
    metrics.observe_retrieve(result, pipeline.scorer.name)
    return result


@router.post("/feedback", response_model=FeedbackResult)
async def feedback(
    request: Request,
    body: FeedbackIn,
    pipeline: PipelineDep,
    limits: LimitsDep,
    principal: PrincipalDep,
) -> FeedbackResult:
    """Client observations for a past query: they replace the pairs' earlier observations,
    and later queries learn from them."""
    annotate(request, namespace=body.namespace)
    require_namespace(principal, body.namespace)
    if len(body.scores) > limits.max_batch:
        raise LimitExceeded(f"{len(body.scores)} scores; the limit is {limits.max_batch}")
    return await pipeline.feedback(
        body.namespace,
        body.query_id,
        [item.memory for item in body.scores],
        [item.score for item in body.scores],
    )
