"""Deletes racing retrieves, feedback and refits: a memory deleted while a
request works with it is simply left out of what is written afterwards, never a foreign-key
violation (a 500, or a refit that fails and leaves the namespace un-refitted).

The deterministic tests interleave the steps precisely (the delete lands between a request's
read and its write); the last one runs all three at once for a few seconds."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database, open_database
from service.db.experience import record_feedback
from service.db.namespaces import erase_namespace, namespace_state
from service.errors import NotFound
from service.http.app import create_app
from service.ingest.memories import MemoryPatch, NewMemory, delete_memory, ingest, update_memory
from service.providers.scorers import LocalScorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

T = TypeVar("T")

DIM = 384
NAMESPACE = "agent-1"


def vector(seed: int) -> list[float]:
    return np.random.default_rng(seed).normal(size=DIM).tolist()


# ------------------------------------------------------------- delete between search and record


class DeletingJudge:
    """A judge that, on the first pair it is asked about, deletes ``victims`` the way
    DELETE /memories/{id} does (namespace row lock, then the rows), and commits: the retrieve
    has searched and is scoring, and records after the judge answers."""

    def __init__(self, database_url: str) -> None:
        self.engine = create_engine(database_url)
        self.victims: list[int] = []
        self._lock = threading.Lock()

    def reply(self, prompt: str) -> str:
        with self._lock:
            if self.victims:
                with self.engine.begin() as conn:
                    conn.execute(
                        text("SELECT 1 FROM namespaces WHERE name = :ns FOR NO KEY UPDATE"),
                        {"ns": NAMESPACE},
                    )
                    conn.execute(
                        text("DELETE FROM memories WHERE id = ANY(:ids)"), {"ids": self.victims}
                    )
                self.victims = []
        return "0.5"


@pytest.fixture
def deleting_judge(clean_database: str) -> Iterator[tuple[DeletingJudge, str]]:
    judge = DeletingJudge(clean_database)
    try:
        with LoopbackServer(chat_completions_app(judge.reply)) as server:
            yield judge, server.url
    finally:
        judge.engine.dispose()


def test_a_memory_deleted_between_search_and_record_gets_no_observation_and_the_answer_is_given(
    judge_settings: Callable[..., Settings],
    deleting_judge: tuple[DeletingJudge, str],
    clean_database: str,
) -> None:
    judge, judge_url = deleting_judge
    with TestClient(create_app(judge_settings(judge_url, embedder="none"))) as client:
        created = client.post(
            "/memories",
            json={"namespace": NAMESPACE,
                  "memories": [{"text": f"memory {i}", "embedding": vector(i)} for i in range(12)]},
        )
        assert created.status_code == 201, created.text
        ids = created.json()["ids"]
        judge.victims = ids[:5]
        response = client.post(
            "/retrieve",
            json={"namespace": NAMESPACE, "query": "q", "query_embedding": vector(99),
                  "candidates": 12, "policy": "full", "k": 5},
        )
        assert response.status_code == 200, response.text  # was 500 (ForeignKeyViolation)
        assert not judge.victims  # the delete did happen mid-request
        body = response.json()
        assert body["scorer_calls"] == 12 and not body["degraded"]
        # The namespace goes on serving and learning.
        again = client.post(
            "/retrieve",
            json={"namespace": NAMESPACE, "query": "q2", "query_embedding": vector(98),
                  "candidates": 12, "policy": "full"},
        )
        assert again.status_code == 200, again.text

    engine = create_engine(clean_database)
    try:
        with engine.connect() as conn:
            observed = set(conn.execute(
                text("SELECT memory_id FROM scores WHERE query_id = :q"), {"q": body["query_id"]}
            ).scalars())
            score_count, = conn.execute(
                text("SELECT score_count FROM namespaces WHERE name = :ns"), {"ns": NAMESPACE}
            ).one()
    finally:
        engine.dispose()
    assert observed == set(ids[5:])  # the survivors, each observed once
    assert score_count == 2 * len(ids[5:])  # the running mean counts what was recorded


# ------------------------------------------------- delete between a read and a locked write


def pipeline_settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, embedder="none", scorer="local",
                    refit_every=1000, _env_file=None)


@asynccontextmanager
async def observed_namespace(
    database_url: str,
) -> AsyncIterator[tuple[Database, RetrievalPipeline, list[int]]]:
    """A pipeline over a namespace of twenty memories, every one observed by four queries:
    the database, the pipeline and the memories' ids."""
    settings = pipeline_settings(database_url)
    async with open_database(settings.database) as database:
        pipeline = RetrievalPipeline(database.sessions, None, LocalScorer(), settings,
                                     refit_in_request=True)
        async with database.sessions() as session:
            result = await ingest(
                session, None, DIM, NAMESPACE,
                [NewMemory(text=f"m{i}", embedding=vector(i)) for i in range(20)],
            )
            await session.commit()
        for i in range(4):
            await pipeline.retrieve(RetrieveRequest(
                namespace=NAMESPACE, query=f"q{i}", query_embedding=vector(100 + i),
                candidates=20, policy="full",
            ))
        yield database, pipeline, result.ids


