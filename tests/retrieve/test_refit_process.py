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
from pathlib import Path

import numpy as np
import psutil
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.db.engine import Database, open_database
from service.ingest.memories import NewMemory, ingest
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
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
        async with open_database(settings) as db:
            await populate(db, settings)
            refits = ChildRefits(db.url, settings)
            try:
                assert await refits.refit(NAMESPACE) is True
                assert multiprocessing.active_children(), "no child process ran the refit"
            finally:
                refits.close()
            in_child = await model_rows(db.engine)
            assert in_child and await queries_since_refit(db.engine) == 0
            assert await InProcessRefits(db.sessions, settings).refit(NAMESPACE) is True
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
        async with open_database(settings) as db:
            await populate(db, settings)
            due = await queries_since_refit(db.engine)
            online = await model_rows(db.engine)  # the rows the retrieves updated online
            refits = ChildRefits(db.url, settings)
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


# A service whose refits run in a child process: one refit, then idle.
SERVICE_WITH_A_REFIT_CHILD = """
import asyncio, sys
from service.db.engine import open_database
from service.retrieve.refit_process import ChildRefits
from service.settings import Settings

async def main() -> None:
    settings = Settings()
    async with open_database(settings) as db:
        await ChildRefits(db.url, settings).refit(sys.argv[1])
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
        async with open_database(settings) as db:
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
