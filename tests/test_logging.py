"""One structured log line per request, request ids, and the JSON logging of `earm serve`."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.logs import ACCESS_LOGGER, JsonFormatter
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SECRET_MEMORY = "the vault code is 0451 and nobody may know"
SECRET_QUERY = "what is the secret vault code"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    formatter = JsonFormatter()
    return [json.loads(formatter.format(r)) for r in caplog.records if r.name == ACCESS_LOGGER]


def test_each_request_logs_one_json_line_with_its_fields_and_no_text(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ingest = client.post(
        "/memories",
        json={"namespace": "agent-1", "memories": [{"text": SECRET_MEMORY}, {"text": "other"}]},
    )
    retrieve = client.post(
        "/retrieve", json={"namespace": "agent-1", "query": SECRET_QUERY, "policy": "full"}
    )
    missing = client.get("/memories/999")
    assert (ingest.status_code, retrieve.status_code, missing.status_code) == (201, 200, 404)

    lines = access_lines(caplog)
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/memories", 201),
        ("POST", "/retrieve", 200),
        ("GET", "/memories/{memory_id}", 404),
    ]
    for line, response in zip(lines, (ingest, retrieve, missing), strict=True):
        assert line["level"] == "INFO" and line["message"] == "request"
        assert line["duration_ms"] > 0
        assert line["request_id"] == response.headers["X-Request-ID"]
    assert lines[0]["namespace"] == "agent-1"
    assert lines[1]["namespace"] == "agent-1"
    assert lines[1]["policy"] == "full"
    assert lines[1]["scorer_calls"] == retrieve.json()["scorer_calls"] == 2

    formatter = JsonFormatter()
    everything = "\n".join(formatter.format(r) for r in caplog.records)
    assert SECRET_MEMORY not in everything
    assert SECRET_QUERY not in everything


def test_request_id_is_echoed_when_sane_and_generated_otherwise(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    for sent, kept in [
        ("req-42.alpha:beta", True),
        ("x" * 300, False),
        ("has spaces", False),
        (None, False),
    ]:
        headers = {"X-Request-ID": sent} if sent is not None else {}
        echoed = client.get("/healthz", headers=headers).headers["X-Request-ID"]
        if kept:
            assert echoed == sent
        else:
            assert echoed != sent and len(echoed) == 32 and int(echoed, 16) >= 0
        assert access_lines(caplog)[-1]["request_id"] == echoed


def test_error_responses_carry_the_request_id(client: TestClient) -> None:
    # (A retrieve on an unknown namespace is no error any more: 200 with no memories.)
    response = client.get("/stats", params={"namespace": "nobody"}, headers={"X-Request-ID": "abc"})
    assert response.status_code == 404
    assert response.headers["X-Request-ID"] == "abc"


def test_lines_logged_while_serving_a_request_carry_its_request_id(
    judge_settings: Callable[..., Settings],
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    scorer_log = logging.getLogger("service.providers.http_scorer")
    scorer_log.addHandler(handler)
    try:
        with (
            LoopbackServer(chat_completions_app(lambda prompt: "no idea")) as judge,
            TestClient(create_app(judge_settings(judge.url))) as client,
        ):
            client.post(
                "/memories",
                json={"namespace": "agent-1", "memories": [{"text": "a"}, {"text": "b"}]},
            )
            response = client.post(
                "/retrieve",
                json={"namespace": "agent-1", "query": "q", "policy": "full"},
                headers={"X-Request-ID": "trace-me"},
            )
    finally:
        scorer_log.removeHandler(handler)
    assert response.json()["degraded"] is True
    warnings = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert warnings and all(w["request_id"] == "trace-me" for w in warnings)
    assert "calls failed" in warnings[0]["message"]


SERVE_LOGGING = """
import logging
import os
from service.logs import configure_logging
configure_logging(os.environ["EARM_LOG_LEVEL"], os.environ.get("ACCESS_LOG", "1") == "1")
logging.getLogger("earm.access").info("request", extra={"path": "/retrieve"})
logging.getLogger("service.example").info("started", extra={"port": 8000})
logging.getLogger("service.example").warning("careful")
logging.getLogger("uvicorn.error").info("Uvicorn running", extra={"color_message": "\\x1b[1m"})
"""


@pytest.mark.parametrize(
    ("level", "expected"),
    [("INFO", ["request", "started", "careful", "Uvicorn running"]), ("warning", ["careful"])],
)
def test_serve_logging_writes_json_lines_at_the_configured_level(
    level: str, expected: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE_LOGGING],
        env=os.environ | {"EARM_LOG_LEVEL": level},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["message"] for line in lines] == expected
    assert all({"ts", "level", "logger"} <= set(line) for line in lines)
    assert "color_message" not in done.stderr
    if level == "INFO":
        assert lines[1]["port"] == 8000 and lines[1]["logger"] == "service.example"


def test_without_the_access_log_a_request_writes_no_line_and_the_rest_still_shows() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE_LOGGING],
        env=os.environ | {"EARM_LOG_LEVEL": "INFO", "ACCESS_LOG": "0"},
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["message"] for line in lines] == ["started", "careful", "Uvicorn running"]
