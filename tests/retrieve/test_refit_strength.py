"""What a full refit stores follows the settings: EARM_FACTOR_REG's weight, recorded in
``namespaces.factor_reg`` (at ``off`` the factors shrink to nothing), and EARM_PROFILE=paper's
plain model. (The choice of ``auto`` is pinned on known truth in
tests/unit/completion/test_strength.py.)"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class StoredModel:
    factor_reg: float | None  # namespaces.factor_reg
    content_slope: float | None  # namespaces.content_slope (None: no content prior)
    query_slopes: list[float]
    mean_factor: float  # mean |memory factor|


async def refitted(
    database_url: str, policy: str = "full", candidates: int = 12, budget: int = 12,
    **settings: Any,
) -> StoredModel:
    """The stored model after a refit of a namespace of 40 memories that answered 30 queries
    of ``policy``, each scoring ``budget`` of its ``candidates`` (``settings``: the service's)."""
    service = Settings(database_url=database_url, embedder="none", background_work=False,
                       _env_file=None, **settings)
    server = LoopbackServer(rerank_app(topic_match)).start()
    scorer = RerankScorer(base_url=server.url, model="reranker", protocol="rerank")
    rng = np.random.default_rng(0)
    async with open_database(service.database) as db:
        async with db.sessions() as session:
            await ingest(session, None, DIM, "ns", [
                NewMemory(text=f"memory {i} about topic {i % TOPICS}",
                          embedding=rng.normal(size=DIM).tolist())
                for i in range(40)])
            await session.commit()
        pipeline = RetrievalPipeline(db.sessions, None, scorer, service)
        for i in range(30):
            await pipeline.retrieve(RetrieveRequest(
                namespace="ns", query=f"topic {i % TOPICS}", policy=policy,
                candidates=candidates, budget=budget,
                query_embedding=rng.normal(size=DIM).tolist()))
        assert await refit_namespace(db.sessions, service.completion, "ns")
        async with db.engine.connect() as conn:
            factor_reg, content_slope = (await conn.execute(text(
                "SELECT factor_reg, content_slope FROM namespaces WHERE name = 'ns'"))).one()
            slopes = (await conn.execute(text(
                "SELECT slope FROM query_factors WHERE namespace = 'ns'"))).scalars().all()
            factors = (await conn.execute(text(
                "SELECT factors FROM memory_factors WHERE namespace = 'ns'"))).scalars().all()
    await scorer.aclose()
    server.stop()
    return StoredModel(factor_reg, content_slope, list(slopes),
                       float(np.abs(np.array(factors)).mean()))


@pytest.mark.parametrize("factor_reg", [0.5, 2.0])
def test_a_refit_fits_and_stores_the_factor_weight_the_setting_names(
    clean_database: str, factor_reg: float
) -> None:
    stored = asyncio.run(refitted(clean_database, factor_reg=factor_reg))
    assert stored.factor_reg == factor_reg
    assert stored.mean_factor > 1e-3


def test_off_stores_no_weight_and_its_factors_shrink_to_nothing(clean_database: str) -> None:
    stored = asyncio.run(refitted(clean_database, factor_reg="off"))
    assert stored.factor_reg is None
    assert stored.mean_factor < 1e-3


def test_the_paper_profile_stores_a_plain_model(clean_database: str) -> None:
    """EARM_PROFILE=paper: the plain model is fitted and folded in without similarities or
    content, so every query's slope is 0 and the namespace has no content prior, while its
    factors, weighted as the paper's balanced model weights them, carry signal."""
    stored = asyncio.run(refitted(clean_database, policy="earm", candidates=20, budget=8,
                                  profile="paper"))
    assert len(stored.query_slopes) == 30 and all(s == 0.0 for s in stored.query_slopes)
    assert stored.content_slope is None
    assert stored.mean_factor > 0.01
