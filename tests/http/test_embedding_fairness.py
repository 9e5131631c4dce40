"""A large ingest does not stall other clients: while ingests wait for the embedder to embed
their texts, retrieves are answered, with a client vector and with a query text the embedder
must embed as well. The embedder is a loopback embeddings endpoint that holds the ingests'
texts at a gate until the test opens it; nothing is timed."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import httpx

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



def test_retrieves_are_answered_while_ingests_wait_for_the_embedder(
    clean_database: str, gate: GatedEmbed
) -> None:
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

            # Ingests with external ids: each looks its ids up in the database before it
            # embeds, so one that kept its connection meanwhile would leave none to retrieves.
            held: list[Future[httpx.Response]] = [
                clients.submit(
                    http.post,
                    "/memories",
                    json={
                        "namespace": f"bulk-{n}",
                        "memories": [{"text": f"{HELD} bulk {n}", "external_id": f"bulk-{n}"}],
                    },
                )
                for n in range(HELD_INGESTS)
            ]
            for _ in held:
                assert gate.arrived.acquire(timeout=WAIT_S), "an ingest never reached the embedder"

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
            assert not any(ingest.done() for ingest in held)  # answered while both were held

            gate.opened.set()
            assert [ingest.result().status_code for ingest in held] == [201] * HELD_INGESTS
