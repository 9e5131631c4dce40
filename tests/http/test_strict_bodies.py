"""JSON bodies are read with JSON's types: a boolean or a string is not a number (pydantic's
lax mode read `true` as 1 and `"10"` as 10), a body that is not UTF-8 is not read at all, and a
text of only whitespace and invisible format characters has nothing to embed or to score. JSON
has one number type, so integers and floats stay interchangeable; query parameters are strings
and stay parsed as such."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings

DIM = 384
UNIT = [1.0] + [0.0] * (DIM - 1)
#: Zero-width space, zero-width joiner, word joiner, byte order mark: Unicode category Cf.
INVISIBLE = "\u200b \u200d\t\u2060\ufeff"


@pytest.fixture
def http(clean_database: str) -> Iterator[TestClient]:
    """The API with client vectors only (no embedder), and one stored memory, id 1."""
    settings = Settings(database_url=clean_database, embedder="none", _env_file=None)
    with TestClient(create_app(settings)) as client:
        stored = client.post("/memories", json=ingest(text="a memory", embedding=UNIT))
        assert stored.status_code == 201, stored.text
        yield client


def ingest(**memory: Any) -> dict[str, Any]:
    return {"namespace": "agent-1", "memories": [{"embedding": UNIT} | memory]}


def retrieve(**fields: Any) -> dict[str, Any]:
    return {"namespace": "agent-1", "query": "a query", "query_embedding": UNIT} | fields


def feedback(query_id: Any, **score: Any) -> dict[str, Any]:
    return {"namespace": "agent-1", "query_id": query_id, "scores": [{"memory_id": 1} | score]}


REFUSED = {
    "memory embedding of booleans": ("/memories", ingest(text="x", embedding=[True] * DIM)),
    "memory embedding of strings": ("/memories", ingest(text="x", embedding=["0.5"] * DIM)),
    "memory text of format characters": ("/memories", ingest(text=INVISIBLE)),
    "k true": ("/retrieve", retrieve(k=True)),
    "k string": ("/retrieve", retrieve(k="10")),
    "candidates string": ("/retrieve", retrieve(candidates="5")),
    "budget boolean": ("/retrieve", retrieve(budget=False)),
    "seed string": ("/retrieve", retrieve(seed="7")),
    "expand boolean": ("/retrieve", retrieve(expand=True)),
    "query embedding of strings": ("/retrieve", retrieve(query_embedding=["1"] * DIM)),
    "query of format characters": ("/retrieve", retrieve(query=INVISIBLE)),
    "score string": ("/feedback", feedback(1, score="0.5")),
    "score boolean": ("/feedback", feedback(1, score=True)),
    "query_id string": ("/feedback", feedback("1", score=0.5)),
    "memory_id boolean": (
        "/feedback",
        {"namespace": "agent-1", "query_id": 1, "scores": [{"memory_id": True, "score": 0.5}]},
    ),
}


@pytest.mark.parametrize("path, body", REFUSED.values(), ids=REFUSED.keys())
def test_a_body_with_a_value_of_the_wrong_json_type_is_refused(
    http: TestClient, path: str, body: dict[str, Any]
) -> None:
    if path == "/feedback":
        assert http.post("/retrieve", json=retrieve(policy="semantic")).status_code == 200
    response = http.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    "patch",
    [{"embedding": [False] * DIM}, {"embedding": ["0"] * DIM}, {"text": INVISIBLE}],
    ids=["embedding of booleans", "embedding of strings", "text of format characters"],
)
def test_a_patch_with_a_value_of_the_wrong_json_type_is_refused(
    http: TestClient, patch: dict[str, Any]
) -> None:
    response = http.patch("/memories/1", json=patch)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"


def test_integers_stand_for_floats_and_floats_without_a_fraction_for_integers(
    http: TestClient,
) -> None:
    integral = [1] + [0] * (DIM - 1)
    stored = http.post(
        "/memories", json=ingest(text="integral", embedding=integral,
                                 occurred_at="2023-05-08T13:56:00Z")
    )
    assert stored.status_code == 201, stored.text
    found = http.post(
        "/retrieve", json=retrieve(query_embedding=integral, k=2.0, candidates=5, policy="semantic")
    )
    assert found.status_code == 200, found.text
    judged = http.post("/feedback", json=feedback(found.json()["query_id"], score=1))
    assert judged.status_code == 200, judged.text
    assert http.get("/memories", params={"namespace": "agent-1", "limit": "100"}).status_code == 200


def test_a_text_with_something_visible_among_format_characters_is_kept(http: TestClient) -> None:
    text = f"{INVISIBLE}x{INVISIBLE}"
    stored = http.post("/memories", json=ingest(text=text))
    assert stored.status_code == 201, stored.text
    assert http.get(f"/memories/{stored.json()['ids'][0]}").json()["text"] == text


def test_a_body_that_is_not_utf8_is_400_malformed_json(http: TestClient) -> None:
    body = json.dumps(ingest(text="utf-16, not utf-8")).encode("utf-16")
    response = http.post("/memories", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "malformed_json"


def test_a_utf8_body_with_a_byte_order_mark_is_read(http: TestClient) -> None:
    body = json.dumps(ingest(text="utf-8 with a BOM")).encode("utf-8-sig")
    response = http.post("/memories", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 201, response.text
