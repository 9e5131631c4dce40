"""/stats (per-namespace health of the learning loop) and /metrics (Prometheus exposition)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from service import stats as stats_sql
from service.api.deps import ComponentsDep, SessionDep
from service.api.schemas import ErrorResponse, NamespaceName
from service.auth import AUTH_RESPONSES, DOCUMENT_BEARER, PrincipalDep, require_namespace
from service.observability import CONTENT_TYPE_LATEST, annotate
from service.scorer_health import MAX_AGE_S, MIN_CALLS, WINDOW_CALLS

log = logging.getLogger(__name__)

router = APIRouter(tags=["operations"])

#: Namespaces that get their own labelled gauges in /metrics (the ones with most queries).
METRICS_MAX_NAMESPACES = 100
#: A scrape does not wait longer than this for the database gauges.
METRICS_DATABASE_TIMEOUT_S = 2.0


class NamespaceStatsOut(BaseModel):
    namespace: str
    memories: int
    memories_unindexed: int = Field(
        description="Memories not in the HNSW index yet (the background indexer's backlog); "
        "searches find them by an exact scan meanwhile."
    )
    queries: int = Field(description="Queries recorded (the next query's index).")
    observations: int = Field(description="Observed cells: scorer scores and feedback.")
    density: float = Field(description="observations / (memories × queries); 0 while either is 0.")
    stage: int = Field(description="Budget stage of the next query.")
    next_budget: int = Field(
        description="Anchors the next default request will score: the schedule's ratio times "
        "min(default candidates, memories)."
    )
    next_budget_ratio: float
    scorer_calls: int = Field(description="Scorer calls made by recorded queries.")
    full_rerank_calls: int = Field(description="Calls full reranking would have made for them.")
    calls_saved: float | None = Field(description="1 − scorer_calls / full_rerank_calls.")
    estimated_share: float | None = Field(
        description="Share of returned memories whose score came from the completion model."
    )
    prequential_error: float | None = Field(
        description="Mean absolute error of the completion on anchors with history over the "
        "last 100 queries, each predicted before it was learned from (null: none yet)."
    )
    prequential_anchors: int = Field(description="Anchors that error is measured on.")
    last_refit_at: datetime | None


class ScorerHealthOut(BaseModel):
    """Health of the relevance scorer of the process that answered (not per namespace)."""

    name: str = Field(description="The scorer (`EARM_SCORER`): `local` or `openai`.")
    recent_calls: int = Field(
        description=f"Scorer calls in the health window: the last {WINDOW_CALLS}, none older "
        f"than {MAX_AGE_S:g} s."
    )
    recent_success_rate: float | None = Field(
        description="Share of those calls that returned a score (null: no recent calls)."
    )
    healthy: bool = Field(
        description=f"false once at least {MIN_CALLS} recent calls were made and fewer than "
        "half succeeded: retrieves answer degraded and learning stalls."
    )


class NamespaceReportOut(NamespaceStatsOut):
    scorer: ScorerHealthOut


class StatsListOut(BaseModel):
    namespaces: list[NamespaceStatsOut]
    scorer: ScorerHealthOut


@router.get(
    "/stats",
    response_model=NamespaceReportOut | StatsListOut,
    dependencies=[DOCUMENT_BEARER],
    responses={**AUTH_RESPONSES, 404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)
async def read_stats(
    request: Request,
    components: ComponentsDep,
    session: SessionDep,
    principal: PrincipalDep,
    namespace: Annotated[NamespaceName | None, Query()] = None,
) -> NamespaceReportOut | StatsListOut:
    """One namespace's counts, budget, savings and completion quality; without `namespace`,
    those of every namespace the API key may use. Both carry the scorer's health."""
    settings, schedule = components.settings, components.pipeline.schedule
    scorer = ScorerHealthOut(**asdict(components.scorer_health.snapshot()))
    if namespace is None:
        rows = await stats_sql.all_namespace_stats(session, schedule, settings.default_candidates)
        return StatsListOut(
            namespaces=[NamespaceStatsOut(**asdict(r)) for r in rows if principal.allows(r.namespace)],
            scorer=scorer,
        )
    annotate(request, namespace=namespace)
    require_namespace(principal, namespace)
    row = await stats_sql.namespace_stats(session, namespace, schedule, settings.default_candidates)
    return NamespaceReportOut(**asdict(row), scorer=scorer)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(components: ComponentsDep) -> Response:
    """Prometheus exposition: HTTP, retrieve, scorer metrics, the scorer's health and gauges
    from the namespace counters (which read the `namespaces` table only)."""
    snapshot = None
    try:
        async with asyncio.timeout(METRICS_DATABASE_TIMEOUT_S):
            async with components.database.sessions() as session:
                snapshot = await stats_sql.counter_snapshot(session, METRICS_MAX_NAMESPACES)
    except Exception as exc:  # the process metrics are still worth serving
        log.warning("metrics: database gauges unavailable: %s", type(exc).__name__)
    body = components.metrics.render(
        snapshot, components.pipeline.schedule, components.scorer_health.snapshot()
    )
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
