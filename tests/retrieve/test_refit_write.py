"""A refit's write reads what changed since its horizon from the scores recorded since, not from
every observation: what it stores must still equal a recomputation from scratch, whatever
happened between its read and its write (a retrieve recorded, feedback given, a memory deleted
or edited), and to the last bit when nothing did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.statistics import RowStatistics
from service.db import memory_rows, model_state
from service.db.engine import Database, open_database
from service.ingest.edits import update_memory
from service.ingest.memories import NewMemory, delete_memory, ingest
from service.ingest.records import MemoryPatch
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.retrieve.refit import refit_namespace
from service.settings import Settings

NAMESPACE = "refit-write"
RANK = 4

_FROM_SCRATCH_SQL = text(
    "SELECT coalesce(sum(score::text::float8 ORDER BY query_id, memory_id), 0), count(*) "
    "FROM scores WHERE namespace = :ns AND retired_at IS NULL"
)
_PAIRS_SQL = text(
    "SELECT query_id, memory_id FROM scores WHERE namespace = :ns AND retired_at IS NULL"
)
# The rows whose statistics do not hold every live observation of a query with parameters.
_STALE_SQL = text(
    "SELECT f.memory_id FROM memory_factors f WHERE f.namespace = :ns AND f.observation_count <> "
    "(SELECT count(*) FROM scores s JOIN query_factors q ON q.namespace = s.namespace "
    " AND q.query_id = s.query_id WHERE s.namespace = :ns AND s.memory_id = f.memory_id "
    " AND s.retired_at IS NULL) ORDER BY 1"
)


def _settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, embedder="none", scorer="local", rank=RANK,
                    refit_every=10_000, _env_file=None)


async def _retrieve(pipeline: RetrievalPipeline, rng: np.random.Generator, i: int) -> int:
    result = await pipeline.retrieve(RetrieveRequest(
        namespace=NAMESPACE, query=f"question {i}", query_embedding=rng.normal(size=384).tolist(),
        candidates=16, budget=6, seed=i,
    ))
    assert result.query_id is not None
    return int(result.query_id)


Meanwhile = Callable[[Database, RetrievalPipeline, int], Awaitable[None]]


async def _nothing(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    return None


async def _record(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    await _retrieve(pipeline, np.random.default_rng(99), 99)


async def _feedback(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    await pipeline.feedback(NAMESPACE, query_id, [1, 2, 30], [0.9, 0.1, 0.7])


async def _delete(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    async with db.sessions() as session:
        observed = await _observed_memory(session)
        await delete_memory(session, observed, NAMESPACE)
        await session.commit()


async def _edit(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    async with db.sessions() as session:
        observed = await _observed_memory(session)
        patch = MemoryPatch(text="edited", embedding=np.ones(384).tolist())
        await update_memory(session, None, 384, observed, patch)
        await session.commit()


async def _late_scores(db: Database, pipeline: RetrievalPipeline, query_id: int) -> None:
    """Scores of a query the refit fitted, recorded after its read (as the late anchors of an
    answer deadline are), of memories it had not observed (which other queries had)."""
    async with db.sessions() as session:
        unobserved = list(await session.scalars(text(
            "SELECT DISTINCT memory_id FROM scores WHERE namespace = :ns AND memory_id NOT IN "
            "(SELECT memory_id FROM scores WHERE namespace = :ns AND query_id = :q) "
            "ORDER BY 1 LIMIT 5"
        ), {"ns": NAMESPACE, "q": query_id}))
        # As the query's scorer gave its other scores: a refit may rescale that source's.
        scored_by = await session.scalar(text(
            "SELECT min(scored_by) FROM scores WHERE namespace = :ns AND query_id = :q"
        ), {"ns": NAMESPACE, "q": query_id})
        for i, memory_id in enumerate(unobserved):
            await session.execute(text(
                "INSERT INTO scores (query_id, memory_id, namespace, score, raw_score, "
                "similarity, source, scored_by, created_at) VALUES (:q, :m, :ns, :score, "
                ":score, :similarity, 'scorer', :scored_by, clock_timestamp())"
            ), {"q": query_id, "m": memory_id, "ns": NAMESPACE, "score": 0.2 + 0.15 * i,
                "similarity": 0.1 + 0.05 * i, "scored_by": scored_by})
        await session.commit()


async def _record_and_late_scores(
    db: Database, pipeline: RetrievalPipeline, query_id: int
) -> None:
    await _record(db, pipeline, query_id)
    await _late_scores(db, pipeline, query_id)


async def _observed_memory(session: AsyncSession) -> int:
    return int(await session.scalar(text(
        "SELECT min(memory_id) FROM scores WHERE namespace = :ns AND retired_at IS NULL"
    ), {"ns": NAMESPACE}))


async def _refit_with(
    settings: Settings, meanwhile: Meanwhile, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    async with open_database(settings.database) as db:
        pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings,
                                     refit_in_request=True)
        async with db.sessions() as session:
            await ingest(session, None, 384, NAMESPACE, [
                NewMemory(text=f"memory {i}", embedding=rng.normal(size=384).tolist())
                for i in range(40)
            ])
            await session.commit()
        query_ids = [await _retrieve(pipeline, rng, i) for i in range(12)]
        replace_model = model_state.replace_model

        observed_since: list[int] = []

        async def after_the_read(*args: Any, **kwargs: Any) -> None:
            # Between the refit's read and its write: past its horizon, before its lock.
            async with db.sessions() as session:
                before = set((await session.execute(_PAIRS_SQL, {"ns": NAMESPACE})).all())
            await meanwhile(db, pipeline, query_ids[-1])
            async with db.sessions() as session:
                after = set((await session.execute(_PAIRS_SQL, {"ns": NAMESPACE})).all())
            observed_since.extend(sorted({int(m) for _, m in after - before}))
            await replace_model(*args, **kwargs)

        monkeypatch.setattr(model_state, "replace_model", after_the_read)
        assert await refit_namespace(db.sessions, settings.completion, NAMESPACE)
        async with db.sessions() as session:
            stored = (await session.execute(text(
                "SELECT score_sum, score_count FROM namespaces WHERE name = :ns"
            ), {"ns": NAMESPACE})).one()
            scratch = (await session.execute(_FROM_SCRATCH_SQL, {"ns": NAMESPACE})).one()
            stale = list(await session.scalars(_STALE_SQL, {"ns": NAMESPACE}))
            rows = (await session.execute(text(
                "SELECT memory_id, statistics FROM memory_factors WHERE namespace = :ns "
                "ORDER BY memory_id"
            ), {"ns": NAMESPACE})).all()
            kept = [r for r in rows if r[1] is not None]
            history = await memory_rows.memory_row_observations(
                session, NAMESPACE, np.array([r[0] for r in kept], dtype=np.int64), RANK
            )
            rebuilt = history.statistics(np.array([r[0] for r in kept], dtype=np.int64))
    return {
        "stored": tuple(stored), "scratch": tuple(scratch), "stale": stale,
        "observed_since": sorted(set(observed_since) & {int(r[0]) for r in rows}),
        "dropped": [int(r[0]) for r in rows if r[1] is None],
        "kept": RowStatistics.unpack([r[1] for r in kept], RANK) if kept else None,
        "rebuilt": rebuilt,
    }


@pytest.mark.parametrize(
    "meanwhile", [_nothing, _record, _late_scores, _feedback, _delete, _edit],
    ids=["nothing", "record", "late-scores", "feedback", "delete", "edit"],
)
def test_a_refit_stores_what_a_recomputation_from_scratch_gives(
    clean_database: str, meanwhile: Meanwhile, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = asyncio.run(_refit_with(_settings(clean_database), meanwhile, monkeypatch))
    (score_sum, score_count), (scratch_sum, scratch_count) = found["stored"], found["scratch"]
    # The running mean counts every live score, those recorded while the refit ran too.
    assert score_count == scratch_count
    if meanwhile is _nothing:
        assert score_sum == scratch_sum  # the read's sum in key order: to the last bit
    else:
        assert score_sum == pytest.approx(scratch_sum, rel=1e-12)
    # No row is left without statistics or misses a live observation, and each row's equal a
    # rebuild from its history.
    assert found["dropped"] == []
    assert found["stale"] == []
    if found["kept"] is not None:
        np.testing.assert_allclose(found["kept"].gram, found["rebuilt"].gram, atol=1e-9)
        np.testing.assert_allclose(found["kept"].moment, found["rebuilt"].moment, atol=1e-9)
        np.testing.assert_array_equal(found["kept"].counts, found["rebuilt"].counts)


@pytest.mark.parametrize(
    "meanwhile", [_record, _late_scores, _record_and_late_scores],
    ids=["record", "late-scores", "both"],
)
def test_rows_observed_while_the_refit_ran_keep_the_statistics_of_a_rebuild(
    clean_database: str, meanwhile: Meanwhile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memories observed between the refit's read and its write (by a query recorded then, or
    by late scores of a query the refit fitted) get rows holding those observations too: equal
    to a rebuild from their history with the parameters and prior the write stored, and none
    left for the next retrieve to rebuild."""
    found = asyncio.run(_refit_with(_settings(clean_database), meanwhile, monkeypatch))
    assert found["observed_since"], "memories with rows were observed while the refit ran"
    assert found["dropped"] == []
    assert found["stale"] == []
    assert found["stored"][1] == found["scratch"][1]
    np.testing.assert_allclose(found["kept"].gram, found["rebuilt"].gram, atol=1e-9)
    np.testing.assert_allclose(found["kept"].moment, found["rebuilt"].moment, atol=1e-9)
    np.testing.assert_array_equal(found["kept"].counts, found["rebuilt"].counts)
