"""EarmRetriever (LlamaIndex) with the real library against a live service."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from service.client import EarmAPIError
from service.integrations.llamaindex import EarmRetriever

if TYPE_CHECKING:
    from tests.integrations.conftest import LiveService


def test_retrieve_returns_scored_nodes_with_earms_metadata(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    retriever = EarmRetriever(
        service.url, service.agent_key, namespace="agent-1", k=2, order="relevance"
    )
    hits = retriever.retrieve("What is my dog's name?")
    assert len(hits) == 2 and all(isinstance(hit, NodeWithScore) for hit in hits)
    best = hits[0]
    assert isinstance(best.node, TextNode) and best.node.id_ == str(agent_memories[0]["id"])
    assert best.node.get_content() == agent_memories[0]["text"]
    assert best.score == best.node.metadata["score"] and hits[0].score >= hits[1].score
    metadata = best.node.metadata
    assert (metadata["id"], metadata["external_id"], metadata["namespace"]) == (
        agent_memories[0]["id"],
        "dog",
        "agent-1",
    )
    assert (
        metadata["rank"] == 1
        and metadata["query_id"] >= 1
        and metadata["metadata"] == {"topic": "pets"}
    )
    assert (
        metadata["source"] in {"observed", "estimated", "semantic"}
        and 0 < metadata["similarity"] <= 1
    )
    # What a synthesizer shows the LLM: the text and its context, not earm's bookkeeping.
    for_llm = best.node.get_content(metadata_mode=MetadataMode.LLM)
    assert agent_memories[0]["text"] in for_llm and "pets" in for_llm
    assert "similarity" not in for_llm and "query_id" not in for_llm

    nurse = retriever.retrieve(QueryBundle("What is my job?"))[0]
    assert nurse.node.metadata["occurred_at"] == "2023-06-01T08:00:00+00:00"
    assert "2023-06-01" in nurse.node.get_content(metadata_mode=MetadataMode.LLM)


def test_aretrieve_is_natively_async_across_event_loops(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    retriever = EarmRetriever(service.url, service.agent_key, namespace="agent-1", k=1)
    for question, expected in [("Where did we go camping?", 2), ("What is my dog's name?", 0)]:
        [hit] = asyncio.run(retriever.aretrieve(question))
        assert hit.node.get_content() == agent_memories[expected]["text"]


def test_retriever_raises_the_apis_errors(
    service: LiveService, agent_memories: list[dict[str, Any]]
) -> None:
    with pytest.raises(EarmAPIError) as refused:
        EarmRetriever(service.url, service.agent_key, namespace="team-x").retrieve("anything")
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    with pytest.raises(EarmAPIError) as unauthenticated:
        EarmRetriever(service.url, namespace="agent-1").retrieve("anything")
    assert unauthenticated.value.code == "unauthenticated"
