"""EARM_PROFILE=paper reaches the stored model: the plain model is fitted and folded in without
similarities or content, so every query's slope is 0 and the namespace has no content prior,
while its factors, weighted as the paper's balanced model weights them, carry signal."""

from __future__ import annotations

import asyncio

import numpy as np
from sqlalchemy import text

from service.db.engine import open_database
from service.ingest.memories import NewMemory, ingest
from service.providers.rerank_scorer import RerankScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.retrieve.refit import refit_namespace
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

DIM = 384
TOPICS = 5


def topic_match(query: str, documents: list[str]) -> list[float | None]:
    """Scores no similarity explains: high where the memory's topic is the query's."""
    return [0.9 if d.endswith(query.split()[1]) else 0.1 for d in documents]


async def paper_model(database_url: str) -> tuple[list[float], list[float | None], float]:
    """Every query's stored slope, the namespace's content slope, and the mean |memory factor|
    after 30 earm retrieves and a refit under the paper profile."""
    settings = Settings(database_url=database_url, embedder="none", background_work=False,
                        refit_in_background=False, profile="paper", _env_file=None)
    server = LoopbackServer(rerank_app(topic_match)).start()
    scorer = RerankScorer(base_url=server.url, model="reranker", protocol="rerank")
    rng = np.random.default_rng(0)
    async with open_database(settings) as db:
        async with db.sessions() as session:
            await ingest(session, None, DIM, "ns", [
                NewMemory(text=f"memory {i} about topic {i % TOPICS}",
                          embedding=rng.normal(size=DIM).tolist())
                for i in range(40)])
            await session.commit()
        pipeline = RetrievalPipeline(db.sessions, None, scorer, settings)
        for i in range(30):
            await pipeline.retrieve(RetrieveRequest(
                namespace="ns", query=f"topic {i % TOPICS}", policy="earm", candidates=20,
                budget=8, query_embedding=rng.normal(size=DIM).tolist()))
        assert await refit_namespace(db.sessions, settings, "ns")
        async with db.engine.connect() as conn:
            slopes = (await conn.execute(text(
                "SELECT slope FROM queries WHERE namespace = 'ns'"))).scalars().all()
            content_slope = (await conn.execute(text(
                "SELECT content_slope FROM namespaces WHERE name = 'ns'"))).scalar_one()
            factors = (await conn.execute(text(
                "SELECT factors FROM memory_factors WHERE namespace = 'ns'"))).scalars().all()
    await scorer.aclose()
    server.stop()
    return list(slopes), content_slope, float(np.abs(np.array(factors)).mean())


def test_the_paper_profile_stores_a_plain_model(clean_database: str) -> None:
    slopes, content_slope, mean_factor = asyncio.run(paper_model(clean_database))
    assert len(slopes) == 30 and all(slope == 0.0 for slope in slopes)
    assert content_slope is None
    assert mean_factor > 0.01
