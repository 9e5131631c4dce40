"""Fuzzing: schemathesis generates requests for every operation of the OpenAPI schema (valid and
invalid ones) against the real service over loopback HTTP, with a key configured. No 5xx, and
every response conforms to the schema. Then targeted hostile inputs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer

pytestmark = pytest.mark.fuzz

ADMIN_KEY = "earm_fuzzing-admin-key-0123456789abcdefghij"
EXAMPLES = 20
VECTOR = (np.arange(384) % 11 + 1.0).tolist()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
    unsupported_method,
]


@pytest.fixture(scope="module")
def service(database_url: str) -> Iterator[str]:
    """The service over loopback with an admin key, and a namespace with memories in it."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE namespaces, api_keys, auth_settings RESTART IDENTITY CASCADE"))
        conn.execute(
            text(
                "INSERT INTO api_keys (name, key_hash, namespace_patterns) "
                "VALUES ('fuzz', :h, '{*}')"
            ),
            {"h": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()},
        )
        conn.execute(text("INSERT INTO auth_settings (key_enforcement) VALUES (true)"))
    engine.dispose()
    settings_ = Settings(
        database_url=database_url,
        embedder="local",
        scorer="local",
        auth_cache_ttl_s=30,
        _env_file=None,
    )
    with LoopbackServer(create_app(settings_)) as server:
        seeded = httpx.post(
            f"{server.url}/memories",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            json={
                "namespace": "agent-42",
                "memories": [{"text": f"seed {i}", "external_id": f"s{i}"} for i in range(20)],
            },
        )
        assert seeded.status_code == 201, seeded.text
        yield server.url
    engine = create_engine(database_url)
    with engine.begin() as conn:  # leave no key behind for tests that do not clean tables
        conn.execute(text("TRUNCATE api_keys, auth_settings"))
    engine.dispose()


def _schema_document() -> dict:
    # The OpenAPI document needs no database: build it from an app that is never started.
    return create_app(Settings(embedder="none", _env_file=None)).openapi()


SCHEMA = schemathesis.openapi.from_dict(_schema_document())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
def _cases() -> list:
    cases = []
    for operation in OPERATIONS:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            cases.append(pytest.param(operation, mode, id=f"{operation.label}-{mode}"))
    return cases


# Driven by hand, not by schemathesis's pytest plugin (whose lazy loader does not run on
# pytest 9): one test per operation and generation mode, a bounded number of examples each.
@pytest.mark.parametrize(("operation", "mode"), _cases())
def test_every_operation_survives_generated_requests(operation, mode, service: str) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        # A negative case that drops the Authorization header tests exactly that: it goes
        # without the admin key (to be refused), not with the key put back and its other
        # mutations, an unknown query parameter say, left to be accepted.
        headers = case.headers or {}
        dropped_key = mode == GenerationMode.NEGATIVE and "Authorization" not in headers
        case.call_and_validate(
            base_url=service,
            headers=None if dropped_key else {"Authorization": f"Bearer {ADMIN_KEY}"},
            checks=CHECKS,
            timeout=30,
        )

    try:
        run()
    except Unsatisfiable:
        pytest.skip(f"{operation.label} has no parameters or body to make invalid")


# ----------------------------------------------------------------------- targeted inputs


@pytest.fixture
def api(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=service, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    ) as client:
        yield client


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    if code is not None:
        assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "namespace",
    ["agent'; DROP TABLE memories; --", "a b", "agent%", "agent*", "ägent", "", "-agent",
     "a" * 129, "agent\x00", "agent\n", "../etc", "agent/1"],
)
def test_hostile_namespaces_are_rejected_by_the_pattern(api: httpx.Client, namespace: str) -> None:
    assert_error(api.get("/memories", params={"namespace": namespace}), 422, "validation_error")
    body = {"namespace": namespace, "memories": [{"text": "x", "embedding": VECTOR}]}
    assert_error(api.post("/memories", json=body), 422, "validation_error")


