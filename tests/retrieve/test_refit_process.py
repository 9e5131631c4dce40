"""Full refits in a child process (EARM_REFIT_PROCESS=child, the default): the child writes the
model the serving process would have written; a child killed mid-refit costs a failed refit,
not a request or the namespace's turn (it stays due, and the next refit starts a new child)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np
import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.db.engine import Database, open_database
from service.http.app import create_app
from service.ingest.memories import NewMemory, ingest
from service.providers.factory import scorer_source
from service.providers.scorers import LocalScorer
from service.retrieve.learning import Learner
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.retrieve.refit_health import RefitHealth, RefitOutcome
from service.retrieve.refit_process import ChildRefits, InProcessRefits, RefitChildDied
from service.settings import Settings

NAMESPACE = "refits"
WAIT_S = 60  # a bound on what a broken child makes the test wait, not a latency target


@pytest.fixture
def settings(clean_database: str) -> Settings:
    # No refit while the namespace is populated (a young namespace's refits are due at every
    # doubling of its queries, and one still running would race the test's): each test runs
    # the refits it looks at.
    return Settings(database_url=clean_database, embedder="none", scorer="local",
                    background_work=False, _env_file=None)


async def populate(db: Database, settings: Settings) -> None:
    rng = np.random.default_rng(0)
    async with db.sessions() as session:
        memories = [NewMemory(text=f"m{i}", embedding=rng.normal(size=384).tolist())
                    for i in range(40)]
        await ingest(session, None, 384, NAMESPACE, memories)
        await session.commit()
    pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
    for i in range(8):
        await pipeline.retrieve(RetrieveRequest(
            namespace=NAMESPACE, query=f"q{i}", query_embedding=rng.normal(size=384).tolist(),
            candidates=30, budget=10,
        ))


async def model_rows(engine: AsyncEngine) -> dict[int, tuple[float, list[float]]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT memory_id, bias, factors FROM memory_factors"))
        return {memory_id: (bias, factors) for memory_id, bias, factors in rows}


async def queries_since_refit(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(
            text("SELECT queries_since_refit FROM namespaces WHERE name = :name"),
            {"name": NAMESPACE},
        ))


async def until_the_refit_waits(engine: AsyncEngine) -> None:
    """Poll pg_stat_activity until a backend waits for a lock (the refit, at the row held)."""
    for _ in range(WAIT_S * 20):
        async with engine.connect() as conn:
            waiting = await conn.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ))
        if waiting:
            return
        await asyncio.sleep(0.05)
    pytest.fail("the refit never reached the namespace's row")


def test_a_child_process_refit_writes_the_model_an_in_process_refit_writes(
    settings: Settings,
) -> None:
    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            refits = ChildRefits(db.url, settings.learning)
            try:
                assert await refits.refit(NAMESPACE) is True
                assert multiprocessing.active_children(), "no child process ran the refit"
            finally:
                refits.close()
            in_child = await model_rows(db.engine)
            assert in_child and await queries_since_refit(db.engine) == 0
            assert await InProcessRefits(db.sessions, settings.completion).refit(NAMESPACE) is True
            in_process = await model_rows(db.engine)
        assert in_child.keys() == in_process.keys()
        for memory_id, (bias, factors) in in_child.items():
            assert bias == pytest.approx(in_process[memory_id][0], abs=1e-9)
            np.testing.assert_allclose(factors, in_process[memory_id][1], atol=1e-6)

    asyncio.run(scenario())


def test_a_refit_child_killed_mid_refit_leaves_the_namespace_due_and_the_next_refit_runs(
    settings: Settings,
) -> None:
    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            due = await queries_since_refit(db.engine)
            online = await model_rows(db.engine)  # the rows the retrieves updated online
            refits = ChildRefits(db.url, settings.learning)
            try:
                # The namespace's row held: the child's refit waits at its first statement
                # until it is killed, whatever the machine's speed.
                async with db.engine.connect() as holder:
                    await holder.execute(
                        text("SELECT FROM namespaces WHERE name = :name FOR UPDATE"),
                        {"name": NAMESPACE},
                    )
                    refit = asyncio.create_task(refits.refit(NAMESPACE))
                    await until_the_refit_waits(db.engine)
                    for child in multiprocessing.active_children():
                        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
                    with pytest.raises(RefitChildDied):
                        await refit
                    await holder.rollback()
                assert await queries_since_refit(db.engine) == due  # still due
                assert await model_rows(db.engine) == online  # nothing written
                assert await refits.refit(NAMESPACE) is True  # a new child
                assert await queries_since_refit(db.engine) == 0
                assert await model_rows(db.engine) != online
            finally:
                refits.close()

    asyncio.run(scenario())


async def idle_child_after_a_refit(refits: ChildRefits) -> list[BaseProcess]:
    """The refit process(es), idle after a first refit that succeeded."""
    assert await refits.refit(NAMESPACE) is True
    children = multiprocessing.active_children()
    assert children, "no refit child"
    return children


def test_a_refit_child_killed_while_idle_is_replaced_and_the_next_refit_runs(
    settings: Settings,
) -> None:
    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            refits = ChildRefits(db.url, settings.learning)
            try:
                for child in await idle_child_after_a_refit(refits):
                    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
                    child.join(WAIT_S)
                await populate_more(db, settings)
                assert await queries_since_refit(db.engine) > 0
                # The dead child was between refits: no refit was lost, the next one runs.
                assert await refits.refit(NAMESPACE) is True
                assert await queries_since_refit(db.engine) == 0
                assert await refits.refit(NAMESPACE) is True  # and so does every later one
            finally:
                refits.close()

    asyncio.run(scenario())


def test_a_terminals_ctrl_c_leaves_the_refit_child_to_its_service(settings: Settings) -> None:
    """Ctrl-C signals the terminal's whole process group: the idle refit child must not die of
    it (with a KeyboardInterrupt traceback on the operator's terminal); the service decides
    when to stop, and its child goes with it."""

    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            refits = ChildRefits(db.url, settings.learning)
            try:
                children = await idle_child_after_a_refit(refits)
                for child in children:
                    os.kill(child.pid, signal.SIGINT)  # type: ignore[arg-type]
                    child.join(1.0)
                    assert child.is_alive(), "the refit child died of SIGINT"
                await populate_more(db, settings)
                assert await refits.refit(NAMESPACE) is True
                assert multiprocessing.active_children() == children  # the same child refits
            finally:
                refits.close()

    asyncio.run(scenario())


async def populate_more(db: Database, settings: Settings) -> None:
    rng = np.random.default_rng(1)
    pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
    await pipeline.retrieve(RetrieveRequest(
        namespace=NAMESPACE, query="again", query_embedding=rng.normal(size=384).tolist(),
        candidates=30, budget=10,
    ))


def test_a_refit_that_fails_shows_in_the_refits_health_and_the_next_success_clears_it(
    settings: Settings,
) -> None:
    outcomes: list[RefitOutcome] = []

    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            refits = ChildRefits(db.url, settings.learning, RefitHealth(outcomes.append))
            source = scorer_source(settings.scoring)
            learner = Learner(db.sessions, settings.learning, source, refits)
            try:
                async with db.engine.connect() as holder:
                    await holder.execute(
                        text("SELECT FROM namespaces WHERE name = :name FOR UPDATE"),
                        {"name": NAMESPACE},
                    )
                    refit = asyncio.create_task(learner.refit_logged(NAMESPACE))
                    await until_the_refit_waits(db.engine)
                    for child in multiprocessing.active_children():
                        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
                    assert await refit is False
                    await holder.rollback()
                failing = refits.health.snapshot()
                assert not failing.healthy and failing.consecutive_failures == 1
                assert failing.last_error is not None
                assert failing.last_error.startswith("RefitChildDied")
                assert await learner.refit_logged(NAMESPACE) is True
                assert refits.health.snapshot().healthy
            finally:
                refits.close()

    asyncio.run(scenario())
    assert outcomes == [RefitOutcome.FAILED, RefitOutcome.REFITTED]


def test_a_served_apps_idle_refit_child_killed_costs_no_refit_and_readyz_and_metrics_say_so(
    settings: Settings,
) -> None:
    app_settings = settings.model_copy(update={"background_work": True})
    rng = np.random.default_rng(2)
    memories = [{"text": f"m{i}", "embedding": rng.normal(size=384).tolist()}
                for i in range(40)]

    def retrieve(client: TestClient, i: int) -> None:
        response = client.post("/retrieve", json={
            "namespace": NAMESPACE, "query": f"q{i}", "candidates": 30,
            "query_embedding": rng.normal(size=384).tolist(),
        })
        assert response.status_code == 200, response.text

    with TestClient(create_app(app_settings)) as client:
        assert client.post(
            "/memories", json={"namespace": NAMESPACE, "memories": memories}
        ).status_code == 201
        pipeline = client.app.state.components.pipeline  # type: ignore[attr-defined]
        for i in range(4):  # a young namespace refits at each doubling of its queries
            retrieve(client, i)
        client.portal.call(pipeline.drain)  # type: ignore[union-attr]
        children = multiprocessing.active_children()
        assert children, "no refit ran in a child"
        for child in children:
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(WAIT_S)
        for i in range(4, 16):
            retrieve(client, i)
            client.portal.call(pipeline.drain)  # type: ignore[union-attr]
        ready = client.get("/readyz").json()
        metrics = client.get("/metrics").text
    assert ready["refits"]["healthy"] is True
    assert ready["refits"]["consecutive_failures"] == 0
    refitted = [line for line in metrics.splitlines()
                if line.startswith('earm_refits_total{outcome="refitted"}')]
    assert refitted and float(refitted[0].split()[-1]) >= 2
    assert 'earm_refits_total{outcome="failed"}' not in metrics


# A service whose refits run in a child process: one refit, then idle.
SERVICE_WITH_A_REFIT_CHILD = """
import asyncio, sys
from service.db.engine import open_database
from service.retrieve.refit_process import ChildRefits
from service.settings import Settings

async def main() -> None:
    settings = Settings()
    async with open_database(settings.database) as db:
        await ChildRefits(db.url, settings.learning).refit(sys.argv[1])
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def running(process: psutil.Process) -> bool:
    try:
        # a zombie has ended; only its parent's wait is missing
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the death signal is Linux's (prctl)")
def test_a_service_killed_mid_refit_takes_its_refit_processes_and_the_refit_with_it(
    settings: Settings, tmp_path: Path
) -> None:
    environment = os.environ | {
        "EARM_DATABASE_URL": settings.database_url, "EARM_EMBEDDER": "none",
        "EARM_SCORER": "local", "EARM_BACKGROUND_WORK": "false",
    }

    async def scenario() -> None:
        async with open_database(settings.database) as db:
            await populate(db, settings)
            due = await queries_since_refit(db.engine)
            # The namespace's row held: the refit waits at its first statement.
            async with db.engine.connect() as holder:
                await holder.execute(
                    text("SELECT FROM namespaces WHERE name = :name FOR UPDATE"),
                    {"name": NAMESPACE},
                )
                service = subprocess.Popen(
                    [sys.executable, "-c", SERVICE_WITH_A_REFIT_CHILD, NAMESPACE],
                    cwd=tmp_path, env=environment,
                )
                try:
                    await until_the_refit_waits(db.engine)
                    # the fork server, the refit child, multiprocessing's resource tracker
                    helpers = psutil.Process(service.pid).children(recursive=True)
                    assert len(helpers) >= 2
                finally:
                    service.kill()
                    service.wait()
                deadline = time.monotonic() + WAIT_S
                while any(running(helper) for helper in helpers):
                    assert time.monotonic() < deadline, "a refit process outlived its service"
                    await asyncio.sleep(0.05)
                await holder.rollback()
            assert await queries_since_refit(db.engine) == due  # the refit was abandoned

    asyncio.run(scenario())