async def wait_until_waiting_for_a_lock(database: Database, request: asyncio.Task[Any]) -> None:
    """Poll pg_stat_activity until some backend waits for a lock (up to 30 s: the machine may
    be loaded by other test runs); fail at once if ``request`` ends without waiting."""
    # Autocommit, so each poll is its own transaction: a transaction sees pg_stat_activity as
    # it was at its first read, and a request that was still connecting then would never be
    # seen waiting (the cause of this file's intermittent failures).
    async with database.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        for _ in range(1200):
            if request.done():
                raise AssertionError(f"the request ended without waiting: {request.result()!r}")
            waiting = await conn.scalar(text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ))
            if waiting:
                return
            await asyncio.sleep(0.025)
    raise AssertionError("the request never waited for the namespace lock")


async def delete_while_blocked(
    database: Database, memory_id: int, start_request: Callable[[], Coroutine[Any, Any, T]]
) -> asyncio.Task[T]:
    """Take the namespace lock (as DELETE /memories/{id} does), only then start the request
    (so it cannot take the lock first), wait until it waits for the lock, then delete the
    memory and commit, so the request resumes after the delete; the request's task."""
    async with database.sessions() as deleter:
        await namespace_state(deleter, NAMESPACE, for_update=True)
        request = asyncio.create_task(start_request())
        await wait_until_waiting_for_a_lock(database, request)
        assert not request.done()
        await delete_memory(deleter, memory_id, NAMESPACE)
        await deleter.commit()
    return request


async def refit_held_after_its_read(
    database: Database, pipeline: RetrievalPipeline, holder: AsyncSession
) -> asyncio.Task[bool]:
    """Start a refit that waits right after reading the observations: ``holder`` takes the
    memories table, which the refit reads next (the embeddings); the refit's task, once it
    waits. What ``holder`` writes before committing lands between the refit's read and write."""
    await holder.execute(text("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE"))
    refit = asyncio.create_task(pipeline.refit(NAMESPACE))
    await wait_until_waiting_for_a_lock(database, refit)
    return refit


async def model_rows(database: Database) -> dict[int, int]:
    """Observation count per memory with a model row."""
    async with database.engine.connect() as conn:
        return dict((await conn.execute(
            text("SELECT memory_id, observation_count FROM memory_factors")
        )).all())


def test_a_refit_skips_a_memory_deleted_while_it_fitted_and_completes(
    clean_database: str,
) -> None:
    async def scenario() -> tuple[bool, list[int], set[int], tuple]:
        async with observed_namespace(clean_database) as (database, pipeline, ids):
            # The refit reads the observations, fits, then waits for the namespace row to
            # write the model: the delete commits in between.
            refit = await delete_while_blocked(
                database, ids[0], lambda: pipeline.refit(NAMESPACE)
            )
            refitted = await refit  # raised ForeignKeyViolation (the COPY) before the fix
            async with database.engine.connect() as conn:
                with_parameters = set((await conn.execute(
                    text("SELECT memory_id FROM memory_factors")
                )).scalars())
                state = tuple((await conn.execute(text(
                    "SELECT last_refit_at IS NOT NULL, queries_since_refit, score_count "
                    "FROM namespaces"
                ))).one())
        return refitted, ids, with_parameters, state

    refitted, ids, with_parameters, state = asyncio.run(scenario())
    assert refitted
    assert with_parameters == set(ids[1:])
    assert state == (True, 0, 4 * 19)  # refitted; the mean counts the survivors' observations


def test_feedback_on_a_memory_deleted_meanwhile_is_not_found(clean_database: str) -> None:
    async def scenario() -> None:
        async with observed_namespace(clean_database) as (database, pipeline, ids):
            result = await pipeline.retrieve(RetrieveRequest(
                namespace=NAMESPACE, query="rated", query_embedding=vector(7), candidates=20,
                policy="semantic",
            ))
            feedback = await delete_while_blocked(
                database,
                ids[0],
                lambda: pipeline.feedback(NAMESPACE, result.query_id, [ids[0]], [1.0]),
            )
            with pytest.raises(NotFound):  # was IntegrityError (ForeignKeyViolation): a 500
                await feedback

    asyncio.run(scenario())


