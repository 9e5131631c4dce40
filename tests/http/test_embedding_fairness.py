"""A large ingest does not stall other clients: while ingests wait for the embedder to embed
their texts, and edits their new texts, retrieves are answered, with a client vector and with a
query text the embedder must embed as well. The embedder is a loopback embeddings endpoint
that holds the requests' texts at a gate until the test opens it; nothing is timed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from service.http.app import create_app
from service.settings import Settings
from service.testing import GatedEmbed, LoopbackServer, embeddings_app, text_vector

DIM = 384  # the test database's dimension
#: Texts the embedder holds at the gate: those of the held ingests.
HELD = "held:"
#: Held ingests at once: every connection of the service's pool (EARM_DB_POOL_SIZE=1 opens two).
HELD_INGESTS = 2
WAIT_S = 60  # a bound on what a broken service makes the test wait, not a latency target


def vector(text: str) -> list[float]:
    return text_vector(text, DIM)



#: How a held request reaches the embedder: (method, path, body) of held request ``n``, given
#: the id of the memory ``bulk-n`` stored beforehand under a text that is not held.
HeldRequest = Callable[[int, int], tuple[str, str, dict[str, Any]]]
HELD_REQUESTS: dict[str, HeldRequest] = {
    # Each looks its external ids up in the database before it embeds.
    "ingest": lambda n, _: ("POST", "/memories", {
        "namespace": f"bulk-{n}",
        "memories": [{"text": f"{HELD} bulk {n}", "external_id": f"new-{n}"}],
    }),
    # Each reads the stored memory before it embeds the new text.
    "patch": lambda n, memory_id: (
        "PATCH", f"/memories/{memory_id}", {"text": f"{HELD} edited {n}"}
    ),
    "ingest-update": lambda n, _: ("POST", "/memories", {
        "namespace": f"bulk-{n}", "on_conflict": "update",
        "memories": [{"text": f"{HELD} edited {n}", "external_id": f"bulk-{n}"}],
    }),
}


@pytest.mark.parametrize("held_request", HELD_REQUESTS.values(), ids=HELD_REQUESTS.keys())
def test_retrieves_are_answered_while_ingests_and_edits_wait_for_the_embedder(
    clean_database: str, gate: GatedEmbed, held_request: HeldRequest
) -> None:
    """An edit's new text (PATCH, or an ingest with on_conflict=update) was embedded inside the
    transaction that had read the stored memory, holding a pooled connection meanwhile."""
    with LoopbackServer(embeddings_app(gate)) as embeddings:
        settings = Settings(
            database_url=clean_database,
            embedder="openai",
            embedder_base_url=f"{embeddings.url}/v1",
            embedding_dim=DIM,
            embedder_timeout_s=WAIT_S,
            embedder_max_retries=0,
            db_pool_size=1,
            _env_file=None,
        )
        with LoopbackServer(create_app(settings)) as service, httpx.Client(
            base_url=service.url, timeout=WAIT_S
        ) as http, ThreadPoolExecutor(HELD_INGESTS) as clients:
            probe = [{"text": f"memory {n}"} for n in range(5)]
            stored = http.post("/memories", json={"namespace": "probe", "memories": probe})
            assert stored.status_code == 201, stored.text
            stored_ids = [
                http.post("/memories", json={
                    "namespace": f"bulk-{n}",
                    "memories": [{"text": f"bulk {n}", "external_id": f"bulk-{n}"}],
                }).json()["ids"][0]
                for n in range(HELD_INGESTS)
            ]

            # Every connection of the pool: one held request that kept its connection while
            # it waited would leave none to retrieves.
            held: list[Future[httpx.Response]] = []
            for n, memory_id in enumerate(stored_ids):
                method, path, body = held_request(n, memory_id)
                held.append(clients.submit(http.request, method, path, json=body))
            for _ in held:
                assert gate.arrived.acquire(timeout=WAIT_S), "a request never reached the embedder"

            with_vector = http.post(
                "/retrieve",
                json={"namespace": "probe", "query": "memory", "query_embedding": vector("q"),
                      "policy": "semantic"},
            )
            with_text = http.post(
                "/retrieve", json={"namespace": "probe", "query": "memory 3", "policy": "semantic"}
            )
            assert with_vector.status_code == 200, with_vector.text
            assert with_text.status_code == 200, with_text.text
            assert not any(request.done() for request in held)  # answered while all were held

            gate.opened.set()
            assert all(request.result().is_success for request in held), [
                request.result().text for request in held
            ]
            for n, memory_id in enumerate(stored_ids):
                if held_request is not HELD_REQUESTS["ingest"]:
                    assert http.get(f"/memories/{memory_id}").json()["text"] == f"{HELD} edited {n}"
