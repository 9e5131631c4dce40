"""`DELETE /namespaces/X` racing every other write and read of X: ingests, retrieves, feedback,
edits and trace reads answer as they would before or after the erase (201, 200, or 404 for what
the erase took), never a 500; and an ingest never acknowledges a memory the erase took."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.http.app import create_app
from service.settings import Settings
from service.testing import (
    GatedEmbed,
    LoopbackServer,
    chat_completions_app,
    embeddings_app,
    text_vector,
)

DIM = 384
NAMESPACE = "raced"
HELD = "held:"  # texts the `gate` fixture holds until the test opens it
WAIT_S = 60  # a bound on what a broken service makes the test wait, not a latency target
RACE_S = 3.0  # how long the clients race the eraser


def vector(text: str) -> list[float]:
    return text_vector(text, DIM)



@pytest.fixture
def service_url(clean_database: str, gate: GatedEmbed) -> Iterator[str]:
    """A service whose embedder is the gated stand-in and whose scorer answers 0.5."""

    async def judge(prompt: str) -> str:
        return "0.5"

    with LoopbackServer(embeddings_app(gate)) as embeddings, LoopbackServer(
        chat_completions_app(judge)
    ) as scorer:
        settings = Settings(
            database_url=clean_database,
            embedder="openai",
            embedder_base_url=f"{embeddings.url}/v1",
            embedding_dim=DIM,
            embedder_timeout_s=WAIT_S,
            embedder_max_retries=0,
            scorer="openai",
            scorer_base_url=f"{scorer.url}/v1",
            scorer_max_retries=0,
            _env_file=None,
        )
        with LoopbackServer(create_app(settings)) as service:
            yield service.url


def test_an_ingest_that_embedded_across_an_erase_acknowledges_only_stored_memories(
    service_url: str, gate: GatedEmbed
) -> None:
    kept = {"external_id": "kept", "text": "kept", "embedding": vector("kept")}
    with httpx.Client(base_url=service_url, timeout=WAIT_S) as http, ThreadPoolExecutor(1) as pool:
        stored = http.post("/memories", json={"namespace": NAMESPACE, "memories": [kept]})
        assert stored.status_code == 201, stored.text
        # A retry of the stored memory with a new one: the stored id is looked up, then the
        # new text waits for the embedder while the erase takes both.
        batch = [kept, {"external_id": "new", "text": f"{HELD} new"}]
        ingest = pool.submit(
            http.post, "/memories", json={"namespace": NAMESPACE, "memories": batch}
        )
        assert gate.arrived.acquire(timeout=WAIT_S), "the ingest never reached the embedder"
        erased = http.delete(f"/namespaces/{NAMESPACE}")
        assert erased.status_code == 200, erased.text
        assert erased.json()["memories"] == 1
        gate.opened.set()

        response = ingest.result()
        assert response.status_code == 201, response.text
        assert response.json()["created"] == 2  # both created afresh, after the erase
        for memory_id in response.json()["ids"]:
            assert http.get(f"/memories/{memory_id}").status_code == 200


def race(
    clients: list[Callable[[httpx.Client], list[int]]], service_url: str
) -> tuple[Counter[int], int]:
    """Run each client in a loop for :data:`RACE_S` while the namespace is erased every 10 ms;
    the statuses the clients saw, and how many erases found something to erase."""
    stop = threading.Event()
    statuses: Counter[int] = Counter()
    erases = 0

    def loop(client: Callable[[httpx.Client], list[int]]) -> None:
        with httpx.Client(base_url=service_url, timeout=WAIT_S) as http:
            while not stop.is_set():
                statuses.update(client(http))

    with ThreadPoolExecutor(len(clients)) as pool, httpx.Client(
        base_url=service_url, timeout=WAIT_S
    ) as http:
        running = [pool.submit(loop, client) for client in clients]
        deadline = time.monotonic() + RACE_S
        while time.monotonic() < deadline:
            erased = http.delete(f"/namespaces/{NAMESPACE}")
            assert erased.status_code in (200, 404), erased.text
            erases += erased.status_code == 200
            time.sleep(0.01)
        stop.set()
        for client in running:
            client.result()
    return statuses, erases


def ingester(worker: int) -> Callable[[httpx.Client], list[int]]:
    counter = iter(range(10**6))

    def ingest(http: httpx.Client) -> list[int]:
        n = next(counter)
        memories = [
            {"text": f"w{worker} n{n} m{m}", "embedding": vector(f"{worker}-{n}-{m}")}
            for m in range(3)
        ]
        response = http.post("/memories", json={"namespace": NAMESPACE, "memories": memories})
        assert response.status_code == 201, response.text
        return [response.status_code]

    return ingest


def test_ingests_racing_erases_are_all_stored(service_url: str) -> None:
    statuses, erases = race([ingester(worker) for worker in range(4)], service_url)
    assert set(statuses) == {201}
    assert erases > 0


def user_of_stored_memories(http: httpx.Client) -> list[int]:
    """Retrieve (200 even when the erase took the namespace), then feedback, an edit and a trace
    read of what it returned (404 once the erase took them)."""
    query = {"namespace": NAMESPACE, "query": "w0", "query_embedding": vector("q"), "k": 3}
    retrieved = http.post("/retrieve", json=query)
    assert retrieved.status_code == 200, retrieved.text
    result = retrieved.json()
    if not result["memories"] or result["query_id"] is None:
        return [retrieved.status_code]
    memory_id = result["memories"][0]["id"]
    responses = [
        http.post(
            "/feedback",
            json={"namespace": NAMESPACE, "query_id": result["query_id"],
                  "scores": [{"memory_id": memory_id, "score": 0.9}]},
        ),
        http.patch(f"/memories/{memory_id}", json={"metadata": {"seen": True}}),
        http.get(f"/queries/{result['query_id']}", params={"namespace": NAMESPACE}),
    ]
    for response in responses:
        assert response.status_code in (200, 404), response.text
    return [retrieved.status_code] + [response.status_code for response in responses]


def test_retrieves_feedback_edits_and_traces_racing_erases_never_fail(service_url: str) -> None:
    clients = [ingester(0), ingester(1), user_of_stored_memories, user_of_stored_memories]
    statuses, erases = race(clients, service_url)
    assert set(statuses) <= {200, 201, 404}
    assert statuses[200] > 0 and erases > 0