def test_a_refit_writes_no_row_for_a_memory_edited_while_it_fitted(clean_database: str) -> None:
    """An edit of the content (PATCH) retires the memory's observations and resets its model row; a
    refit that read those observations before the edit must not write the row back."""
    async def scenario() -> tuple[bool, list[int], dict[int, int], int]:
        async with observed_namespace(clean_database) as (database, pipeline, ids):
            async with database.sessions() as editor:
                refit = await refit_held_after_its_read(database, pipeline, editor)
                patch = MemoryPatch(embedding=vector(777))
                edited = await update_memory(editor, None, DIM, ids[0], patch)
                await editor.commit()
            refitted = await refit
            rows = await model_rows(database)
        return refitted, ids, rows, edited.retired_observations

    refitted, ids, rows, retired = asyncio.run(scenario())
    assert refitted and retired == 4
    assert ids[0] not in rows  # the edit reset it; the refit fitted the old observations
    assert set(rows) == set(ids[1:]) and set(rows.values()) == {4}


def test_a_refit_writes_no_row_for_a_memory_given_feedback_while_it_fitted(
    clean_database: str,
) -> None:
    """Feedback replaces a scorer's observation in place (a correction): the count of the
    memory's observations does not change, so only the refit's horizon tells that the fit read
    the replaced value; it must not write the memory's row back from it."""
    async def scenario() -> tuple[bool, list[int], dict[int, int]]:
        async with observed_namespace(clean_database) as (database, pipeline, ids):
            async with database.sessions() as client:
                refit = await refit_held_after_its_read(database, pipeline, client)
                # What /feedback writes, in the session that holds the memories table.
                await namespace_state(client, NAMESPACE, for_update=True)
                query_id = await client.scalar(
                    text("SELECT min(query_id) FROM scores WHERE memory_id = :m"), {"m": ids[0]}
                )
                written = await record_feedback(
                    client, NAMESPACE, query_id, np.array([ids[0]]), np.array([0.5]),
                    np.array([0.0]),
                )
                await client.commit()
            refitted = await refit
            rows = await model_rows(database)
        assert written.replaced == 1
        return refitted, ids, rows

    refitted, ids, rows = asyncio.run(scenario())
    assert refitted
    assert ids[0] not in rows  # fitted on the scorer's value the feedback replaced
    assert set(rows) == set(ids[1:])


