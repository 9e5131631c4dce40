"""Request limits: body size (413 before parsing, declared or streamed), text, batch, k,
candidates, budget, page size, metadata size and depth; all in the JSON error format."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.bench.loopback import LoopbackServer
from service.api.app import create_app
from service.limits import json_depth
from service.settings import Settings

VECTOR = (np.arange(384) % 3 + 1.0).tolist()


@pytest.fixture
def limited_settings(clean_database: str) -> Settings:
    return Settings(
        database_url=clean_database,
        embedder="none",
        max_body_bytes=64 * 1024,
        max_metadata_bytes=256,
        max_metadata_depth=3,
        max_batch=5,
        max_text_chars=50,
        max_page_size=20,
        _env_file=None,
    )


@pytest.fixture
def api(limited_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(limited_settings)) as client:
        yield client


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == code


def memory(**fields) -> dict:
    return {"text": "short", "embedding": VECTOR} | fields


def ingest(api: TestClient, *memories: dict, namespace: str = "agent-1") -> httpx.Response:
    return api.post("/memories", json={"namespace": namespace, "memories": list(memories)})


def test_defaults_match_the_documented_bounds() -> None:
    settings = Settings(_env_file=None)
    assert (settings.max_k, settings.max_candidates, settings.max_batch) == (100, 1000, 1000)
    assert settings.max_body_bytes == 16 * 1024 * 1024
    assert settings.max_metadata_bytes == 64 * 1024 and settings.max_metadata_depth == 16


def test_json_depth_counts_containers_iteratively() -> None:
    assert json_depth(1) == 0 and json_depth({}) == 1 and json_depth({"a": [1, {"b": 2}]}) == 3
    deep: list = []
    for _ in range(100_000):  # far beyond the recursion limit
        deep = [deep]
    assert json_depth(deep) == 100_001


def test_a_declared_body_over_the_limit_is_refused_before_parsing(api: TestClient) -> None:
    response = api.post(
        "/memories", content=b"{" + b" " * (64 * 1024) + b"}", headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")


def test_a_streamed_body_over_the_limit_is_refused(limited_settings: Settings) -> None:
    """Chunked transfer, no Content-Length: the middleware counts bytes as they arrive."""

    def chunks() -> Iterator[bytes]:
        yield b'{"namespace": "agent-1", "memories": [{"text": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}]}'

    with LoopbackServer(create_app(limited_settings)) as server:
        response = httpx.post(
            f"{server.url}/memories", content=chunks(), headers={"content-type": "application/json"}
        )
        assert_error(response, 413, "payload_too_large")
        # The server is fine afterwards.
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_streamed_body_under_the_limit_is_served(limited_settings: Settings) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"namespace": "agent-1", "memories": [{"text": "streamed", "embedding": '
        yield str(VECTOR).encode()
        yield b"}]}"

    with LoopbackServer(create_app(limited_settings)) as server:
        response = httpx.post(
            f"{server.url}/memories", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 201, response.text


def test_too_many_memories_in_one_batch(api: TestClient) -> None:
    assert_error(ingest(api, *[memory()] * 6), 413, "limit_exceeded")


def test_memory_text_too_long(api: TestClient) -> None:
    assert_error(ingest(api, memory(text="x" * 51)), 413, "limit_exceeded")


def test_metadata_too_large(api: TestClient) -> None:
    assert_error(ingest(api, memory(metadata={"blob": "x" * 300})), 413, "limit_exceeded")


def test_metadata_too_deep(api: TestClient) -> None:
    response = ingest(api, memory(metadata={"a": {"b": {"c": {"d": 1}}}}))
    assert_error(response, 413, "limit_exceeded")
    assert "nested 4 levels" in response.json()["error"]["message"]


def test_metadata_at_the_limits_is_stored(api: TestClient) -> None:
    assert ingest(api, memory(metadata={"a": {"b": {"c": "é" * 50}}})).status_code == 201


def test_external_id_too_long(api: TestClient) -> None:
    assert_error(ingest(api, memory(external_id="e" * 257)), 422, "validation_error")


@pytest.fixture
def stocked(api: TestClient) -> TestClient:
    assert ingest(api, memory()).status_code == 201
    return api


def retrieve(api: TestClient, **fields) -> httpx.Response:
    body = {"namespace": "agent-1", "query": "q", "query_embedding": VECTOR} | fields
    return api.post("/retrieve", json=body)


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"k": 101}, 413, "limit_exceeded"),
        ({"k": 10**30}, 413, "limit_exceeded"),
        ({"k": 0}, 422, "validation_error"),
        ({"candidates": 1001}, 413, "limit_exceeded"),
        ({"candidates": 10, "budget": 11}, 422, "invalid_input"),
        ({"query": "q" * 51}, 413, "limit_exceeded"),
        ({"filters": {"a": {"b": {"c": {"d": 1}}}}}, 413, "limit_exceeded"),
        ({"filters": {"a": "x" * 300}}, 413, "limit_exceeded"),
    ],
)
def test_retrieve_limits(stocked: TestClient, fields: dict, status: int, code: str) -> None:
    assert_error(retrieve(stocked, **fields), status, code)


def test_feedback_batch_limit(stocked: TestClient) -> None:
    query_id = retrieve(stocked).json()["query_id"]
    scores = [{"memory_id": 1, "score": 0.5}] * 6
    response = stocked.post(
        "/feedback", json={"namespace": "agent-1", "query_id": query_id, "scores": scores}
    )
    assert_error(response, 413, "limit_exceeded")


def test_page_size_limit(api: TestClient) -> None:
    response = api.get("/memories", params={"namespace": "agent-1", "limit": 21})
    assert_error(response, 413, "limit_exceeded")


def test_deeply_nested_json_body_is_a_client_error(api: TestClient) -> None:
    body = b'{"namespace": "agent-1", "memories": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    response = api.post("/memories", content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert "error" in response.json()
