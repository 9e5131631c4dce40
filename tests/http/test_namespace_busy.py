"""A namespace whose row lock is held (a stuck writer, a long refit write) makes its own
requests wait at most ``EARM_DB_LOCK_TIMEOUT_S``, then answers 503 ``namespace_busy`` naming
it; every waiter lets go of its pooled connection, so other namespaces keep being answered."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.settings import Settings

DIM = 384


@pytest.fixture
def client(clean_database: str) -> Iterator[TestClient]:
    settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                        db_pool_size=2, db_lock_timeout_s=0.5, _env_file=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def ingest(client: TestClient, namespace: str) -> None:
    rng = np.random.default_rng(0)
    memories = [{"text": f"m{i}", "embedding": rng.normal(size=DIM).tolist()} for i in range(5)]
    response = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert response.status_code == 201, response.text


def retrieve(client: TestClient, namespace: str, i: int = 0) -> tuple[int, dict]:
    vector = np.random.default_rng(i).normal(size=DIM).tolist()
    response = client.post("/retrieve", json={
        "namespace": namespace, "query": f"q{i}", "query_embedding": vector,
    })
    return response.status_code, response.json() | {"retry_after": response.headers.get(
        "retry-after")}


def test_a_namespace_locked_too_long_answers_503_naming_it_while_others_are_answered(
    client: TestClient, clean_database: str
) -> None:
    ingest(client, "busy")
    ingest(client, "calm")
    holder_engine = create_engine(clean_database)
    try:
        with holder_engine.connect() as holder:
            holder.execute(text("SELECT FROM namespaces WHERE name = 'busy' FOR UPDATE"))
            # More waiters than the pool has connections (2, plus as many overflow).
            with ThreadPoolExecutor(8) as pool:
                busy = list(pool.map(lambda i: retrieve(client, "busy", i), range(8)))
                calm = list(pool.map(lambda i: retrieve(client, "calm", i), range(4)))
            holder.rollback()
    finally:
        holder_engine.dispose()
    for status, body in busy:
        assert status == 503
        assert body["error"]["code"] == "namespace_busy"
        assert "'busy'" in body["error"]["message"]
        assert body["retry_after"] is not None
    assert [status for status, _ in calm] == [200] * 4
    assert retrieve(client, "busy", 99)[0] == 200  # the lock released: answered again
