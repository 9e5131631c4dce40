"""/stats (per-namespace health of the learning loop) and /metrics (Prometheus exposition)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service.api.errors import ErrorResponse
from service.api.fields import NamespaceName
from service.api.stats import NamespaceReportOut, StatsListOut
from service.auth import require_admin, require_namespace
from service.db import stats as stats_sql
from service.http.deps import (
    AUTH_RESPONSES,
    DOCUMENT_BEARER,
    METRICS_PATH,
    ComponentsDep,
    PrincipalDep,
)
from service.http.middleware import annotate
from service.metrics import CONTENT_TYPE_LATEST
from service.metrics.gauges import ScorerBackendState
from service.providers.http_scorer import HTTPScorer

log = logging.getLogger(__name__)

router = APIRouter(tags=["operations"])

#: Namespaces that get their own labelled gauges in /metrics (the ones with most queries).
METRICS_MAX_NAMESPACES = 100
#: A scrape does not wait longer than this for the database gauges.
METRICS_DATABASE_TIMEOUT_S = 2.0


@router.get(
    "/stats",
    response_model=NamespaceReportOut | StatsListOut,
    dependencies=[DOCUMENT_BEARER],
    responses={**AUTH_RESPONSES, 404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)
async def read_stats(
    request: Request,
    components: ComponentsDep,
    principal: PrincipalDep,
    namespace: Annotated[NamespaceName | None, Query()] = None,
) -> NamespaceReportOut | StatsListOut:
    """One namespace's counts, budget, savings and completion quality; without `namespace`,
    those of every namespace the API key may use. Both carry the scorer's health."""
    limits, schedule = components.limits, components.pipeline.schedule
    replicas = components.database.replicas
    scorer = components.scorer_health.snapshot()
    if namespace is None:
        rows = await replicas.read(
            None,
            lambda session: stats_sql.all_namespace_stats(
                session, schedule, limits.default_candidates
            ),
        )
        return StatsListOut(
            namespaces=[r for r in rows if principal.allows(r.namespace)], scorer=scorer
        )
    annotate(request, namespace=namespace)
    require_namespace(principal, namespace)
    row = await replicas.read(
        namespace,
        lambda session: stats_sql.namespace_stats(
            session, namespace, schedule, limits.default_candidates
        ),
    )
    return NamespaceReportOut(**asdict(row), scorer=scorer)


@router.get(
    METRICS_PATH,
    response_class=Response,
    dependencies=[DOCUMENT_BEARER],
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}},
        **AUTH_RESPONSES,
        403: {"model": ErrorResponse, "description": "The key is not an admin key ('*')."},
    },
)
async def metrics(components: ComponentsDep, principal: PrincipalDep) -> Response:
    """Prometheus exposition: HTTP, retrieve, scorer metrics, the scorer's health and gauges
    from the namespace counters (which read the `namespaces` table only). It names the busiest
    namespaces, so it needs an admin key (or `EARM_METRICS_PUBLIC=true`)."""
    require_admin(principal, "/metrics names every namespace; scrape it with an admin key "
                  "or set EARM_METRICS_PUBLIC=true")
    snapshot = None
    try:
        async with asyncio.timeout(METRICS_DATABASE_TIMEOUT_S):
            async with components.database.sessions() as session:
                snapshot = await stats_sql.counter_snapshot(session, METRICS_MAX_NAMESPACES)
    except Exception as exc:  # the process metrics are still worth serving
        log.warning("metrics: database gauges unavailable: %s", type(exc).__name__)
    scorer = components.scorer
    body = components.metrics.render(
        snapshot, components.pipeline.schedule, components.scorer_health.snapshot(),
        ScorerBackendState(scorer.limit.window, scorer.breaker.state == "open")
        if isinstance(scorer, HTTPScorer)
        else None,
    )
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
