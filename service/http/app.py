"""The app factory: one FastAPI app per ``Settings``, its resources owned by the lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import Depends, FastAPI

from service.auth import Authenticator
from service.cpu import one_blas_thread
from service.db.engine import open_database, supervised
from service.http.dashboard import mount_dashboard
from service.http.deps import Components, authenticate
from service.http.docs import install_offline_docs
from service.http.error_handlers import install_error_handlers
from service.http.middleware import BodyLimits, RequestObservabilityMiddleware
from service.http.routes import health, memories, namespaces, queries, rerank, retrieve, stats
from service.http.server_spans import ServerSpans
from service.ingest.indexer import BackgroundIndexer
from service.integrations import mount_mcp
from service.metrics import Metrics
from service.providers.factory import build_embedder, build_scorer
from service.providers.local_embedder import LocalEmbedder
from service.providers.scorer_health import ScorerHealth
from service.providers.scorers import observe_all
from service.retrieve.given import RepeatedCalls
from service.retrieve.pipeline import RetrievalPipeline
from service.retrieve.refit_health import RefitHealth
from service.retrieve.refit_process import refits_for
from service.settings import Settings
from service.tracing import NO_TRACING, open_tracing


def create_app(settings: Settings | None = None, *, refit_in_request: bool = False) -> FastAPI:
    """Build the app; without ``settings`` they are read from the environment (``EARM_*``),
    which is what ``uvicorn --factory service.http.app:create_app`` relies on.

    ``refit_in_request``: a full refit a retrieve makes due runs inside that request instead of
    after the response, so a sequential replay is exactly reproducible and the request times
    the refit. For tests and benchmarks, never a setting: a served app refits after the
    response."""
    settings = settings or Settings()
    # Here, in the thread that builds the app, not in the lifespan: OpenBLAS ignores a limit
    # set from another thread (the lifespan's, under a test client) once this one set its own.
    one_blas_thread()
    metrics = Metrics()
    app = FastAPI(
        title="earm",
        version="1",
        summary="Retrieval for long-term agent memory that learns from its own reranking.",
        lifespan=_lifespan(settings, metrics, refit_in_request),
        # Every route needs a key once key enforcement is on, except deps.PUBLIC_PATHS
        # (docs/security.md).
        dependencies=[Depends(authenticate)],
        # Served by service.http.docs with local assets instead of FastAPI's CDN ones.
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(
        BodyLimits, max_bytes=settings.serving.max_body_bytes,
        timeout_s=settings.serving.body_timeout_s,
    )
    app.state.metrics = metrics
    app.add_middleware(RequestObservabilityMiddleware, metrics=metrics)
    # Added last, so outermost: the server span covers the other middleware's work too. The
    # lifespan replaces the tracing with the one the OTEL_* variables ask for.
    app.state.tracing = NO_TRACING
    app.add_middleware(ServerSpans)
    install_error_handlers(app)
    install_offline_docs(app)
    app.include_router(health.router)
    app.include_router(memories.router)
    app.include_router(namespaces.router)
    app.include_router(retrieve.router)
    app.include_router(rerank.router)
    app.include_router(queries.router)
    app.include_router(stats.router)
    mount_mcp(app, settings.serving, settings.integrations)
    mount_dashboard(app)
    return app


def _lifespan(
    settings: Settings, metrics: Metrics, refit_in_request: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's resources: opened before it serves, closed once it has stopped."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing = open_tracing(settings.observability)
        app.state.tracing = tracing
        try:
            async with _components(app, settings, metrics, refit_in_request):
                yield
        finally:
            app.state.tracing = NO_TRACING
            # After the refits drained (their spans end), the last spans are exported, which
            # blocks up to the exporter's timeout: not on the event loop.
            await asyncio.to_thread(tracing.close)

    return lifespan


@asynccontextmanager
async def _components(
    app: FastAPI, settings: Settings, metrics: Metrics, refit_in_request: bool
) -> AsyncIterator[None]:
    """The database, providers, pipeline and indexer, on ``app.state.components`` while they
    serve."""
    # In embedded mode, the server is restarted whenever it dies (service.db.engine).
    async with (
        open_database(settings.database, metrics.observe_replica_read) as database,
        supervised(database, settings.database),
    ):
        # Seeds EARM_API_KEYS; refuses a non-loopback EARM_HOST without key enforcement.
        app.state.authenticator = Authenticator.from_settings(settings.auth, database.sessions)
        await app.state.authenticator.start(bind_host=settings.host)
        embedder = build_embedder(settings.embedding)
        if isinstance(embedder, LocalEmbedder):
            # Load the ONNX model now, not on the first request (~0.4 s).
            await asyncio.to_thread(embedder.load)
        scorer_health = ScorerHealth(settings.scorer)
        scorer = build_scorer(
            settings.scoring, observer=observe_all(metrics.observe_scorer_call, scorer_health)
        )
        refit_health = RefitHealth(metrics.observe_refit)
        refits = refits_for(settings.learning, database.url, database.sessions, refit_health)
        pipeline = RetrievalPipeline(
            database.sessions, embedder, scorer, settings,
            late_observer=metrics.observe_late_anchors, replicas=database.replicas,
            refits=refits, refit_in_request=refit_in_request,
        )
        indexer = BackgroundIndexer.from_settings(database.sessions, settings.indexing)
        if settings.background_work:
            # Started now: memories left unindexed by an earlier run are indexed first.
            # (Otherwise `earm worker` indexes; notify() then wakes nothing.)
            indexer.start()
        app.state.components = Components(
            limits=settings.limits,
            auth=settings.auth,
            integrations=settings.integrations,
            database=database,
            embedder=embedder,
            scorer=scorer,
            scorer_health=scorer_health,
            refit_health=refit_health,
            pipeline=pipeline,
            indexer=indexer,
            repeated_reranks=RepeatedCalls(settings.rerank_repeat_window_s),
            metrics=metrics,
        )
        try:
            yield
        finally:
            await indexer.stop()
            # Late anchors still in flight: recorded if they land in time, else dropped.
            await pipeline.late.close(settings.late_drain_s)
            await pipeline.drain()  # a refit in flight finishes while the database is up
            refits.close()
            await scorer.aclose()
            if embedder is not None:
                await embedder.aclose()
