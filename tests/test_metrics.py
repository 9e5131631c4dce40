"""GET /metrics: the Prometheus exposition, parsed with prometheus_client's own parser."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

DIM = 384
N_MEMORIES = 12
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of an exposition."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(parsed: dict, name: str, **labels: str) -> float:
    return parsed.get((name, frozenset(labels.items())), 0.0)


def total(parsed: dict, name: str, **labels: str) -> float:
    """Sum over every sample of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(
        v for (n, sample_labels), v in parsed.items() if n == name and wanted <= set(sample_labels)
    )


def judge_reply(prompt: str) -> str:
    """Half the memories get a score, the other half an unparseable answer."""
    number = int(prompt.split("Memory:\nmemory ", 1)[1].split()[0])
    return "0.5" if number % 2 == 0 else "I would rather not say"


@pytest.fixture
def judged_client(judge_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with (
        LoopbackServer(chat_completions_app(judge_reply)) as judge,
        TestClient(create_app(judge_settings(judge.url))) as client,
    ):
        yield client


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


CENTER = unit(np.random.default_rng(42).normal(size=DIM))


def ingest(client: TestClient, namespace: str = "agent-1") -> None:
    """Memories from near the query centre to far from it, so scores spread over [0, 1]."""
    rng = np.random.default_rng(0)
    memories = [
        {
            "text": f"memory {i}",
            "embedding": (
                CENTER * (1 - i / N_MEMORIES) + 0.5 * unit(rng.normal(size=DIM))
            ).tolist(),
        }
        for i in range(N_MEMORIES)
    ]
    assert (
        client.post("/memories", json={"namespace": namespace, "memories": memories}).status_code
        == 201
    )


def retrieve(client: TestClient, **body) -> dict:
    rng = np.random.default_rng(len(str(body)))
    vector = unit(CENTER + 0.3 * unit(rng.normal(size=DIM)))
    body = {"namespace": "agent-1", "query": "q", "query_embedding": vector.tolist()} | body
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_metrics_after_retrieves_show_phase_histograms_and_scorer_outcomes(
    judged_client: TestClient,
) -> None:
    ingest(judged_client)
    # Three different questions (a repeat would reuse the pairs scored before).
    results = [retrieve(judged_client, policy="full", k=5, query="q" * n) for n in (1, 2, 3)]

    response = judged_client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    parsed = samples(response.text)

    for phase in ("embed", "search", "score", "complete", "record", "total"):
        assert value(parsed, "earm_retrieve_phase_seconds_count", phase=phase, policy="full") == 3
    assert value(parsed, "earm_retrieve_phase_seconds_sum", phase="score", policy="full") > 0
    assert value(parsed, "earm_completion_seconds_count", policy="full") == 3
    assert value(parsed, "earm_retrieves_total", policy="full", degraded="true") == 3

    calls = sum(r["scorer_calls"] for r in results)
    assert calls == 3 * N_MEMORIES
    assert value(parsed, "earm_scorer_calls_total", scorer="openai", outcome="ok") == calls / 2
    assert (
        value(parsed, "earm_scorer_calls_total", scorer="openai", outcome="unparseable")
        == calls / 2
    )
    assert value(parsed, "earm_scorer_call_duration_seconds_count", scorer="openai") == calls
    assert value(parsed, "earm_retrieve_scorer_calls_total", policy="full") == calls

    returned = [m["source"] for r in results for m in r["memories"]]
    for source in set(returned):
        assert (
            value(parsed, "earm_returned_memories_total", source=source) == returned.count(source)
        )

    labels = {"method": "POST", "route": "/retrieve", "status": "200"}
    assert value(parsed, "earm_http_requests_total", **labels) == 3
    assert value(parsed, "earm_http_request_duration_seconds_count", **labels) == 3

    # Gauges from the namespace counters.
    assert value(parsed, "earm_database_up") == 1
    assert value(parsed, "earm_namespaces") == 1
    assert value(parsed, "earm_namespace_queries", namespace="agent-1") == 3
    assert value(parsed, "earm_namespace_scorer_calls", namespace="agent-1") == calls
    assert value(parsed, "earm_namespace_full_rerank_calls", namespace="agent-1") == calls
    assert value(parsed, "earm_namespace_observations", namespace="agent-1") == calls / 2
    assert value(parsed, "earm_namespace_calls_saved_ratio", namespace="agent-1") == 0
    assert value(parsed, "earm_scorer_calls_recorded") == calls
    # The scorer's concurrency window, as the scorer has it (the queue signal may have cut it:
    # the judge here works on one call at a time, on the test's CPU, and queues the rest); its
    # breaker closed, as the judge answered.
    scorer = judged_client.app.state.components.scorer
    assert value(parsed, "earm_scorer_concurrency_window", scorer="openai") == scorer.limit.window
    assert value(parsed, "earm_scorer_breaker_open", scorer="openai") == 0


def test_a_scorer_backend_that_refuses_connects_shows_its_breaker_open(
    judge_settings: Callable[..., Settings],
) -> None:
    """Six anchors refused by a port nobody listens on: more than the breaker's five in a row,
    so /metrics says the backend counts as down, and the retrieve answered degraded."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{unused.getsockname()[1]}"
    with TestClient(create_app(judge_settings(dead_url))) as client:
        ingest(client)
        assert retrieve(client, budget=6, candidates=N_MEMORIES)["degraded"] is True
        parsed = samples(client.get("/metrics").text)
    assert value(parsed, "earm_scorer_breaker_open", scorer="openai") == 1


def test_local_scorer_calls_are_counted(client: TestClient) -> None:
    ingest(client)
    result = retrieve(client, budget=6, candidates=N_MEMORIES)
    parsed = samples(client.get("/metrics").text)
    assert result["scorer_calls"] == 6
    assert value(parsed, "earm_scorer_calls_total", scorer="local", outcome="ok") == 6
    assert value(parsed, "earm_namespace_calls_saved_ratio", namespace="agent-1") == 0.5
    assert value(parsed, "earm_namespace_next_budget_ratio", namespace="agent-1") == 1.0


def test_requests_are_labelled_by_route_template_not_raw_path(client: TestClient) -> None:
    ingest(client)
    assert client.get("/memories/1").status_code == 200
    assert client.get("/memories/999").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    parsed = samples(client.get("/metrics").text)
    route = "/memories/{memory_id}"
    assert value(parsed, "earm_http_requests_total", method="GET", route=route, status="200") == 1
    assert value(parsed, "earm_http_requests_total", method="GET", route=route, status="404") == 1
    assert (
        value(parsed, "earm_http_requests_total", method="GET", route="<unmatched>", status="404")
        == 1
    )
    assert not any(
        "/memories/1" in dict(sample_labels).get("route", "") for _, sample_labels in parsed
    )


def test_each_app_has_its_own_metrics(settings: Settings) -> None:
    with TestClient(create_app(settings)) as first, TestClient(create_app(settings)) as second:
        first.get("/healthz")
        first.get("/healthz")
        second.get("/healthz")
        first_parsed = samples(first.get("/metrics").text)
        second_parsed = samples(second.get("/metrics").text)
    labels = {"method": "GET", "route": "/healthz", "status": "200"}
    assert value(first_parsed, "earm_http_requests_total", **labels) == 2
    assert value(second_parsed, "earm_http_requests_total", **labels) == 1


WORKER = """
import sys
from service.metrics import Metrics
metrics = Metrics()
assert metrics.multiprocess
metrics.observe_scorer_call("openai", "ok", 0.2)
metrics.observe_request("POST", "/retrieve", 200, 0.3)
"""

SCRAPE = """
from service.metrics import Metrics
from service.budget import BudgetSchedule
from service.providers.scorer_health import ScorerHealth
health = ScorerHealth("openai").snapshot()
print(Metrics().render(None, BudgetSchedule.parse("0:1.0"), health).decode())
"""


def test_multiprocess_mode_adds_up_every_worker(tmp_path: Path) -> None:
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def run(code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run(WORKER)
    run(WORKER)
    parsed = samples(run(SCRAPE))
    assert value(parsed, "earm_scorer_calls_total", scorer="openai", outcome="ok") == 2
    labels = {"method": "POST", "route": "/retrieve", "status": "200"}
    assert value(parsed, "earm_http_requests_total", **labels) == 2
    assert value(parsed, "earm_http_request_duration_seconds_count", **labels) == 2
    assert value(parsed, "earm_database_up") == 0
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir()))  # per-process files exist