HOSTILE_TEXTS = [
    "Robert'); DROP TABLE memories;--",
    "' OR '1'='1",
    "%_\\' \" ; -- /* */ $1 :param",
    "emoji 🧠🔥 and combining é (e\u0301), RTL \u202eevil\u202c, zero-width \u200b",
    "日本語のテキスト、한국어, العربية",
    "\ufeffBOM and \U0010ffff max code point",
    "line\nbreaks\r\nand\ttabs",
]


def test_hostile_text_and_metadata_are_stored_and_returned_byte_exact(api: httpx.Client) -> None:
    metadata = {
        "sql": "'; DROP TABLE scores; --",
        # JSONB keeps values, not bytes: numbers become numeric (so -0.0 would read back as
        # 0.0) and keys are reordered; texts are byte-exact.
        "nested": {"unicode": "🧠 é \u202e", "list": [1, 2.5, True, None, "x"]},
        "big": 10**30,
        "tiny": 5e-324,
        "key with 'quotes' and \"doubles\"": "\\",
    }
    body = {
        "namespace": "agent-exact",
        "memories": [
            {"text": t, "embedding": VECTOR, "external_id": t[:200], "metadata": metadata}
            for t in HOSTILE_TEXTS
        ],
    }
    created = api.post("/memories", json=body)
    assert created.status_code == 201, created.text
    for memory_id, sent in zip(created.json()["ids"], HOSTILE_TEXTS, strict=True):
        got = api.get(f"/memories/{memory_id}").json()
        assert got["text"].encode() == sent.encode()
        assert got["external_id"] == sent[:200]
        assert json.dumps(got["metadata"], sort_keys=True) == json.dumps(metadata, sort_keys=True)
    listed = api.get("/memories", params={"namespace": "agent-exact", "limit": 50}).json()
    assert [m["text"] for m in listed["memories"]] == HOSTILE_TEXTS
    # The metadata filter takes the same hostile values literally.
    found = api.post(
        "/retrieve",
        json={"namespace": "agent-exact", "query": "' OR 1=1 --", "query_embedding": VECTOR,
              "filters": {"sql": "'; DROP TABLE scores; --"}, "k": 20, "policy": "semantic"},
    )
    assert found.status_code == 200, found.text
    assert len(found.json()["memories"]) == len(HOSTILE_TEXTS)


@pytest.mark.parametrize(
    "memory",
    [
        {"text": "nul \x00 inside", "embedding": VECTOR},
        {"text": "ok", "embedding": VECTOR, "external_id": "nul\x00"},
        {"text": "ok", "embedding": VECTOR, "metadata": {"k": "nul\x00"}},
        {"text": "ok", "embedding": VECTOR, "metadata": {"nul\x00key": 1}},
        {"text": "ok", "embedding": VECTOR, "occurred_at": "0001-01-01T00:00:00+14:00"},
    ],
)
def test_values_postgres_cannot_store_are_422_not_500(api: httpx.Client, memory: dict) -> None:
    response = api.post("/memories", json={"namespace": "agent-42", "memories": [memory]})
    assert response.status_code == 422, response.text


