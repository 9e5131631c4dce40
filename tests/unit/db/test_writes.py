"""Where a namespace's write transactions begin (service.db.writes): what each notes for the
replica reads after it, without a database (a session that runs no statement connects to
nothing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import async_sessionmaker

from service.db.writes import Writes, writes_to


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


def test_a_write_notes_its_namespace_once_its_block_is_done() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def write() -> None:
        async with writes.session("ns", memories=True):
            assert replicas.notes == []
        async with writes.session("other", memories=False):
            pass

    asyncio.run(write())
    assert replicas.notes == [("ns", True), ("other", False)]


def test_a_write_by_id_notes_the_namespace_it_found() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def write() -> None:
        async with writes.session(None, memories=True) as session:
            writes_to(session, "found")
        async with writes.session(None, memories=True):
            pass  # found nothing (a 404): nothing to note

    asyncio.run(write())
    assert replicas.notes == [("found", True)]


def test_a_write_that_fails_notes_nothing() -> None:
    replicas = NotedCommits()
    writes = writes_over(replicas)

    async def write() -> None:
        async with writes.session("ns", memories=True):
            raise LookupError("the write failed")

    with pytest.raises(LookupError):
        asyncio.run(write())
    assert replicas.notes == []


def test_without_replicas_nothing_is_noted() -> None:
    replicas = NotedCommits(configured=False)
    writes = writes_over(replicas)

    async def write() -> None:
        async with writes.session("ns", memories=True):
            pass
        await writes.noted("ns", memories=False)

    asyncio.run(write())
    assert replicas.notes == []
