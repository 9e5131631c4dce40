"""The refit's advisory lock ends with the refit's transaction, so refits keep running: a
leaked lock (one left on a pooled connection) would make every later refit of the namespace
return False forever. A due refit runs after the response by default, inside the request with
``refit_in_request``; background refits finish before shutdown."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.engine import open_database
from service.db.namespaces import namespace_state
from service.http.app import create_app
from service.ingest.memories import NewMemory, delete_memory, ingest
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.retrieve.refit_process import InProcessRefits
from service.settings import Settings


async def _refits_and_locks(settings: Settings) -> tuple[list[bool], int]:
    rng = np.random.default_rng(0)
    async with open_database(settings.database) as db:
        pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings,
                                     refit_in_request=True)
        async with db.sessions() as session:
            await ingest(
                session, None, 384, "lock",
                [
                    NewMemory(text=f"m{i}", embedding=rng.normal(size=384).tolist())
                    for i in range(30)
                ],
            )
            await session.commit()

        async def retrieve(i: int) -> None:
            await pipeline.retrieve(RetrieveRequest(
                namespace="lock", query=f"q{i}", query_embedding=rng.normal(size=384).tolist(),
                candidates=20, budget=5,
            ))

        # Concurrent requests leave several idle connections in the pool, so a session that
        # commits and continues would get a different one.
        await asyncio.gather(*(retrieve(i) for i in range(6)))
        results = [await pipeline.refit("lock") for _ in range(3)]
        async with db.engine.connect() as conn:
            held = await conn.scalar(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            )
    return results, int(held)


def test_refit_releases_its_lock_so_later_refits_run(clean_database: str) -> None:
    settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                        refit_every=1, _env_file=None)
    results, held = asyncio.run(_refits_and_locks(settings))
    assert results == [True, True, True]
    assert held == 0


def test_background_refit_runs_after_the_response_and_shutdown_waits_for_it(
    clean_database: str,
) -> None:
    """With the default (background) refits, the retrieve that makes one due answers without
    running it; leaving the app's lifespan waits for it, so nothing is lost at shutdown."""
    settings = Settings(database_url=clean_database, embedder="local", scorer="local",
                        refit_every=1, _env_file=None)
    with TestClient(create_app(settings)) as client:
        response = client.post("/memories", json={"namespace": "bg", "memories": [
            {"text": f"memory {i} about topic {i % 3}"} for i in range(12)]})
        assert response.status_code == 201, response.text
        for i in range(3):
            response = client.post("/retrieve", json={"namespace": "bg", "query": f"topic {i}",
                                                      "candidates": 12, "budget": 6})
            assert response.status_code == 200, response.text
    engine = create_engine(clean_database)
    try:
        with engine.connect() as connection:
            refitted_at, since_refit, slope = connection.execute(text(
                "SELECT last_refit_at, queries_since_refit, content_slope "
                "FROM namespaces WHERE name = 'bg'")).one()
    finally:
        engine.dispose()
    assert refitted_at is not None and slope is not None
    assert since_refit == 0  # the last query's refit ran too, after its response


class GatedRefits:
    """Refits in this process that wait until ``opened`` is set; ``asked`` is set once one is
    asked for."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], settings: Settings) -> None:
        self.inner = InProcessRefits(sessions, settings.completion)
        self.health = self.inner.health
        self.asked = asyncio.Event()
        self.opened = asyncio.Event()

    async def refit(self, namespace: str) -> bool:
        self.asked.set()
        await self.opened.wait()
        return await self.inner.refit(namespace)

    def close(self) -> None:
        self.inner.close()


async def _answered_while_the_refit_waits(
    settings: Settings, refit_in_request: bool
) -> tuple[bool, int]:
    """Whether the retrieve that makes a refit due answers while its refit is held, and the
    namespace's queries since its last refit once the refit has run."""
    rng = np.random.default_rng(0)
    async with open_database(settings.database) as db:
        refits = GatedRefits(db.sessions, settings)
        pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings, refits=refits,
                                     refit_in_request=refit_in_request)
        async with db.sessions() as session:
            await ingest(session, None, 384, "gated", [
                NewMemory(text=f"m{i}", embedding=rng.normal(size=384).tolist())
                for i in range(12)])
            await session.commit()
        retrieve = asyncio.create_task(pipeline.retrieve(RetrieveRequest(
            namespace="gated", query="q", query_embedding=rng.normal(size=384).tolist(),
            candidates=12, budget=4)))
        await asyncio.wait_for(refits.asked.wait(), 60)
        answered, _ = await asyncio.wait({retrieve}, timeout=2.0)
        refits.opened.set()
        await retrieve
        await pipeline.drain()
        async with db.sessions() as session:
            state = await namespace_state(session, "gated")
    return bool(answered), state.queries_since_refit


