"""A retrieve records every candidate it scored, up to ``EARM_MAX_CANDIDATES`` (1,000): its
observations, trace and the online update of each observed memory's row. Such a record is some
hundreds of KB of parameters; sent as one pipeline it once outgrew the socket's buffer, and
psycopg's async pipeline then waited for an answer while the server waited for the rest of the
statement, for ever, holding the namespace's lock. Each retrieve here is bounded, so a hang fails
the test instead of wedging it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from sqlalchemy import text

from service.db.engine import open_database
from service.ingest.memories import NewMemory, ingest
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.settings import Settings

NAMESPACE = "large"
#: A bound on what a hang makes the test wait, not a latency target.
WAIT_S = 60


@pytest.fixture
def settings(clean_database: str) -> Settings:
    return Settings(database_url=clean_database, embedder="none", scorer="local",
                    background_work=False, _env_file=None)


def test_retrieves_that_score_the_largest_allowed_candidate_set_are_recorded_every_time(
    settings: Settings,
) -> None:
    size = settings.max_candidates
    rng = np.random.default_rng(0)

    async def scenario() -> None:
        async with open_database(settings.database) as db:
            async with db.sessions() as session:
                memories = [NewMemory(text=f"m{i}", embedding=rng.normal(size=384).tolist())
                            for i in range(size)]
                await ingest(session, None, 384, NAMESPACE, memories)
                await session.commit()
            pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
            # The first records observations only; the next ones also update every observed
            # memory's row online (what made the record outgrow the socket).
            for i in range(3):
                result = await asyncio.wait_for(pipeline.retrieve(RetrieveRequest(
                    namespace=NAMESPACE, query=f"q{i}", candidates=size,
                    query_embedding=rng.normal(size=384).tolist(), policy="full",
                )), WAIT_S)
                assert result.query_id is not None
                assert result.scorer_calls == size
            async with db.engine.connect() as conn:
                stored = await conn.scalar(text("SELECT count(*) FROM scores"))
        assert stored == 3 * size

    asyncio.run(scenario())
