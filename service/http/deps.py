"""FastAPI dependencies: everything a handler needs comes from the app's lifespan state, and
the caller's principal from the bearer key (the key logic is ``service.auth``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from service.api.errors import ErrorResponse
from service.auth import ANONYMOUS, Authenticator, Principal
from service.db.engine import Database
from service.db.writes import Writes
from service.http.middleware import annotate
from service.ingest.indexer import BackgroundIndexer
from service.metrics import Metrics
from service.providers.embedders import Embedder
from service.providers.scorer_health import ScorerHealth
from service.providers.scorers import RelevanceScorer
from service.retrieve.given import RepeatedCalls
from service.retrieve.pipeline import RetrievalPipeline
from service.retrieve.refit_health import RefitHealth
from service.settings_groups import AuthSettings, IntegrationSettings, LimitSettings


@dataclass
class Components:
    """What the lifespan builds once per process and releases at shutdown."""

    limits: LimitSettings
    auth: AuthSettings
    integrations: IntegrationSettings
    database: Database
    embedder: Embedder | None
    scorer: RelevanceScorer
    scorer_health: ScorerHealth
    refit_health: RefitHealth
    pipeline: RetrievalPipeline
    indexer: BackgroundIndexer
    repeated_reranks: RepeatedCalls
    # Built by create_app before the lifespan (the middleware needs it); one per app.
    metrics: Metrics = field(default_factory=Metrics)


def get_components(request: Request) -> Components:
    components: Components = request.app.state.components  # app.state's attributes are Any
    return components


ComponentsDep = Annotated[Components, Depends(get_components)]


def get_limits(components: ComponentsDep) -> LimitSettings:
    return components.limits


def get_writes(components: ComponentsDep) -> Writes:
    """Where a handler's write transaction runs: ``await writes.transaction(namespace, work,
    memories=...)``; ``work`` commits explicitly, anything else is rolled back, a conflict
    the server rolled back is run again, and once done the namespace's reads see it, on a
    replica too (service.db.writes)."""
    return components.database.writes


def get_pipeline(components: ComponentsDep) -> RetrievalPipeline:
    return components.pipeline


def get_metrics(components: ComponentsDep) -> Metrics:
    return components.metrics


LimitsDep = Annotated[LimitSettings, Depends(get_limits)]
PipelineDep = Annotated[RetrievalPipeline, Depends(get_pipeline)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
WritesDep = Annotated[Writes, Depends(get_writes)]


# ---------------------------------------------------------------------------- authentication

#: Routes that answer without a key: the probes (the docs are not API routes).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
#: Public too with ``EARM_METRICS_PUBLIC=true``; an admin key's otherwise (the route checks).
METRICS_PATH = "/metrics"

#: Declares the bearer scheme in the OpenAPI document (and the docs' "Authorize" button) for
#: the routers that use it; the checking itself is :func:`authenticate`.
bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API key from `earm keys create` (required once key enforcement is on).",
)


async def authenticate(request: Request) -> Principal:
    """App-level dependency: every route but :data:`PUBLIC_PATHS` (and :data:`METRICS_PATH`
    with ``EARM_METRICS_PUBLIC``) needs a principal.

    FastAPI caches a dependency per request, so handlers that declare ``PrincipalDep`` get the
    principal resolved here without a second lookup."""
    path = getattr(request.scope.get("route"), "path", request.url.path)
    if path in PUBLIC_PATHS or (
        path == METRICS_PATH and get_components(request).auth.metrics_public
    ):
        return ANONYMOUS
    authenticator: Authenticator = request.app.state.authenticator  # set by the lifespan
    peer = request.client.host if request.client else None
    principal = await authenticator.authenticate(
        request.headers.get("authorization"), peer, request.headers.get("host")
    )
    request.state.principal = principal
    if principal.key_id is not None:
        # the access log names the key, never shows it
        annotate(request, api_key_id=principal.key_id)
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]

#: Router-level dependency that documents the bearer scheme in OpenAPI (checks nothing).
DOCUMENT_BEARER = Depends(bearer_scheme)

#: The error responses every protected route can give, for its OpenAPI entry.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one."},
    403: {"model": ErrorResponse, "description": "The namespace is outside the key's patterns."},
}