def test_lone_surrogates_are_422(api: httpx.Client) -> None:
    raw = b'{"namespace": "agent-42", "memories": [{"text": "\\ud800", "embedding": [1.0]}]}'
    response = api.post("/memories", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    raw = b'{"namespace": "agent-42", "query": "q", "filters": {"k": "\\udfff"}}'
    response = api.post("/retrieve", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_anywhere_are_422(api: httpx.Client, token: str) -> None:
    vector = json.dumps(VECTOR[:-1])[:-1] + f", {token}]"
    bodies = [
        (
            "/memories",
            f'{{"namespace": "agent-42", "memories": [{{"text": "x", "embedding": {vector}}}]}}',
        ),
        (
            "/memories",
            f'{{"namespace": "agent-42", "memories": '
            f'[{{"text": "x", "metadata": {{"v": {token}}}}}]}}',
        ),
        ("/retrieve", f'{{"namespace": "agent-42", "query": "q", "query_embedding": {vector}}}'),
        ("/retrieve", f'{{"namespace": "agent-42", "query": "q", "filters": {{"v": {token}}}}}'),
        (
            "/feedback",
            f'{{"namespace": "agent-42", "query_id": 1, '
            f'"scores": [{{"memory_id": 1, "score": {token}}}]}}',
        ),
    ]
    for path, raw in bodies:
        response = api.post(
            path, content=raw.encode(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 422, (path, response.text)


@pytest.mark.parametrize("huge", [2**63, 10**30, -(2**63) - 1])
def test_ids_beyond_bigint_are_404_or_422(api: httpx.Client, huge: int) -> None:
    for response in (
        api.get(f"/memories/{huge}"),
        api.delete(f"/memories/{huge}"),
        api.post("/feedback", json={"namespace": "agent-42", "query_id": huge,
                                    "scores": [{"memory_id": 1, "score": 0.5}]}),
        api.post("/feedback", json={"namespace": "agent-42", "query_id": 1,
                                    "scores": [{"memory_id": huge, "score": 0.5}]}),
    ):
        assert response.status_code in (404, 422), response.text


def test_huge_numbers_are_client_errors(api: httpx.Client) -> None:
    memories = [{"text": f"m{i}", "embedding": VECTOR[i:] + VECTOR[:i]} for i in range(5)]
    assert (
        api.post("/memories", json={"namespace": "agent-huge", "memories": memories}).status_code
        == 201
    )
    base = {
        "namespace": "agent-huge",
        "query": "q",
        "query_embedding": VECTOR,
        "policy": "semantic",
    }
    huge = "1" + "0" * 30
    for key, literal in (("k", huge), ("candidates", huge), ("budget", huge), ("seed", huge),
                         ("k", "1" + "0" * 5000), ("k", "1e308"), ("seed", "-" + huge)):
        raw = json.dumps(base | {key: 0}).replace(f'"{key}": 0', f'"{key}": {literal}')
        response = api.post("/retrieve", content=raw, headers={"content-type": "application/json"})
        assert response.status_code < 500, (key, literal[:10], response.text)
        assert "error" in response.json() or response.status_code == 200
    response = api.get("/memories", params={"namespace": "agent-42", "limit": str(10**30)})
    assert_error(response, 413, "limit_exceeded")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b'{"namespace": "agent-42", "query": "q"}'),
        ("application/x-www-form-urlencoded", b"namespace=agent-42&query=q"),
        ("application/xml", b"<retrieve><namespace>agent-42</namespace></retrieve>"),
        ("application/json", b"not json at all"),
        ("application/json", b""),
        ("application/json", b"\xff\xfe\x00garbage"),
        ("application/json", b"[1, 2, 3]"),
        ("application/json", b'"a string"'),
    ],
)
def test_wrong_content_types_and_bodies_are_json_4xx(
    api: httpx.Client, content_type: str, body: bytes
) -> None:
    response = api.post("/retrieve", content=body, headers={"content-type": content_type})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["code"] in ("malformed_json", "validation_error")


def test_a_degenerate_namespace_refit_is_not_a_500(api: httpx.Client) -> None:
    """Found by the fuzzer: identical memories, identical queries, so every observation is the
    same; the refit of the fifth query drives the factors to ~1e-319."""
    memories = [{"text": "0", "embedding": VECTOR} for _ in range(3)]
    assert (
        api.post("/memories", json={"namespace": "degenerate", "memories": memories}).status_code
        == 201
    )
    for _ in range(6):
        response = api.post(
            "/retrieve", json={"namespace": "degenerate", "query": "0", "query_embedding": VECTOR}
        )
        assert response.status_code == 200, response.text
