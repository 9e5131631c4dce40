"""EarmRetriever (LangChain) and EarmStore (LangGraph), real libraries against a live service."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypedDict

import pytest
from langchain_core.documents import Document
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, Item, SearchItem

from service.client import EarmAPIError, EarmClient
from service.integrations.langchain import EarmRetriever, EarmStore

if TYPE_CHECKING:
    from tests.integrations.conftest import LiveService

METADATA_FIELDS = {
    "id",
    "external_id",
    "namespace",
    "score",
    "source",
    "similarity",
    "rank",
    "occurred_at",
    "query_id",
    "metadata",
}


# ---------------------------------------------------------------------------- retriever


def test_retriever_invoke_returns_documents_with_earms_metadata(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    retriever = EarmRetriever(
        url=service.url, api_key=service.agent_key, namespace="agent-1", k=2, order="relevance"
    )
    documents = retriever.invoke("What is my dog's name?")
    assert all(isinstance(doc, Document) for doc in documents) and len(documents) == 2
    best = documents[0]
    assert best.page_content == agent_memories[0]["text"]
    assert set(best.metadata) == METADATA_FIELDS
    assert best.metadata["id"] == agent_memories[0]["id"] and best.metadata["external_id"] == "dog"
    assert best.metadata["namespace"] == "agent-1" and best.metadata["metadata"] == {
        "topic": "pets"
    }
    assert [doc.metadata["rank"] for doc in documents] == [1, 2]
    assert documents[0].metadata["score"] >= documents[1].metadata["score"]
    assert best.metadata["source"] in {"observed", "estimated", "semantic"}
    assert 0 < best.metadata["similarity"] <= 1
    assert documents[0].metadata["query_id"] == documents[1].metadata["query_id"] >= 1

    nurse = retriever.invoke("What is my job?")[0]
    assert nurse.metadata["occurred_at"] == "2023-06-01T08:00:00+00:00"

    # The query ids are earm's: feedback on them is recorded.
    with EarmClient(service.url, api_key=service.agent_key) as earm:
        semantic = EarmRetriever(
            url=service.url, api_key=service.agent_key, namespace="agent-1", policy="semantic"
        )
        hit = semantic.invoke("Where did we camp?")[0]
        assert (
            earm.feedback("agent-1", hit.metadata["query_id"], {hit.metadata["id"]: 1.0}).recorded
            == 1
        )


def test_retriever_ainvoke_is_natively_async_across_event_loops(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    retriever = EarmRetriever(url=service.url, api_key=service.agent_key, namespace="agent-1", k=1)

    async def ask(question: str) -> list[Document]:
        return await retriever.ainvoke(question)

    # Two asyncio.run calls: the retriever's async client must follow the event loop.
    assert asyncio.run(ask("Where did we go camping?"))[0].page_content == agent_memories[2]["text"]
    assert asyncio.run(ask("What is my dog's name?"))[0].page_content == agent_memories[0]["text"]

    async def concurrently() -> list[list[Document]]:
        return await asyncio.gather(*(retriever.ainvoke(q) for q in ["dog", "job", "camping"]))

    assert [docs[0].metadata["id"] for docs in asyncio.run(concurrently())] == [
        *(retriever.invoke(q)[0].metadata["id"] for q in ["dog", "job", "camping"])
    ]


def test_retriever_passes_options_and_raises_the_apis_errors(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    filtered = EarmRetriever(
        url=service.url, api_key=service.agent_key, namespace="agent-1", filters={"topic": "pets"}
    )
    assert [doc.metadata["external_id"] for doc in filtered.invoke("anything")] == ["dog"]
    outside = EarmRetriever(url=service.url, api_key=service.agent_key, namespace="team-x")
    with pytest.raises(EarmAPIError) as refused:
        outside.invoke("anything")
    assert (refused.value.status, refused.value.code) == (403, "forbidden")


# --------------------------------------------------------------------------------- store


def store_for(service: LiveService) -> EarmStore:
    return EarmStore(service.url, service.agent_key, prefix="agent-lg", fields=["text"])


def test_store_round_trip_put_get_search_delete_list_namespaces(service: LiveService) -> None:
    store = store_for(service)
    alice, bob = ("users", "alice"), ("users", "bob")
    store.put(alice, "food", {"text": "Alice loves spicy ramen.", "kind": "preference"})
    store.put(alice, "job", {"text": "Alice is a marine biologist.", "kind": "fact"})
    store.put(alice, "pet", {"text": "Alice has a cat named Miso.", "kind": "fact"})
    store.put(bob, "food", {"text": "Bob is vegetarian.", "kind": "preference"})

    item = store.get(alice, "job")
    assert isinstance(item, Item) and not isinstance(item, SearchItem)
    assert (item.namespace, item.key) == (alice, "job")
    assert item.value == {"text": "Alice is a marine biologist.", "kind": "fact"}
    assert item.created_at == item.updated_at and item.created_at.tzinfo is not None
    assert store.get(alice, "nothing") is None and store.get(("users", "carol"), "food") is None

    # Stored in earm: one memory per item, in the namespace the tuple names.
    with EarmClient(service.url, api_key=service.agent_key) as earm:
        page = earm.list("agent-lg.users.alice")
        assert sorted(m.external_id for m in page.memories) == ["food", "job", "pet"]
        assert {m.text for m in page.memories} >= {"Alice loves spicy ramen."}

    hits = store.search(alice, query="Which food does Alice love?", limit=2)
    assert [hit.key for hit in hits][0] == "food" and len(hits) == 2
    assert all(isinstance(hit, SearchItem) and hit.namespace == alice for hit in hits)
    assert hits[0].score is not None and hits[0].score >= hits[1].score
    facts = store.search(alice, query="Which food does Alice love?", filter={"kind": "fact"})
    assert {hit.key for hit in facts} == {"job", "pet"}
    assert [hit.key for hit in store.search(alice)] == ["food", "job", "pet"]  # oldest first
    assert [hit.key for hit in store.search(alice, filter={"kind": "fact"}, offset=1)] == ["pet"]
    assert all(hit.score is None for hit in store.search(alice))
    assert store.search(("users", "carol"), query="anything") == []

    assert store.list_namespaces() == [alice, bob]
    assert store.list_namespaces(prefix=("users",), max_depth=1) == [("users",)]
    assert store.list_namespaces(suffix=("bob",)) == [bob]
    assert store.list_namespaces(prefix=("users", "*"), limit=1, offset=1) == [bob]

    store.delete(alice, "pet")
    assert store.get(alice, "pet") is None
    store.delete(alice, "pet")  # deleting what is gone is no error
    store.delete(bob, "food")
    assert store.list_namespaces() == [alice]


def test_store_put_replaces_a_changed_item_and_keeps_an_unchanged_one(service: LiveService) -> None:
    store = store_for(service)
    namespace = ("prefs",)
    store.put(namespace, "color", {"text": "Favourite colour: green."})
    first = store.get(namespace, "color")
    with EarmClient(service.url, api_key=service.agent_key) as earm:
        [original] = earm.list("agent-lg.prefs").memories
        store.put(namespace, "color", {"text": "Favourite colour: green."})
        assert [m.id for m in earm.list("agent-lg.prefs").memories] == [original.id]  # unchanged

        store.put(namespace, "color", {"text": "Favourite colour: blue."})
        [replaced] = earm.list("agent-lg.prefs").memories
    assert replaced.id != original.id and replaced.text == "Favourite colour: blue."
    updated = store.get(namespace, "color")
    assert updated.value == {"text": "Favourite colour: blue."}
    assert updated.created_at == first.created_at < updated.updated_at


def test_store_refuses_what_it_cannot_do_and_what_the_key_may_not(service: LiveService) -> None:
    store = store_for(service)
    with pytest.raises(ValueError, match="operators such as '\\$gt'"):
        store.search(("prefs",), filter={"score": {"$gt": 1}})
    with pytest.raises(NotImplementedError):
        store.put(("prefs",), "x", {"text": "y"}, ttl=5)
    outside = EarmStore(service.url, service.agent_key, prefix="team-x")
    with pytest.raises(EarmAPIError) as refused:
        outside.put(("prefs",), "x", {"text": "y"})
    assert refused.value.code == "forbidden"


def test_store_async_round_trip(service: LiveService) -> None:
    store = store_for(service)

    async def scenario() -> None:
        await store.aput(("notes",), "n1", {"text": "The meeting moved to Thursday."})
        await store.aput(("notes",), "n2", {"text": "Buy oat milk."})
        assert (await store.aget(("notes",), "n1")).value[
            "text"
        ] == "The meeting moved to Thursday."
        hits = await store.asearch(("notes",), query="When is the meeting?", limit=1)
        assert [hit.key for hit in hits] == ["n1"]
        assert await store.alist_namespaces() == [("notes",)]
        await store.adelete(("notes",), "n1")
        assert await store.aget(("notes",), "n1") is None

    asyncio.run(scenario())


class Conversation(TypedDict):
    user: str
    message: str
    recalled: list[str]


def remember(state: Conversation, runtime: Runtime) -> dict:
    store = runtime.store
    key = f"m{len(store.search(('memories', state['user']), limit=100))}"
    store.put(("memories", state["user"]), key, {"text": state["message"]})
    return {}


def recall(state: Conversation, runtime: Runtime) -> dict:
    hits = runtime.store.search(("memories", state["user"]), query=state["message"], limit=1)
    return {"recalled": [hit.value["text"] for hit in hits]}


async def arecall(state: Conversation, runtime: Runtime) -> dict:
    hits = await runtime.store.asearch(("memories", state["user"]), query=state["message"], limit=1)
    return {"recalled": [hit.value["text"] for hit in hits]}


def agent(store: BaseStore, recaller) -> object:
    graph = StateGraph(Conversation)
    graph.add_node("remember", remember)
    graph.add_node("recall", recaller)
    # Recall before remembering: a message must not find itself.
    graph.add_edge(START, "recall")
    graph.add_edge("recall", "remember")
    graph.add_edge("remember", END)
    return graph.compile(store=store)


def test_a_langgraph_agents_long_term_memory_runs_on_earm(service: LiveService) -> None:
    graph = agent(store_for(service), recall)
    for message in ["I am allergic to peanuts.", "My sister lives in Lisbon.", "I play the cello."]:
        graph.invoke({"user": "u1", "message": message, "recalled": []})
    state = graph.invoke({"user": "u1", "message": "Which instrument do I play?", "recalled": []})
    assert state["recalled"] == ["I play the cello."]

    async_graph = agent(store_for(service), arecall)
    state = asyncio.run(
        async_graph.ainvoke({"user": "u1", "message": "Where does my sister live?", "recalled": []})
    )
    assert state["recalled"] == ["My sister lives in Lisbon."]
    with EarmClient(service.url, api_key=service.agent_key) as earm:
        assert earm.stats("agent-lg.memories.u1").memories == 5  # every message, kept in earm
