"""service.client against the real service on loopback (real HTTP, real database)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from service.client import AsyncEarmClient, EarmAPIError, EarmClient
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer

MEMORIES = [
    "My dog is called Rex and loves the beach.",
    {
        "text": "I work night shifts as a nurse.",
        "external_id": "job",
        "metadata": {"topic": "work"},
    },
    {"text": "We went camping at the lake in June.", "occurred_at": "2023-06-10T12:00:00Z"},
]


@pytest.fixture
def service_url(settings: Settings) -> Iterator[str]:
    with LoopbackServer(create_app(settings)) as server:
        yield server.url


def test_client_round_trip_add_retrieve_feedback_stats(service_url: str) -> None:
    with EarmClient(service_url, timeout=30) as earm:
        added = earm.add("agent-1", MEMORIES)
        assert added.created == 3 and len(added.ids) == 3
        assert earm.add("agent-1", [MEMORIES[1]]).existing == 1  # idempotent on external_id

        result = earm.retrieve(
            "agent-1", "What is my dog's name?", k=2, policy="full", order="relevance"
        )
        assert result.memories[0].text == MEMORIES[0]
        assert result.memories[0].source == "observed"
        assert result.scorer_calls == 3 and result.timings.total_ms > 0

        recorded = earm.feedback("agent-1", result.query_id, {"job": 0.0})  # by external_id
        assert (recorded.recorded, recorded.replaced) == (1, 1)  # the scorer's score replaced

        stats = earm.stats("agent-1")
        assert (stats.memories, stats.queries, stats.observations) == (3, 1, 3)
        assert stats.calls_saved == 0.0
        assert (stats.scorer.name, stats.scorer.healthy) == ("local", True)  # GET /stats' own
        every = earm.stats()
        assert [s.namespace for s in every.namespaces] == ["agent-1"]
        assert every.scorer.recent_calls >= 3

        assert earm.get(added.ids[1]).metadata == {"topic": "work"}
        page = earm.list("agent-1", limit=2)
        assert [m.id for m in page.memories] == added.ids[:2] and page.next_cursor
        assert [
            m.id for m in earm.list("agent-1", cursor=page.next_cursor).memories
        ] == added.ids[2:]
        assert [m.id for m in earm.list("agent-1", external_id="job").memories] == [added.ids[1]]
        earm.delete(added.ids[2])
        with pytest.raises(EarmAPIError) as deleted:
            earm.get(added.ids[2])
        assert deleted.value.code == "not_found"


def test_client_edits_memories_updates_on_conflict_and_erases_a_namespace(
    service_url: str,
) -> None:
    with EarmClient(service_url) as earm:
        added = earm.add("agent-1", MEMORIES)
        result = earm.retrieve("agent-1", "night shifts", policy="full")
        edited = earm.patch_memory(added.ids[1], text="I work day shifts now.", occurred_at=None)
        assert edited.memory.text == "I work day shifts now."
        assert edited.retired_observations == 1
        assert earm.stats("agent-1").observations == 2

        changed = {"text": "I quit nursing.", "external_id": "job"}
        assert earm.add("agent-1", [changed]).updated == 0  # keep: the stored memory stays
        assert earm.get(added.ids[1]).text == "I work day shifts now."
        assert earm.add("agent-1", [changed], on_conflict="update").updated == 1
        assert earm.get(added.ids[1]).text == "I quit nursing."

        erased = earm.delete_namespace("agent-1")
        assert (erased.memories, erased.queries, erased.observations) == (3, 1, 3)
        empty = earm.retrieve("agent-1", "night shifts")
        assert (empty.memories, empty.query_id) == ([], None)
        with pytest.raises(EarmAPIError) as gone:
            earm.delete_namespace("agent-1")
        assert gone.value.code == "not_found"
        assert result.query_id is not None


async def _async_edit_and_erase(service_url: str) -> None:
    async with AsyncEarmClient(service_url) as earm:
        added = await earm.add("agent-2", MEMORIES)
        edited = await earm.patch_memory(added.ids[0], metadata={"pet": "dog"})
        assert (edited.memory.metadata, edited.retired_observations) == ({"pet": "dog"}, 0)
        updated = await earm.add("agent-2", [{"text": "x", "external_id": "job"}], "update")
        assert updated.updated == 1
        assert (await earm.delete_namespace("agent-2")).memories == 3


def test_async_client_edits_and_erases(service_url: str) -> None:
    asyncio.run(_async_edit_and_erase(service_url))


def test_client_raises_api_errors_with_status_and_code(service_url: str) -> None:
    with EarmClient(service_url) as earm:
        with pytest.raises(EarmAPIError) as unknown:
            earm.stats("nobody")
        assert (unknown.value.status, unknown.value.code) == (404, "not_found")
        assert unknown.value.request_id

        earm.add("agent-1", ["one memory"])
        with pytest.raises(EarmAPIError) as too_many:
            earm.retrieve("agent-1", "q", k=1000)
        assert (too_many.value.status, too_many.value.code) == (413, "limit_exceeded")
        with pytest.raises(EarmAPIError) as invalid:
            earm.add("not a namespace", ["x"])
        assert (invalid.value.status, invalid.value.code) == (422, "validation_error")


def test_async_client_round_trip(service_url: str) -> None:
    async def scenario() -> None:
        async with AsyncEarmClient(service_url) as earm:
            added = await earm.add("agent-1", MEMORIES)
            result = await earm.retrieve("agent-1", "Where did we go camping?", k=1, policy="full")
            assert result.memories[0].id == added.ids[2]
            feedback = await earm.feedback("agent-1", result.query_id, [(added.ids[0], 0.2)])
            assert feedback.replaced == 1
            assert (await earm.stats("agent-1")).queries == 1
            assert (await earm.get(added.ids[0])).text == MEMORIES[0]
            assert len((await earm.list("agent-1")).memories) == 3
            await earm.delete(added.ids[0])
            with pytest.raises(EarmAPIError) as missing:
                await earm.stats("nobody")
            assert missing.value.code == "not_found"

    asyncio.run(scenario())


API_KEY = "client-test-key-0123456789"


def test_client_sends_its_api_key_as_a_bearer_token(clean_database: str) -> None:
    settings = Settings(database_url=clean_database, api_keys=f"{API_KEY}=agent-*", _env_file=None)
    with LoopbackServer(create_app(settings)) as server:
        with EarmClient(server.url, api_key=API_KEY) as earm:
            assert earm.add("agent-1", ["a memory"]).created == 1
        with EarmClient(server.url) as anonymous, pytest.raises(EarmAPIError) as refused:
            anonymous.add("agent-1", ["a memory"])
    assert (refused.value.status, refused.value.code) == (401, "unauthenticated")
