"""`earm serve` and `earm worker` as child processes of a test, on one database, and the
requests and reads of the namespace they share: for the tests of API processes that leave
their background work (indexing, refits) to a worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text

from service.testing import free_port, interrupt, wait_ready

DIM = 384
NAMESPACE = "shared"
REFIT_EVERY = 4


def environment(database_url: str) -> dict[str, str]:
    """The processes' environment: no EARM_* of the caller's, quick polls (the test waits for
    work, not for timers), a refit every REFIT_EVERY queries."""
    return {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": database_url,
        "EARM_EMBEDDER": "none",
        "EARM_SCORER": "local",
        "EARM_LOG_LEVEL": "INFO",
        "EARM_REFIT_EVERY": str(REFIT_EVERY),
        "EARM_DB_POOL_SIZE": "3",
        "EARM_INDEX_POLL_INTERVAL_S": "0.2",
        "EARM_WORKER_POLL_INTERVAL_S": "0.2",
    }


class Processes:
    """Child processes of one test, each logging to a file of its own; stopped at the end."""

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.database_url = database_url
        self.workdir = workdir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *arguments: str) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "service", *arguments],
                cwd=self.workdir,  # no stray .env
                env=environment(self.database_url),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started.append(process)
        return process, log_path

    def api(self, name: str) -> tuple[str, Path]:
        port = free_port()
        process, log_path = self.start(
            name, "serve", "--no-background-work", "--port", str(port)
        )
        url = f"http://127.0.0.1:{port}"
        assert wait_ready(url, 60, process), log_path.read_text()[-3000:]
        return url, log_path

    def stop_all(self) -> None:
        for process in self.started:
            interrupt(process)


def vectors(rng: np.random.Generator, n: int) -> list[list[float]]:
    centres = np.random.default_rng(3).normal(size=(4, DIM))
    return [
        (centres[rng.integers(4)] + 0.6 * rng.normal(size=DIM)).tolist() for _ in range(n)
    ]


def ingest(url: str, rng: np.random.Generator, start: int, n: int) -> list[int]:
    """``n`` memories into NAMESPACE through the API at ``url``; their ids."""
    response = httpx.post(f"{url}/memories", timeout=30, json={
        "namespace": NAMESPACE,
        "memories": [
            {"text": f"memory {start + i}", "embedding": vector}
            for i, vector in enumerate(vectors(rng, n))
        ],
    })
    assert response.status_code == 201, response.text
    return [int(m) for m in response.json()["ids"]]


def retrieve(url: str, rng: np.random.Generator, i: int) -> int:
    """A retrieve of NAMESPACE through the API at ``url``; its query id."""
    response = httpx.post(f"{url}/retrieve", timeout=30, json={
        "namespace": NAMESPACE, "query": f"question {i}",
        "query_embedding": vectors(rng, 1)[0], "candidates": 30, "budget": 8,
    })
    assert response.status_code == 200, response.text
    return int(response.json()["query_id"])


def state(database_url: str) -> dict[str, object]:
    """NAMESPACE's rows and refit counters as the database holds them."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT (SELECT count(*) FROM memories) AS memories, "
                "(SELECT count(*) FROM memories WHERE NOT indexed) AS unindexed, "
                "(SELECT count(*) FROM queries) AS queries, "
                "(SELECT count(*) FROM scores) AS observations, "
                "n.queries_since_refit, n.last_refit_at "
                "FROM namespaces n WHERE n.name = :namespace"
            ), {"namespace": NAMESPACE}).one()
    finally:
        engine.dispose()
    return dict(row._mapping)


def until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)
