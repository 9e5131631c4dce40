"""Where a namespace's write transactions run (service.db.writes): what each notes for the
replica reads after it, and which failures it runs again, without a database (a session that
runs no statement connects to nothing)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.writes import (
    CITUS_SHARD_REPLACED,
    TRANSACTION_ATTEMPTS,
    Writes,
    retry_may_succeed,
    writes_to,
)


class NotedCommits:
    """Stands in for :class:`service.db.replicas.Replicas`: the notes it was asked for."""

    def __init__(self, configured: bool = True) -> None:
        self.configured = configured
        self.notes: list[tuple[str, bool]] = []

    async def note_commit(self, namespace: str, memories: bool) -> None:
        self.notes.append((namespace, memories))


def writes_over(replicas: NotedCommits) -> Writes:
    fake: Any = replicas
    return Writes(async_sessionmaker(), fake)


async def nothing(session: AsyncSession) -> None:
    pass


def rolled_back(error: Exception) -> DBAPIError:
    """``error`` as SQLAlchemy raises it from a statement."""
    return DBAPIError("UPDATE ...", None, error)


SHARD_REPLACED = psycopg.errors.InternalError(f"{CITUS_SHARD_REPLACED} 102008")
SPLIT_UNDER_WAY = psycopg.errors.SerializationFailure(
    "shard for the given value does not exist"
)


def test_a_write_notes_its_namespace_once_its_block_is_done() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def no_note_yet(session: AsyncSession) -> None:
        assert replicas.notes == []

    async def write() -> None:
        await writes.transaction("ns", no_note_yet, memories=True)
        await writes.transaction("other", nothing, memories=False)

    asyncio.run(write())
    assert replicas.notes == [("ns", True), ("other", False)]


def test_a_write_by_id_notes_the_namespace_it_found() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def found(session: AsyncSession) -> None:
        writes_to(session, "found")

    async def write() -> None:
        await writes.transaction(None, found, memories=True)
        # Found nothing (a 404): nothing to note.
        await writes.transaction(None, nothing, memories=True)

    asyncio.run(write())
    assert replicas.notes == [("found", True)]


def test_a_write_that_fails_notes_nothing() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def fail(session: AsyncSession) -> None:
        raise LookupError("the write failed")

    async def write() -> None:
        await writes.transaction("ns", fail, memories=True)

    with pytest.raises(LookupError):
        asyncio.run(write())
    assert replicas.notes == []


def test_without_replicas_nothing_is_noted() -> None:
    replicas = NotedCommits(configured=False)
    writes = writes_over(replicas)

    async def write() -> None:
        await writes.transaction("ns", nothing, memories=True)
        await writes.noted("ns", memories=False)

    asyncio.run(write())
    assert replicas.notes == []


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (rolled_back(SPLIT_UNDER_WAY), True),
        (rolled_back(psycopg.errors.DeadlockDetected("deadlock detected")), True),
        (rolled_back(SHARD_REPLACED), True),
        (rolled_back(psycopg.errors.InternalError("cache lookup failed")), False),
        (rolled_back(psycopg.errors.UniqueViolation("duplicate key")), False),
        (LookupError("not the server's"), False),
    ],
)
def test_only_a_conflict_the_server_rolled_back_is_run_again(
    error: BaseException, retried: bool
) -> None:
    assert retry_may_succeed(error) is retried


def test_a_write_rolled_back_for_a_replaced_shard_runs_again_in_a_new_session() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)
    sessions: list[AsyncSession] = []

    async def planned_for_the_old_shard_once(session: AsyncSession) -> str:
        sessions.append(session)
        if len(sessions) == 1:
            raise rolled_back(SHARD_REPLACED)
        return "committed"

    assert asyncio.run(writes.transaction("ns", planned_for_the_old_shard_once, memories=True)) == (
        "committed"
    )
    assert len(sessions) == 2 and sessions[0] is not sessions[1]
    assert replicas.notes == [("ns", True)]


def test_a_conflict_that_outlasts_the_attempts_is_raised_and_notes_nothing() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)
    attempts = 0

    async def always_in_conflict(session: AsyncSession) -> None:
        nonlocal attempts
        attempts += 1
        raise rolled_back(SPLIT_UNDER_WAY)

    with pytest.raises(DBAPIError):
        asyncio.run(writes.transaction("ns", always_in_conflict, memories=False))
    assert 1 < attempts <= TRANSACTION_ATTEMPTS
    assert replicas.notes == []


def test_a_failure_no_attempt_can_fix_is_raised_at_once() -> None:
    writes = writes_over(NotedCommits())
    attempts = 0

    async def duplicate(session: AsyncSession) -> None:
        nonlocal attempts
        attempts += 1
        raise rolled_back(psycopg.errors.UniqueViolation("duplicate key"))

    with pytest.raises(DBAPIError):
        asyncio.run(writes.transaction("ns", duplicate, memories=True))
    assert attempts == 1
