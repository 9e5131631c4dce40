"""POST/GET/DELETE /memories against the real embedded Postgres."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.errors import EarmError
from service.http.error_handlers import status_for

DIM = 384


def vector(seed: int) -> list[float]:
    return np.random.default_rng(seed).normal(size=DIM).tolist()


def ingest(client: TestClient, namespace: str, memories: list[dict]) -> dict:
    response = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert response.status_code == 201, response.text
    return response.json()


def error_code(response) -> str:
    return response.json()["error"]["code"]


def test_ingest_round_trip_returns_ids_in_request_order(client: TestClient) -> None:
    body = ingest(
        client,
        "agent-1",
        [
            {
                "text": "Alice moved to Lisbon in May.",
                "embedding": vector(1),
                "external_id": "a",
                "occurred_at": "2023-05-08T13:56:00Z",
                "metadata": {"speaker": "Alice"},
            },
            {"text": "Bob likes sailing.", "embedding": vector(2)},
        ],
    )
    assert body["created"] == 2 and body["existing"] == 0
    first = client.get(f"/memories/{body['ids'][0]}").json()
    second = client.get(f"/memories/{body['ids'][1]}").json()
    assert first["text"] == "Alice moved to Lisbon in May."
    assert first["external_id"] == "a"
    assert first["metadata"] == {"speaker": "Alice"}
    assert first["occurred_at"].startswith("2023-05-08T13:56:00")
    assert first["namespace"] == "agent-1"
    assert first["embedding_model"] == "client"
    assert second["text"] == "Bob likes sailing."


def test_occurred_at_with_any_python_utc_offset_is_stored_as_the_same_instant(
    client: TestClient,
) -> None:
    # Postgres refuses offsets beyond ±15:59; Python (and JSON clients) allow up to ±23:59.
    body = ingest(
        client,
        "agent-1",
        [{"text": "late", "embedding": vector(3), "occurred_at": "1994-05-04T03:18:07.8-21:13"}],
    )
    stored = client.get(f"/memories/{body['ids'][0]}").json()
    assert datetime.fromisoformat(stored["occurred_at"]) == datetime.fromisoformat(
        "1994-05-04T03:18:07.8-21:13"
    )


def test_ingest_without_embedding_uses_local_embedder(client: TestClient) -> None:
    body = ingest(client, "agent-1", [{"text": "The cat sat on the mat."}])
    memory = client.get(f"/memories/{body['ids'][0]}").json()
    assert memory["embedding_model"].startswith("local:")


def test_retry_with_same_external_ids_returns_same_ids_and_creates_nothing(
    client: TestClient,
) -> None:
    batch = [
        {"text": f"memory {i}", "embedding": vector(i), "external_id": f"e{i}"} for i in range(5)
    ]
    first = ingest(client, "agent-1", batch)
    retry = ingest(client, "agent-1", batch)
    assert retry["ids"] == first["ids"]
    assert retry["created"] == 0 and retry["existing"] == 5
    listing = client.get("/memories", params={"namespace": "agent-1"}).json()
    assert len(listing["memories"]) == 5


def test_same_external_id_in_other_namespace_is_a_different_memory(client: TestClient) -> None:
    one = ingest(client, "agent-1", [{"text": "x", "embedding": vector(1), "external_id": "e"}])
    two = ingest(client, "agent-2", [{"text": "x", "embedding": vector(1), "external_id": "e"}])
    assert one["ids"] != two["ids"] and two["created"] == 1


def test_duplicate_external_id_within_a_batch_maps_to_one_memory(client: TestClient) -> None:
    body = ingest(
        client,
        "agent-1",
        [
            {"text": "x", "embedding": vector(1), "external_id": "dup"},
            {"text": "x", "embedding": vector(1), "external_id": "dup"},
        ],
    )
    assert body["ids"][0] == body["ids"][1]
    assert body["created"] == 1 and body["existing"] == 1


def test_duplicate_external_id_within_a_batch_with_other_content_is_refused(
    client: TestClient,
) -> None:
    response = client.post(
        "/memories",
        json={
            "namespace": "agent-1",
            "memories": [
                {"text": "first", "embedding": vector(1), "external_id": "dup"},
                {"text": "other", "embedding": vector(2), "external_id": "unique"},
                {"text": "second", "embedding": vector(1), "external_id": "dup"},
            ],
        },
    )
    assert response.status_code == 422 and error_code(response) == "invalid_input"
    message = response.json()["error"]["message"]
    assert "memories[0]" in message and "memories[2]" in message and "text" in message
    assert client.get("/memories", params={"namespace": "agent-1"}).json()["memories"] == []


def test_listing_pages_through_every_memory_once(client: TestClient) -> None:
    ids = ingest(
        client, "agent-1", [{"text": f"m{i}", "embedding": vector(i)} for i in range(23)]
    )["ids"]
    ingest(client, "other", [{"text": "not mine", "embedding": vector(99)}])
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params = {"namespace": "agent-1", "limit": 10}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/memories", params=params).json()
        seen += [m["id"] for m in page["memories"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == sorted(ids)


def test_listing_by_external_id_finds_that_memory_of_the_namespace_only(
    client: TestClient,
) -> None:
    ids = ingest(
        client,
        "agent-1",
        [{"text": f"m{i}", "embedding": vector(i), "external_id": f"e{i}"} for i in range(5)],
    )["ids"]
    ingest(client, "agent-2", [{"text": "elsewhere", "embedding": vector(9), "external_id": "e3"}])
    found = client.get("/memories", params={"namespace": "agent-1", "external_id": "e3"}).json()
    assert [m["id"] for m in found["memories"]] == [ids[3]] and found["next_cursor"] is None
    missing = client.get("/memories", params={"namespace": "agent-1", "external_id": "e9"})
    assert missing.status_code == 200 and missing.json()["memories"] == []
    too_long = client.get("/memories", params={"namespace": "agent-1", "external_id": "x" * 257})
    assert too_long.status_code == 422 and error_code(too_long) == "validation_error"


def test_delete_removes_memory_and_its_observations(client: TestClient, settings) -> None:
    ids = ingest(client, "agent-1", [{"text": "m", "embedding": vector(1)}])["ids"]
    engine = create_engine(settings.database_url)
    with engine.begin() as conn:
        query_id = conn.execute(
            text(
                "INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,"
                " budget, scorer_calls) VALUES ('agent-1', 0, 'q', :e, 'full', 1, 1, 1)"
                " RETURNING id"
            ),
            {"e": json.dumps(vector(2))},
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source)"
                " VALUES (:q, :m, 'agent-1', 0.9, 0.5, 'scorer')"
            ),
            {"q": query_id, "m": ids[0]},
        )
    assert client.delete(f"/memories/{ids[0]}").status_code == 204
    assert client.get(f"/memories/{ids[0]}").status_code == 404
    with engine.connect() as conn:
        remaining = conn.execute(
            text("SELECT count(*) FROM scores WHERE memory_id = :m"), {"m": ids[0]}
        ).scalar_one()
    engine.dispose()
    assert remaining == 0


@pytest.mark.parametrize(
    ("memory", "expected_code"),
    [
        ({"text": "x", "embedding": [0.1] * 3}, "dimension_mismatch"),
        ({"text": "", "embedding": vector(1)}, "validation_error"),
        ({"text": "x" * 8001, "embedding": vector(1)}, "limit_exceeded"),
        ({"text": 42, "embedding": vector(1)}, "validation_error"),
        ({"text": "x", "embedding": "not a list"}, "validation_error"),
        ({"text": "x", "embedding": [0.0] * DIM}, "invalid_input"),
        ({"text": " \n\t\u3000", "embedding": vector(1)}, "validation_error"),
        ({"text": "x", "occurred_at": "yesterday-ish"}, "validation_error"),
        # Numbers (and numeric strings) would be read as Unix time, in seconds or, past 2e10,
        # milliseconds: only an ISO-8601 string says which instant it means.
        ({"text": "x", "occurred_at": -62135596801}, "validation_error"),
        ({"text": "x", "occurred_at": 1700000000}, "validation_error"),
        ({"text": "x", "occurred_at": 1700000000.5}, "validation_error"),
        ({"text": "x", "occurred_at": "1700000000"}, "validation_error"),
        ({"text": "x", "unknown_field": 1}, "validation_error"),
    ],
    ids=[
        "wrong-dimension",
        "empty-text",
        "over-long-text",
        "text-not-a-string",
        "embedding-not-a-list",
        "zero-vector",
        "whitespace-only-text",
        "bad-timestamp",
        "timestamp-as-negative-number",
        "timestamp-as-seconds",
        "timestamp-as-float",
        "timestamp-as-numeric-string",
        "unknown-field",
    ],
)
def test_invalid_memory_is_rejected_with_precise_4xx(
    client: TestClient, memory: dict, expected_code: str
) -> None:
    response = client.post("/memories", json={"namespace": "agent-1", "memories": [memory]})
    assert 400 <= response.status_code < 500
    assert error_code(response) == expected_code
    assert response.json()["error"]["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_embedding_values_are_rejected(client: TestClient, literal: str) -> None:
    values = ", ".join(["0.1"] * (DIM - 1) + [literal])
    raw = f'{{"namespace": "agent-1", "memories": [{{"text": "x", "embedding": [{values}]}}]}}'
    response = client.post(
        "/memories", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert error_code(response) == "validation_error"
    assert "embedding" in response.json()["error"]["message"]


# Vectors that are fine as JSON numbers (float64) but not as the float32 pgvector stores and
# computes cosine similarity in.
@pytest.mark.parametrize(
    "embedding",
    [
        [1e-50] * DIM,
        [1e-30] * DIM,
        [1e39] + [0.1] * (DIM - 1),
        [3.5e38] + [0.1] * (DIM - 1),
        [1e38] * DIM,
    ],
    ids=[
        "every-value-underflows-to-zero",
        "squared-length-underflows-to-zero",
        "value-beyond-float32",
        "value-just-beyond-float32",
        "squared-length-overflows",
    ],
)
def test_vectors_unusable_as_float32_are_refused_for_memories_and_queries(
    client: TestClient, embedding: list[float]
) -> None:
    refused = client.post(
        "/memories",
        json={"namespace": "agent-1", "memories": [{"text": "x", "embedding": embedding}]},
    )
    assert refused.status_code == 422 and error_code(refused) == "invalid_input", refused.text
    assert "memories[0].embedding" in refused.json()["error"]["message"]
    ingest(client, "agent-1", [{"text": "x", "embedding": vector(1)}])
    for policy in ("earm", "semantic"):
        response = client.post(
            "/retrieve",
            json={
                "namespace": "agent-1",
                "query": "q",
                "query_embedding": embedding,
                "policy": policy,
            },
        )
        assert response.status_code == 422 and error_code(response) == "invalid_input", (
            response.text
        )
        assert "query_embedding" in response.json()["error"]["message"]


def test_floats_in_metadata_read_back_as_floats(client: TestClient) -> None:
    # JSONB keeps numbers as numeric, which prints 1e308 as a 309-digit integer.
    metadata = {"huge": 1e308, "big": 1e16, "negative": -2.5e20, "count": 10**20, "small": 1e-7}
    memory_id = ingest(
        client, "agent-1", [{"text": "x", "embedding": vector(1), "metadata": metadata}]
    )["ids"][0]
    read = client.get(f"/memories/{memory_id}").json()["metadata"]
    listed = client.get("/memories", params={"namespace": "agent-1"}).json()["memories"][0]
    retrieved = client.post(
        "/retrieve", json={"namespace": "agent-1", "query": "q", "query_embedding": vector(1)}
    ).json()["memories"][0]
    for got in (read, listed["metadata"], retrieved["metadata"]):
        assert got == metadata
        assert {key: type(value) for key, value in got.items()} == {
            key: type(value) for key, value in metadata.items()
        }


def test_too_many_items_is_rejected(client: TestClient) -> None:
    memories = [{"text": "x", "embedding": [1.0] + [0.0] * (DIM - 1)}] * 1001
    response = client.post("/memories", json={"namespace": "agent-1", "memories": memories})
    assert response.status_code == 413
    assert error_code(response) == "limit_exceeded"


def test_empty_batch_is_rejected(client: TestClient) -> None:
    response = client.post("/memories", json={"namespace": "agent-1", "memories": []})
    assert response.status_code == 422 and error_code(response) == "validation_error"


@pytest.mark.parametrize("namespace", ["", "has space", "-leading-dash", "x" * 129, "semi;colon"])
def test_malformed_namespace_is_rejected(client: TestClient, namespace: str) -> None:
    response = client.post(
        "/memories",
        json={"namespace": namespace, "memories": [{"text": "x", "embedding": vector(1)}]},
    )
    assert response.status_code == 422 and "namespace" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"namespace": "a", "memories": [',
        b'{"namespace": "a\xc3\x28", "memories": []}',
        b'{"namespace": "a", "memories": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"namespace": "a", "memories": [{"text": "x", "n": 1' + b"0" * 5000 + b"}]}",
    ],
    ids=["truncated", "invalid-utf8", "100k-deep-arrays", "5000-digit-number"],
)
def test_malformed_json_is_a_400(client: TestClient, body: bytes) -> None:
    response = client.post("/memories", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and error_code(response) == "malformed_json", response.text
    assert response.json()["error"]["message"].startswith("request body is not valid JSON")


def test_unknown_memory_id_is_a_404(client: TestClient) -> None:
    assert error_code(client.get("/memories/987654")) == "not_found"
    assert client.delete("/memories/987654").status_code == 404


def test_non_integer_memory_id_is_a_422(client: TestClient) -> None:
    response = client.get("/memories/abc")
    assert response.status_code == 422 and error_code(response) == "validation_error"


@pytest.mark.parametrize(
    "cursor",
    [
        "!!!",
        "bTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",  # m + 32 nines: past bigint
        "bTkyMjMzNzIwMzY4NTQ3NzU4MDg",  # m + 2**63
        "bS0x",  # m-1
        "bTFfMA",  # m1_0, which int() reads as 10
        "b\u00e9",  # not ASCII, so not base64 at all
    ],
)
def test_forged_cursor_is_rejected(client: TestClient, cursor: str) -> None:
    ingest(client, "agent-1", [{"text": "x", "embedding": vector(1)}])
    response = client.get("/memories", params={"namespace": "agent-1", "cursor": cursor})
    assert response.status_code == 422 and error_code(response) == "invalid_input", response.text


def documented_error_table() -> set[tuple[int, str]]:
    """The (status, code) rows of the error table in docs/api.md."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = page.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| `(\w+)` \|", section, re.MULTILINE)
    return {(int(status), code) for status, code in rows}


def domain_errors(cls: type[EarmError] = EarmError) -> list[type[EarmError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *domain_errors(direct))]


def test_every_error_code_the_api_answers_with_is_in_the_documented_table(
    client: TestClient,
) -> None:
    answered = {(status_for(error("")), error.code) for error in domain_errors()}
    for response in (
        client.put("/memories/1"),
        client.get("/no-such-route"),
        client.get("/memories/abc"),
        client.post("/memories", content=b"{", headers={"content-type": "application/json"}),
    ):
        answered.add((response.status_code, error_code(response)))
    assert (405, "method_not_allowed") in answered
    assert answered - documented_error_table() == set()


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["schema_revision"]


def test_probes_answer_head_as_they_answer_get(client: TestClient) -> None:
    """Load balancers and uptime checks probe with HEAD, which answered 405."""
    for path in ("/healthz", "/readyz"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
