"""The online update from per-memory sufficient statistics gives the same memory rows as a
re-solve from each memory's whole history (the slow, obvious way), on a replay with refits and
feedback; the stored statistics always equal a rebuild from the live observations."""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.ridge import solve_rows_batch
from service.completion.statistics import RowStatistics
from service.db import memory_rows
from service.db.codecs import factor_matrix
from service.db.engine import open_database
from service.db.namespaces import namespace_state
from service.ingest.memories import NewMemory, ingest
from service.providers.rerank_scorer import RerankScorer
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

NAMESPACE = "replay"
RANK = 4
TOLERANCE = 1e-6


async def _stored_rows(
    session: AsyncSession, memory_ids: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[float] | None], np.ndarray]:
    rows = (
        await session.execute(
            text(
                "SELECT memory_id, bias, factors, statistics, observation_count "
                "FROM memory_factors WHERE memory_id = ANY(:ids) ORDER BY memory_id"
            ),
            {"ids": memory_ids},
        )
    ).all()
    return (
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows]),
        factor_matrix([r[2] for r in rows], RANK),
        [r[3] for r in rows],
        np.array([r[4] for r in rows]),
    )


async def _resolved_from_history(
    session: AsyncSession, memory_ids: np.ndarray, mean: float, reg: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows as a re-solve from the whole history computes them: every observation of each
    memory read back, re-solved with the mean the request saw."""
    history = await memory_rows.memory_row_observations(session, NAMESPACE, memory_ids, RANK)
    rows, compact = np.unique(history.memory_ids, return_inverse=True)
    bias, factors = solve_rows_batch(
        mean, compact, np.arange(len(history.scores)), history.scores,
        history.query_bias + history.query_slope * history.similarities + history.prior_offsets,
        history.query_factors, reg, n_rows=len(rows),
    )
    return rows, bias, factors


async def _assert_statistics_match_a_rebuild(session: AsyncSession) -> int:
    memory_ids = list(
        await session.scalars(text("SELECT memory_id FROM memory_factors ORDER BY memory_id"))
    )
    ids, _, _, stored, counts = await _stored_rows(session, memory_ids)
    history = await memory_rows.memory_row_observations(session, NAMESPACE, ids, RANK)
    rebuilt = history.statistics(ids)
    assert all(packed is not None for packed in stored)
    kept = RowStatistics.unpack(stored, RANK)
    np.testing.assert_allclose(kept.gram, rebuilt.gram, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(kept.moment, rebuilt.moment, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_array_equal(counts, rebuilt.counts)
    return len(ids)


async def _load_observations_in_bulk(session: AsyncSession, rng: np.random.Generator) -> None:
    """A query and its observations written straight into the tables, as `earm bench load`
    does: the query has no parameters until the next refit gives it some."""
    await session.execute(text(
        "INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates, "
        "budget, scorer_calls) SELECT :namespace, next_query_index, 'bulk', "
        "(SELECT embedding FROM memories ORDER BY id LIMIT 1), 'earm', 48, 20, 20 "
        "FROM namespaces WHERE name = :namespace"
    ), {"namespace": NAMESPACE})
    await session.execute(text(
        "INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source) "
        "SELECT (SELECT max(id) FROM queries), m.id, :namespace, :score, 0.5, 'scorer' "
        # memories with history: the refit then rewrites the rows the replay built
        "FROM memories m WHERE EXISTS (SELECT FROM memory_factors f WHERE f.memory_id = m.id) "
        "ORDER BY m.id LIMIT 20"
    ), {"namespace": NAMESPACE, "score": float(rng.uniform())})
    await session.execute(text(
        "UPDATE namespaces SET next_query_index = next_query_index + 1 WHERE name = :namespace"
    ), {"namespace": NAMESPACE})
    await session.commit()


async def _replay(settings: Settings) -> dict[str, int]:
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(4, 384))
    checked = {"requests": 0, "rows": 0, "rows_after_refit": 0}
    async with open_database(settings.database) as db:
        pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings,
                                     refit_in_request=True)
        async with db.sessions() as session:
            await ingest(session, None, 384, NAMESPACE, [
                NewMemory(
                    text=f"memory {i} topic {i % 4}",
                    embedding=(centres[i % 4] + 0.6 * rng.normal(size=384)).tolist(),
                )
                for i in range(48)
            ])
            await session.commit()
        for i in range(24):
            async with db.sessions() as session:
                mean = (await namespace_state(session, NAMESPACE)).mean_score
            result = await pipeline.retrieve(RetrieveRequest(
                namespace=NAMESPACE, query=f"topic {i % 4} question {i}",
                query_embedding=(centres[i % 4] + 0.6 * rng.normal(size=384)).tolist(),
                candidates=24, budget=8, seed=i,
            ))
            async with db.sessions() as session:
                observed = list(await session.scalars(
                    text("SELECT memory_id FROM scores WHERE query_id = :q"),
                    {"q": result.query_id},
                ))
                ids, bias, factors, _, _ = await _stored_rows(session, observed)
                expected = await _resolved_from_history(
                    session, ids, mean, settings.memory_reg
                )
                # Rows rewritten by a refit this request triggered are the refit's, not the
                # online update's: compare only requests that did not refit.
                refitted = (await namespace_state(session, NAMESPACE)).queries_since_refit == 0
                if not refitted:
                    np.testing.assert_array_equal(ids, expected[0])
                    np.testing.assert_allclose(bias, expected[1], atol=TOLERANCE)
                    np.testing.assert_allclose(factors, expected[2], atol=TOLERANCE)
                    checked["requests"] += 1
                checked["rows"] = await _assert_statistics_match_a_rebuild(session)
            if i == 11:
                # Feedback moves a past query's parameters: every row it observed follows.
                await pipeline.feedback(NAMESPACE, result.query_id, [int(m) for m in
                                        range(1, 7)], [0.9, 0.1, 0.8, 0.2, 0.7, 0.3])
                async with db.sessions() as session:
                    await _assert_statistics_match_a_rebuild(session)
        async with db.sessions() as session:
            await _load_observations_in_bulk(session, rng)
        await pipeline.refit(NAMESPACE)
        async with db.sessions() as session:
            checked["rows_after_refit"] = await _assert_statistics_match_a_rebuild(session)
    return checked


def test_online_update_from_statistics_equals_the_resolve_from_history(
    clean_database: str,
) -> None:
    settings = Settings(
        database_url=clean_database, embedder="none", scorer="local", embedding_dim=384,
        rank=RANK, refit_every=8, _env_file=None,
    )
    checked = asyncio.run(_replay(settings))
    # Most requests are compared (refits come at 1, 2, 4, 8, 16 and 24 queries), and the
    # statistics of every row with history, refitted or not.
    assert checked["requests"] >= 15
    assert checked["rows"] >= 30
    assert checked["rows_after_refit"] == checked["rows"]


async def _interleaved(
    settings: Settings, server_url: str, slow_started: asyncio.Event, refit_between: bool
) -> tuple[int, int]:
    """A retrieve whose scorer is slow and, once the slow one is waiting for it, another one
    on the same candidates (or, with ``refit_between``, a full refit): it writes first, so
    every row the slow one read has changed by the time it records. Then one more retrieve
    of the same candidates. Returns the rows left without statistics after the slow one, and
    the rows whose statistics match a rebuild at the end."""
    rng = np.random.default_rng(11)
    centre = rng.normal(size=384)
    async with open_database(settings.database) as db:
        scorer = RerankScorer(base_url=server_url, model="judge", timeout_s=30)
        pipeline = RetrievalPipeline(db.sessions, None, scorer, settings)
        async with db.sessions() as session:
            await ingest(session, None, 384, NAMESPACE, [
                NewMemory(text=f"memory {i}",
                          embedding=(centre + 0.5 * rng.normal(size=384)).tolist())
                for i in range(12)
            ])
            await session.commit()

        def request(query: str) -> RetrieveRequest:
            return RetrieveRequest(
                namespace=NAMESPACE, query=query, candidates=12, budget=12,
                query_embedding=(centre + 0.5 * rng.normal(size=384)).tolist(),
            )

        # Two queries first, so the rows exist with statistics before the interleaving.
        for i in range(2):
            await pipeline.retrieve(request(f"warm {i}"))

        async def once_slow_waits() -> None:
            await slow_started.wait()
            if refit_between:
                assert await pipeline.refit(NAMESPACE)
            else:
                await pipeline.retrieve(request("fast"))

        await asyncio.gather(pipeline.retrieve(request("slow")), once_slow_waits())
        async with db.sessions() as session:
            dropped = await session.scalar(
                text("SELECT count(*) FROM memory_factors WHERE statistics IS NULL")
            )
        await pipeline.retrieve(request("after"))
        async with db.sessions() as session:
            return int(dropped), await _assert_statistics_match_a_rebuild(session)


@pytest.mark.parametrize("refit_between", [False, True], ids=["another-query", "a-refit"])
def test_rows_changed_between_their_read_and_the_record_keep_exact_statistics(
    clean_database: str, refit_between: bool
) -> None:
    """A retrieve reads its anchors' rows while the scorer works and records without reading
    them again. Rows another query updated meanwhile get this query's terms added to what they
    hold; after a refit (which moves the content prior and every query's parameters the update
    was computed with) the rows' statistics are dropped, and rebuilt from their history when
    next observed. Either way, the statistics then equal a rebuild from the live
    observations."""
    settings = Settings(
        database_url=clean_database, embedder="none", scorer="local", embedding_dim=384,
        # Refits only where the test makes one.
        rank=RANK, background_work=False, _env_file=None,
    )
    slow_started = asyncio.Event()
    loop: asyncio.AbstractEventLoop | None = None

    async def judge(query: str, documents: list[str]) -> list[float | None]:
        if query == "slow":
            assert loop is not None
            loop.call_soon_threadsafe(slow_started.set)
            await asyncio.sleep(1.0)  # long enough for the fast retrieve to record
        return [(zlib.crc32(f"{query}|{d}".encode()) % 1000) / 1000 for d in documents]

    async def run(url: str) -> tuple[int, int]:
        nonlocal loop
        loop = asyncio.get_running_loop()
        return await _interleaved(settings, url, slow_started, refit_between)

    with LoopbackServer(rerank_app(judge)) as server:
        dropped, rows = asyncio.run(run(server.url))
    # After the refit, the slow query dropped the statistics of the rows it observed, and the
    # next query observing them rebuilt them from their history.
    assert dropped == (12 if refit_between else 0)
    assert rows == 12
