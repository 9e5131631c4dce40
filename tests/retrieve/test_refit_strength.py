"""EARM_FACTOR_REG reaches the stored model: a full refit fits the factors at the weight the
setting names and records it in ``namespaces.factor_reg``; at ``off`` they shrink to
nothing. (The choice of ``auto`` is pinned on known truth in
tests/unit/completion/test_strength.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
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
    """A reranker whose scores are an interaction no similarity explains: high where the
    memory's topic is the query's."""
    return [0.9 if d.endswith(query.split()[1]) else 0.1 for d in documents]


async def refitted(database_url: str, factor_reg: str | float) -> tuple[float | None, float]:
    """The stored weight and the mean |memory factor| after a refit of a namespace that answered
    30 queries, each scoring 12 of its 40 memories."""
    settings = Settings(database_url=database_url, embedder="none", background_work=False,
                        factor_reg=factor_reg, _env_file=None)
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
                namespace="ns", query=f"topic {i % TOPICS}", policy="full", candidates=12,
                budget=12, query_embedding=rng.normal(size=DIM).tolist()))
        assert await refit_namespace(db.sessions, settings, "ns")
        async with db.engine.connect() as conn:
            stored = (await conn.execute(text(
                "SELECT factor_reg FROM namespaces WHERE name = 'ns'"))).scalar_one()
            factors = (await conn.execute(text(
                "SELECT factors FROM memory_factors WHERE namespace = 'ns'"))).scalars().all()
    await scorer.aclose()
    server.stop()
    return stored, float(np.abs(np.array(factors)).mean())


@pytest.mark.parametrize("factor_reg", [0.5, 2.0])
def test_a_refit_fits_and_stores_the_factor_weight_the_setting_names(
    clean_database: str, factor_reg: float
) -> None:
    stored, mean_factor = asyncio.run(refitted(clean_database, factor_reg))
    assert stored == factor_reg
    assert mean_factor > 1e-3


def test_off_stores_no_weight_and_its_factors_shrink_to_nothing(clean_database: str) -> None:
    stored, mean_factor = asyncio.run(refitted(clean_database, "off"))
    assert stored is None
    assert mean_factor < 1e-3
