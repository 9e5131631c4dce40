"""FastAPI dependencies: everything a handler needs comes from the app's lifespan state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.database import Database
from service.embedders import Embedder
from service.indexing import BackgroundIndexer
from service.observability import Metrics
from service.retrieval.pipeline import RetrievalPipeline
from service.scorer_health import ScorerHealth
from service.scorers import RelevanceScorer
from service.settings import Settings


@dataclass
class Components:
    """What the lifespan builds once per process and releases at shutdown."""

    settings: Settings
    database: Database
    embedder: Embedder | None
    scorer: RelevanceScorer
    scorer_health: ScorerHealth
    pipeline: RetrievalPipeline
    indexer: BackgroundIndexer
    # Built by create_app before the lifespan (the middleware needs it); one per app.
    metrics: Metrics = field(default_factory=Metrics)


def get_components(request: Request) -> Components:
    return request.app.state.components


ComponentsDep = Annotated[Components, Depends(get_components)]


def get_settings_dep(components: ComponentsDep) -> Settings:
    return components.settings


async def get_session(components: ComponentsDep) -> AsyncIterator[AsyncSession]:
    """One session per request; handlers commit explicitly, anything else is rolled back."""
    async with components.database.sessions() as session:
        yield session


def get_pipeline(components: ComponentsDep) -> RetrievalPipeline:
    return components.pipeline


def get_metrics(components: ComponentsDep) -> Metrics:
    return components.metrics


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
PipelineDep = Annotated[RetrievalPipeline, Depends(get_pipeline)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
SessionDep = Annotated[AsyncSession, Depends(get_session)]