@pytest.mark.parametrize("refit_in_request", [False, True])
def test_a_due_refit_runs_after_the_response_unless_asked_to_run_inside_the_request(
    clean_database: str, refit_in_request: bool
) -> None:
    """The first retrieve of a namespace makes a refit due (refit_every=1). By default it runs
    in a task of its own: the retrieve answers while the refit is held. With
    ``refit_in_request`` the retrieve awaits it: no answer until the refit may run."""
    settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                        refit_every=1, _env_file=None)
    answered, since_refit = asyncio.run(
        _answered_while_the_refit_waits(settings, refit_in_request)
    )
    assert answered is not refit_in_request
    assert since_refit == 0  # either way the refit ran


def test_an_app_built_to_refit_in_the_request_has_refitted_when_the_retrieve_answers(
    clean_database: str,
) -> None:
    """``create_app(settings, refit_in_request=True)``: the refit each retrieve makes due has
    run by the time the retrieve answers (what replays and benchmarks build the app with)."""
    settings = Settings(database_url=clean_database, embedder="local", scorer="local",
                        refit_every=1, _env_file=None)
    engine = create_engine(clean_database)
    try:
        with TestClient(create_app(settings, refit_in_request=True)) as client:
            response = client.post("/memories", json={"namespace": "inline", "memories": [
                {"text": f"memory {i} about topic {i % 3}"} for i in range(12)]})
            assert response.status_code == 201, response.text
            for i in range(3):
                response = client.post("/retrieve", json={
                    "namespace": "inline", "query": f"topic {i}", "candidates": 12, "budget": 6})
                assert response.status_code == 200, response.text
                with engine.connect() as connection:
                    refitted_at, since_refit = connection.execute(text(
                        "SELECT last_refit_at, queries_since_refit FROM namespaces "
                        "WHERE name = 'inline'")).one()
                assert refitted_at is not None and since_refit == 0, (i, since_refit)
    finally:
        engine.dispose()


def test_deleting_a_memory_while_a_refit_rewrites_the_parameters_does_not_deadlock(
    settings: Settings,
) -> None:
    """The refit's lock order (namespace row, then memory_factors, then a foreign-key share
    lock on each memory) against a delete of one of its memories, made to interleave: the
    delete must queue on the namespace row instead of taking the memory's row first."""
    async def add_memory() -> int:
        async with open_database(settings.database) as database, database.sessions() as session:
            result = await ingest(
                session, None, 384, "agent-1",
                [NewMemory(text="doomed", embedding=np.ones(384).tolist())],
            )
            await session.commit()
            return result.ids[0]

    async def delete_it(memory_id: int) -> None:
        async with open_database(settings.database) as database, database.sessions() as session:
            await delete_memory(session, memory_id, "agent-1")
            await session.commit()

    memory_id = asyncio.run(add_memory())
    engine = create_engine(settings.database_url)
    parameters_sql = text(
        "INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count) "
        "VALUES (:m, 'agent-1', 0, '{0}', 1)"
    )
    with engine.begin() as conn:  # the parameters an earlier refit wrote
        conn.execute(parameters_sql, {"m": memory_id})
    with engine.connect() as refit:
        refit.execute(text("SELECT 1 FROM namespaces WHERE name = 'agent-1' FOR UPDATE"))
        refit.execute(text("DELETE FROM memory_factors WHERE namespace = 'agent-1'"))
        with ThreadPoolExecutor(1) as pool:
            deleting = pool.submit(asyncio.run, delete_it(memory_id))
            time.sleep(0.5)  # the delete is now waiting on the refit
            assert not deleting.done()
            refit.execute(parameters_sql, {"m": memory_id})
            refit.commit()
            deleting.result(timeout=10)  # raised DeadlockDetected before the fix
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT (SELECT count(*) FROM memories), (SELECT count(*) FROM memory_factors)")
        ).one()
    engine.dispose()
    assert tuple(left) == (0, 0)


def test_an_ingest_does_not_wait_for_a_writer_holding_the_namespace(settings: Settings) -> None:
    """A refit holds the namespace's row while it writes the model (seconds at a million
    observations); new memories only need the namespace to exist, so they go in meanwhile."""
    async def scenario() -> float:
        async with open_database(settings.database) as database:
            async with database.sessions() as session:
                await ingest(session, None, 384, "agent-1",
                             [NewMemory(text="first", embedding=np.ones(384).tolist())])
                await session.commit()
            async with database.sessions() as writer, database.sessions() as ingester:
                await namespace_state(writer, "agent-1", for_update=True)  # held from here
                started = time.monotonic()
                await asyncio.wait_for(
                    ingest(ingester, None, 384, "agent-1",
                           [NewMemory(text="second", embedding=np.ones(384).tolist())]),
                    timeout=5,
                )
                await ingester.commit()
                waited = time.monotonic() - started
                await writer.commit()
            return waited

    assert asyncio.run(scenario()) < 2.0
