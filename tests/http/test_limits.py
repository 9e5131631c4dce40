"""Request limits: body size (413 before parsing, declared or streamed), text, batch, k,
candidates, budget, page size, metadata size and depth; all in the JSON error format."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.ingest.validation import json_depth
from service.settings import Settings
from service.testing import LoopbackServer

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
    assert (settings.header_timeout_s, settings.body_timeout_s) == (10.0, 20.0)


def test_json_depth_counts_containers_iteratively() -> None:
    assert json_depth(1) == 0 and json_depth({}) == 1 and json_depth({"a": [1, {"b": 2}]}) == 3
    deep: list = []
    for _ in range(100_000):  # far beyond the recursion limit
        deep = [deep]
    assert json_depth(deep) == 100_001


def test_a_declared_body_over_the_limit_is_refused_before_parsing(api: TestClient) -> None:
    response = api.post(
        "/memories",
        content=b"{" + b" " * (64 * 1024) + b"}",
        headers={"content-type": "application/json"},
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


def test_a_retrieve_without_candidates_takes_them_from_the_setting(
    limited_settings: Settings,
) -> None:
    settings = limited_settings.model_copy(update={"default_candidates": 3})
    with TestClient(create_app(settings)) as api:
        assert ingest(api, *(memory(text=f"memory {i}") for i in range(5))).status_code == 201
        by_default = retrieve(api, policy="full")
        other_question = (np.arange(384) % 7 + 1.0).tolist()
        asked = retrieve(api, query_embedding=other_question, policy="full", candidates=5)
        over_budget = retrieve(api, budget=4)
    # `full` scores every candidate (none reused: another question), so the calls count them.
    assert by_default.json()["scorer_calls"] == 3
    assert asked.json()["scorer_calls"] == 5
    assert_error(over_budget, 422, "invalid_input")
    assert "candidates=3" in over_budget.json()["error"]["message"]


def test_a_default_candidates_above_the_maximum_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="EARM_DEFAULT_CANDIDATES=2000 is above"):
        Settings(default_candidates=2000, _env_file=None)


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


# ------------------------------------------------------------------------- slow clients

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def slow_client_target(database_url: str) -> Iterator[tuple[str, int]]:
    """`earm serve` as operators run it (uvicorn, a real socket), with 1 s header and body
    timeouts; (host, port)."""
    engine = create_engine(database_url)
    with engine.begin() as conn:  # keyless: the clients send no key
        conn.execute(text("TRUNCATE api_keys, auth_settings"))
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": database_url,
        "EARM_EMBEDDER": "none",
        "EARM_HEADER_TIMEOUT_S": str(TIMEOUT_S),
        "EARM_BODY_TIMEOUT_S": str(TIMEOUT_S),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = next(
            int(match.group(1))
            for line in process.stderr
            if (match := re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line))
        )
    except StopIteration:
        raise AssertionError(f"earm serve exited with {process.wait()}") from None
    threading.Thread(target=process.stderr.read, daemon=True).start()  # keep the log pipe flowing
    try:
        yield "127.0.0.1", port
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def trickle(
    target: tuple[str, int], head: bytes, drip: bytes, limit_s: float = 5.0
) -> tuple[float, bytes]:
    """Connect, send ``head``, then ``drip`` one byte every 0.1 s (over and over; nothing if
    empty) until the server closes the connection or ``limit_s`` passes. Returns how long the
    connection stayed open and everything the server answered."""
    answer = b""
    sent = 0
    with socket.create_connection(target) as sock:
        sock.sendall(head)
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            if select.select([sock], [], [], 0.1)[0]:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                answer += chunk
            elif drip:
                try:
                    sock.sendall(drip[sent % len(drip) : sent % len(drip) + 1])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 1
        return time.monotonic() - started, answer


def assert_cut_off(open_s: float, answer: bytes) -> None:
    assert TIMEOUT_S - 0.2 < open_s < TIMEOUT_S + 2.0, f"open for {open_s:.1f} s"
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(
    slow_client_target: tuple[str, int],
) -> None:
    assert_cut_off(*trickle(slow_client_target, b"", b""))


def test_a_request_head_sent_slowly_is_cut_off_at_the_header_timeout(
    slow_client_target: tuple[str, int],
) -> None:
    open_s, answer = trickle(
        slow_client_target, b"GET /healthz HTTP/1.1\r\nHost: earm\r\n", b"X-Slow: yes\r\n"
    )
    assert_cut_off(open_s, answer)
    assert b"EARM_HEADER_TIMEOUT_S" in answer


def test_bodies_sent_slowly_are_answered_408_at_the_body_timeout(
    slow_client_target: tuple[str, int],
) -> None:
    head = (
        b"POST /memories HTTP/1.1\r\nHost: earm\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    body = b'{"namespace": "agent-1", "memories": [{"text": "' + b"x" * 1000
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: trickle(slow_client_target, head, body), range(20)))
    for open_s, answer in results:
        assert_cut_off(open_s, answer)
        assert b'"code":"request_timeout"' in answer and b"EARM_BODY_TIMEOUT_S" in answer
        assert b"connection: close" in answer.lower()


def test_a_prompt_client_keeps_its_connection_across_the_timeouts(
    slow_client_target: tuple[str, int],
) -> None:
    """The header timer runs while a request head is arriving, not while a kept-alive
    connection waits for its next request; http.client reuses one socket and never retries."""
    connection = http.client.HTTPConnection(*slow_client_target, timeout=5)
    try:
        statuses = []
        for method, path, body in [
            ("GET", "/healthz", None),
            ("POST", "/memories", {"namespace": "agent-1", "memories": [memory()]}),
            ("GET", "/healthz", None),
        ]:
            headers = {"Content-Type": "application/json"} if body else {}
            connection.request(
                method, path, body=json.dumps(body) if body else None, headers=headers
            )
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
            time.sleep(TIMEOUT_S + 0.5)
    finally:
        connection.close()
    assert statuses == [200, 201, 200]
