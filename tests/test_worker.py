"""`earm worker`: two API processes started with `earm serve --no-background-work`
and one worker on one database. Ingests get indexed and refits happen while the API processes
do neither; a worker killed with SIGKILL loses nothing, and a new worker resumes its work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from service.testing import free_port, interrupt, wait_ready

pytestmark = pytest.mark.processes

DIM = 384
NAMESPACE = "shared"
REFIT_EVERY = 4


def _environment(database_url: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": database_url,
        "EARM_EMBEDDER": "none",
        "EARM_SCORER": "local",
        "EARM_LOG_LEVEL": "INFO",
        "EARM_REFIT_EVERY": str(REFIT_EVERY),
        "EARM_DB_POOL_SIZE": "3",
        # Quick polls, so the test waits for work, not for timers.
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
                env=_environment(self.database_url),
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


@pytest.fixture
def processes(clean_database: str, tmp_path: Path) -> Iterator[Processes]:
    started = Processes(clean_database, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def _vectors(rng: np.random.Generator, n: int) -> list[list[float]]:
    centres = np.random.default_rng(3).normal(size=(4, DIM))
    return [
        (centres[rng.integers(4)] + 0.6 * rng.normal(size=DIM)).tolist() for _ in range(n)
    ]


def _ingest(url: str, rng: np.random.Generator, start: int, n: int) -> list[int]:
    response = httpx.post(f"{url}/memories", timeout=30, json={
        "namespace": NAMESPACE,
        "memories": [
            {"text": f"memory {start + i}", "embedding": vector}
            for i, vector in enumerate(_vectors(rng, n))
        ],
    })
    assert response.status_code == 201, response.text
    return [int(m) for m in response.json()["ids"]]


def _retrieve(url: str, rng: np.random.Generator, i: int) -> int:
    response = httpx.post(f"{url}/retrieve", timeout=30, json={
        "namespace": NAMESPACE, "query": f"question {i}",
        "query_embedding": _vectors(rng, 1)[0], "candidates": 30, "budget": 8,
    })
    assert response.status_code == 200, response.text
    return int(response.json()["query_id"])


def _state(database_url: str) -> dict[str, object]:
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


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


def _did_background_work(log_path: Path) -> bool:
    log = log_path.read_text()
    return "indexed memories" in log or "refitted namespace" in log


def test_workers_index_and_refit_for_api_processes_and_a_killed_one_loses_nothing(
    processes: Processes,
) -> None:
    database_url = processes.database_url
    rng = np.random.default_rng(0)
    (api_a, log_a), (api_b, log_b) = processes.api("api-a"), processes.api("api-b")
    memory_ids = _ingest(api_a, rng, 0, 60) + _ingest(api_b, rng, 60, 60)
    query_ids = [_retrieve((api_a, api_b)[i % 2], rng, i) for i in range(10)]
    time.sleep(1.0)  # five index polls: an API process that indexed would have by now
    before = _state(database_url)
    # No worker yet: everything is answered and counted, nothing indexed or refitted.
    assert before["unindexed"] == 120
    assert before["last_refit_at"] is None
    assert before["queries_since_refit"] == 10

    worker, worker_log = processes.start("worker-1", "worker")
    _until(lambda: _state(database_url)["unindexed"] == 0, "the worker indexed the backlog")
    _until(lambda: _state(database_url)["last_refit_at"] is not None, "the worker refitted")
    refitted = _state(database_url)
    assert refitted["queries_since_refit"] < REFIT_EVERY
    assert "refitted namespace" in worker_log.read_text()

    # More work, and the worker killed at once, possibly in the middle of it.
    memory_ids += _ingest(api_b, rng, 120, 200)
    query_ids += [_retrieve((api_a, api_b)[i % 2], rng, i) for i in range(10, 18)]
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    killed = _state(database_url)
    assert killed["memories"] == len(memory_ids) == 320
    assert killed["queries"] == len(query_ids) == 18
    # Memories not indexed yet are found by the exact scan all the same.
    assert _retrieve(api_a, rng, 18) not in query_ids

    processes.start("worker-2", "worker")
    _until(lambda: _state(database_url)["unindexed"] == 0, "a new worker indexed the rest")
    _until(
        lambda: _state(database_url)["last_refit_at"] != refitted["last_refit_at"],
        "a new worker refitted",
    )
    final = _state(database_url)
    assert final["memories"] == 320
    assert final["queries"] == 19
    # The API processes did neither, all along.
    assert not _did_background_work(log_a)
    assert not _did_background_work(log_b)
