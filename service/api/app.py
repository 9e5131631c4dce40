"""The app factory: one FastAPI app per ``Settings``, its resources owned by the lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from service.api import health, memories, retrieve, stats
from service.api.deps import Components
from service.api.errors import install_error_handlers
from service.auth import Authenticator, authenticate
from service.db.database import open_database
from service.embedders import LocalEmbedder, build_embedder
from service.indexing import BackgroundIndexer
from service.integrations import mount_mcp
from service.limits import BodySizeLimit
from service.observability import Metrics, RequestObservabilityMiddleware
from service.retrieval.pipeline import RetrievalPipeline
from service.scorers import build_scorer
from service.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; without ``settings`` they are read from the environment (``EARM_*``),
    which is what ``uvicorn --factory service.api.app:create_app`` relies on."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_database(settings) as database:
            # Seeds EARM_API_KEYS; refuses a non-loopback EARM_HOST without keys.
            app.state.authenticator = Authenticator.from_settings(settings, database.sessions)
            await app.state.authenticator.start(bind_host=settings.host)
            embedder = build_embedder(settings)
            if isinstance(embedder, LocalEmbedder):
                # Load the ONNX model now, not on the first request (~0.4 s).
                await asyncio.to_thread(embedder.load)
            scorer = build_scorer(settings, observer=metrics.observe_scorer_call)
            pipeline = RetrievalPipeline(database.sessions, embedder, scorer, settings)
            # Started now: memories left unindexed by an earlier run are indexed first.
            indexer = BackgroundIndexer(
                database.sessions, settings.index_batch_size, settings.index_poll_interval_s
            )
            indexer.start()
            app.state.components = Components(
                settings=settings,
                database=database,
                embedder=embedder,
                scorer=scorer,
                pipeline=pipeline,
                indexer=indexer,
                metrics=metrics,
            )
            try:
                yield
            finally:
                await indexer.stop()
                await pipeline.drain()  # a refit in flight finishes while the database is up
                await scorer.aclose()
                if embedder is not None:
                    await embedder.aclose()

    app = FastAPI(
        title="earm",
        version="1",
        summary="Retrieval for long-term agent memory that learns from its own reranking.",
        lifespan=lifespan,
        # Every route needs a key once keys exist, except auth.PUBLIC_PATHS (docs/security.md).
        dependencies=[Depends(authenticate)],
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.state.metrics = metrics
    app.add_middleware(RequestObservabilityMiddleware, metrics=metrics)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(memories.router)
    app.include_router(retrieve.router)
    app.include_router(stats.router)
    mount_mcp(app, settings)
    return app