def namespace_row_counts(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return {
                table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in ("namespaces", "memories", "queries", "scores", "score_history",
                              "memory_factors")
            }
    finally:
        engine.dispose()


def test_a_namespace_erased_while_a_refit_fits_stays_erased(clean_database: str) -> None:
    """The refit read the observations before the erase: it writes nothing back afterwards
    (no model row, no namespace row), it fails cleanly as not found."""
    async def scenario() -> int:
        async with observed_namespace(clean_database) as (database, pipeline, _):
            async with database.sessions() as eraser:
                refit = await refit_held_after_its_read(database, pipeline, eraser)
                erased = await erase_namespace(eraser, NAMESPACE)
                await eraser.commit()
            with pytest.raises(NotFound):
                await refit
        return erased.memories

    assert asyncio.run(scenario()) == 20
    assert set(namespace_row_counts(clean_database).values()) == {0}


class ErasingJudge(DeletingJudge):
    """A judge that, on the first pair it is asked about, erases the namespace the way
    DELETE /namespaces/{namespace} does (its row locked FOR UPDATE, then everything of it)."""

    erase = False

    def reply(self, prompt: str) -> str:
        with self._lock:
            if self.erase:
                with self.engine.begin() as conn:
                    conn.execute(text("SELECT 1 FROM namespaces WHERE name = :ns FOR UPDATE"),
                                 {"ns": NAMESPACE})
                    conn.execute(text("DELETE FROM memories WHERE namespace = :ns"),
                                 {"ns": NAMESPACE})
                    conn.execute(text("DELETE FROM namespaces WHERE name = :ns"),
                                 {"ns": NAMESPACE})
                self.erase = False
        return "0.5"


def test_a_retrieve_whose_namespace_is_erased_while_it_scores_returns_nothing_and_records_nothing(
    judge_settings: Callable[..., Settings], clean_database: str
) -> None:
    judge = ErasingJudge(clean_database)
    try:
        with (
            LoopbackServer(chat_completions_app(judge.reply)) as server,
            TestClient(create_app(judge_settings(server.url, embedder="none"))) as client,
        ):
            created = client.post("/memories", json={"namespace": NAMESPACE, "memories": [
                {"text": f"memory {i}", "embedding": vector(i)} for i in range(6)]})
            assert created.status_code == 201, created.text
            judge.erase = True
            response = client.post("/retrieve", json={
                "namespace": NAMESPACE, "query": "q", "query_embedding": vector(99),
                "policy": "full"})
            assert not judge.erase  # the erase did happen mid-request
            # As a retrieve of an unknown namespace: 200 with no memories, no query recorded.
            assert response.status_code == 200, response.text
            assert response.json()["memories"] == []
            assert response.json()["query_id"] is None
            assert response.json()["scorer_calls"] == 6  # what it asked before the erase
    finally:
        judge.engine.dispose()
    assert set(namespace_row_counts(clean_database).values()) == {0}


# ------------------------------------------------------------------------ all at once, timed


class Mix:
    """Four clients retrieving, one deleting the memories retrieves just returned (and adding
    new ones, so the namespace keeps its size), and back-to-back refits: for ``seconds``, and
    then on until each has done a little (a loaded machine is slow), at most ``cap_s``."""

    def __init__(self, app: FastAPI, seconds: float, cap_s: float = 30.0) -> None:
        self.app = app
        self.started = 0.0
        self.seconds = seconds
        self.cap_s = cap_s
        self.statuses: Counter[int] = Counter()
        self.returned: list[int] = []
        self.refits = 0
        self.refit_errors: list[BaseException] = []

    def running(self) -> bool:
        elapsed = time.monotonic() - self.started
        enough = self.statuses[204] >= 5 and self.statuses[200] >= 20 and self.refits >= 3
        return elapsed < self.seconds or (not enough and elapsed < self.cap_s)

    async def run(self) -> None:
        self.started = time.monotonic()
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            await asyncio.gather(
                *(self._retrieve(client, w) for w in range(4)), self._delete(client), self._refit()
            )
        await self.app.state.components.pipeline.drain()

    async def _retrieve(self, client: httpx.AsyncClient, worker: int) -> None:
        rng = np.random.default_rng(worker)
        # Queries near a few centres, so concurrent retrieves share candidates.
        centres = [np.asarray(vector(1000 + c)) for c in range(3)]
        while self.running():
            query = centres[rng.integers(3)] + 0.3 * rng.normal(size=DIM)
            response = await client.post("/retrieve", json={
                "namespace": NAMESPACE, "query": "q", "query_embedding": query.tolist(),
                "candidates": 30, "policy": "full", "k": 5,
            })
            self.statuses[response.status_code] += 1
            if response.status_code == 200:
                self.returned.extend(m["id"] for m in response.json()["memories"])

    async def _delete(self, client: httpx.AsyncClient) -> None:
        deleted: set[int] = set()
        while self.running():
            victim = next((m for m in reversed(self.returned) if m not in deleted), None)
            if victim is None:
                await asyncio.sleep(0.005)
                continue
            deleted.add(victim)
            response = await client.delete(f"/memories/{victim}")
            self.statuses[response.status_code] += 1
            response = await client.post("/memories", json={"namespace": NAMESPACE, "memories": [
                {"text": f"new {len(deleted)}", "embedding": vector(5000 + len(deleted))}]})
            self.statuses[response.status_code] += 1

    async def _refit(self) -> None:
        pipeline = self.app.state.components.pipeline
        while self.running():
            try:
                await pipeline.refit(NAMESPACE)
                self.refits += 1
            except Exception as exc:  # collected: the assertion names them
                self.refit_errors.append(exc)


def test_retrieves_deletes_and_refits_at_once_answer_no_5xx_and_every_refit_completes(
    clean_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                        refit_every=5, _env_file=None)
    with TestClient(create_app(settings)) as client:
        created = client.post("/memories", json={"namespace": NAMESPACE, "memories": [
            {"text": f"memory {i}", "embedding": vector(i)} for i in range(120)]})
        assert created.status_code == 201, created.text
        mix = Mix(client.app, seconds=3.0)
        with caplog.at_level(logging.ERROR):
            client.portal.call(mix.run)
    statuses = mix.statuses
    assert statuses[204] >= 5 and statuses[200] >= 20, statuses  # the race was exercised
    assert all(status < 500 for status in statuses), statuses
    assert mix.refits >= 3 and not mix.refit_errors, (mix.refits, mix.refit_errors[:3])
    # Background refits (refit_every) log their failures instead of raising them.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_background_refit_of_an_erased_namespace_logs_no_error(
    clean_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refit falls due, then the namespace is erased before it runs (the worker's loop or a
    query's background refit): nothing is left to refit, which is not an error to page on."""
    async def scenario() -> bool:
        async with observed_namespace(clean_database) as (database, pipeline, _):
            async with database.sessions() as eraser:
                await erase_namespace(eraser, NAMESPACE)
                await eraser.commit()
            with caplog.at_level(logging.INFO, logger="service.retrieve.learning"):
                return await pipeline.learner.refit_logged(NAMESPACE)

    assert asyncio.run(scenario()) is False
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("erased" in r.getMessage() for r in caplog.records)
