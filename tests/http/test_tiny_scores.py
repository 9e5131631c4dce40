"""Scores too small for float32: valid relevances in [0, 1] that a ``real`` column cannot hold
(anything below ~7e-46 rounds to zero in float32, and Postgres refuses a non-zero float8 that
rounds to zero as an underflow). They arrive from a scorer (a number answer, P(yes) from a very
negative logprob, a sigmoid of a very negative logit) or as client feedback, and are stored as
0: never a 500."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app, rerank_app

DIM = 384
#: The chat scorer's number ``0.`` followed by 49 zeros and a 1: 1e-50.
TINY_NUMBER = "0." + "0" * 49 + "1"


def stock(client: TestClient, n: int = 8) -> None:
    memories = [
        {"text": f"memory {i}", "embedding": np.random.default_rng(i).normal(size=DIM).tolist()}
        for i in range(n)
    ]
    response = client.post("/memories", json={"namespace": "tiny", "memories": memories})
    assert response.status_code == 201, response.text


def retrieve(client: TestClient) -> dict[str, Any]:
    response = client.post(
        "/retrieve",
        json={
            "namespace": "tiny",
            "query": "what is small?",
            "query_embedding": np.random.default_rng(99).normal(size=DIM).tolist(),
            "k": 4,
            "order": "relevance",
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def judge_that_answers(text: str) -> Callable[..., Any]:
    async def judge(prompt: str) -> str:
        return text

    return judge


@pytest.fixture
def tiny_number_judge() -> Iterator[str]:
    with LoopbackServer(chat_completions_app(judge_that_answers(TINY_NUMBER))) as server:
        yield server.url


@pytest.fixture
def tiny_logit_reranker() -> Iterator[str]:
    with LoopbackServer(rerank_app(lambda query, documents: [-104.0] * len(documents))) as s:
        yield s.url


def stored_scores(client: TestClient, query_id: int) -> list[float]:
    trace = client.get(f"/queries/{query_id}", params={"namespace": "tiny"})
    assert trace.status_code == 200, trace.text
    return [c["observed_score"] for c in trace.json()["candidates"] if c["origin"] is not None]


def test_a_chat_scorers_number_below_float32_is_stored_as_zero(
    judge_settings: Callable[..., Settings], tiny_number_judge: str
) -> None:
    with TestClient(create_app(judge_settings(tiny_number_judge))) as client:
        stock(client)
        result = retrieve(client)
        assert result["degraded"] is False
        assert result["scorer_calls"] > 0
        assert stored_scores(client, result["query_id"]) == [0.0] * result["scorer_calls"]


def test_a_rerankers_sigmoid_of_a_very_negative_logit_is_stored_as_zero(
    clean_database: str, tiny_logit_reranker: str
) -> None:
    settings = Settings(
        database_url=clean_database,
        scorer="rerank",
        scorer_base_url=f"{tiny_logit_reranker}/v1",
        scorer_score_transform="sigmoid",
        scorer_max_retries=0,
        _env_file=None,
    )
    with TestClient(create_app(settings)) as client:
        stock(client)
        result = retrieve(client)
        assert result["degraded"] is False
        assert stored_scores(client, result["query_id"]) == [0.0] * result["scorer_calls"]


@pytest.mark.parametrize("tiny", [1e-300, 5e-324, 7e-46])
def test_feedback_scores_below_float32_are_stored_as_zero(
    client: TestClient, tiny: float
) -> None:
    stock(client)
    result = retrieve(client)
    memory_id = result["memories"][0]["id"]
    response = client.post(
        "/feedback",
        json={
            "namespace": "tiny",
            "query_id": result["query_id"],
            "scores": [{"memory_id": memory_id, "score": tiny}],
        },
    )
    assert response.status_code == 200, response.text
    trace = client.get(f"/queries/{result['query_id']}", params={"namespace": "tiny"}).json()
    fed_back = [c for c in trace["candidates"] if c["memory_id"] == memory_id]
    assert fed_back[0]["observed_score"] == 0.0
    assert fed_back[0]["origin"] == "feedback"


def test_vector_components_below_float32_are_stored_and_searched(client: TestClient) -> None:
    tiny_vector = np.full(DIM, 1e-50)
    tiny_vector[0], tiny_vector[1] = 1.0, 1e-44
    response = client.post(
        "/memories",
        json={"namespace": "tiny", "memories": [{"text": "t", "embedding": tiny_vector.tolist()}]},
    )
    assert response.status_code == 201, response.text
    result = client.post(
        "/retrieve",
        json={"namespace": "tiny", "query": "q", "query_embedding": tiny_vector.tolist()},
    )
    assert result.status_code == 200, result.text
    assert result.json()["memories"][0]["similarity"] == pytest.approx(1.0)
