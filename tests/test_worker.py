"""`earm worker`: two API processes started with `earm serve --no-background-work`
and one worker on one database. Ingests get indexed and refits happen while the API processes
do neither; a worker killed with SIGKILL loses nothing, and a new worker resumes its work."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.worker_processes import REFIT_EVERY, Processes, ingest, retrieve, state, until

pytestmark = pytest.mark.processes


def _did_background_work(log_path: Path) -> bool:
    log = log_path.read_text()
    return "indexed memories" in log or "refitted namespace" in log


def test_workers_index_and_refit_for_api_processes_and_a_killed_one_loses_nothing(
    processes: Processes,
) -> None:
    database_url = processes.database_url
    rng = np.random.default_rng(0)
    (api_a, log_a), (api_b, log_b) = processes.api("api-a"), processes.api("api-b")
    memory_ids = ingest(api_a, rng, 0, 60) + ingest(api_b, rng, 60, 60)
    query_ids = [retrieve((api_a, api_b)[i % 2], rng, i) for i in range(10)]
    time.sleep(1.0)  # five index polls: an API process that indexed would have by now
    before = state(database_url)
    # No worker yet: everything is answered and counted, nothing indexed or refitted.
    assert before["unindexed"] == 120
    assert before["last_refit_at"] is None
    assert before["queries_since_refit"] == 10

    worker, worker_log = processes.start("worker-1", "worker")
    until(lambda: state(database_url)["unindexed"] == 0, "the worker indexed the backlog")
    until(lambda: state(database_url)["last_refit_at"] is not None, "the worker refitted")
    refitted = state(database_url)
    assert refitted["queries_since_refit"] < REFIT_EVERY
    assert "refitted namespace" in worker_log.read_text()

    # More work, and the worker killed at once, possibly in the middle of it.
    memory_ids += ingest(api_b, rng, 120, 200)
    query_ids += [retrieve((api_a, api_b)[i % 2], rng, i) for i in range(10, 18)]
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    killed = state(database_url)
    assert killed["memories"] == len(memory_ids) == 320
    assert killed["queries"] == len(query_ids) == 18
    # Memories not indexed yet are found by the exact scan all the same.
    assert retrieve(api_a, rng, 18) not in query_ids

    processes.start("worker-2", "worker")
    until(lambda: state(database_url)["unindexed"] == 0, "a new worker indexed the rest")
    until(
        lambda: state(database_url)["last_refit_at"] != refitted["last_refit_at"],
        "a new worker refitted",
    )
    final = state(database_url)
    assert final["memories"] == 320
    assert final["queries"] == 19
    # The API processes did neither, all along.
    assert not _did_background_work(log_a)
    assert not _did_background_work(log_b)
