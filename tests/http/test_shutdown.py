"""``earm serve`` stops on SIGTERM even while a request waits for ever on a dependency: after
``EARM_SHUTDOWN_TIMEOUT_S`` the requests still running are cancelled (their transactions roll
back) and the process exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import Engine, create_engine, text

from service.testing.processes import free_port, wait_ready

#: A bound on what a process that ignores SIGTERM makes the test wait.
WAIT_S = 30


def test_sigterm_stops_a_service_whose_request_waits_on_a_lock_that_is_never_released(
    clean_database: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": clean_database, "EARM_EMBEDDER": "none", "EARM_SCORER": "local",
        "EARM_LOG_LEVEL": "WARNING", "EARM_DB_LOCK_TIMEOUT_S": "0",  # the wait is unbounded
        "EARM_SHUTDOWN_TIMEOUT_S": "1",
    }
    with open(tmp_path / "serve.log", "wb") as log:
        service = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=log,
        )
    holder_engine = create_engine(clean_database)
    try:
        assert wait_ready(url, 60, service), (tmp_path / "serve.log").read_text()[-3000:]
        vectors = np.random.default_rng(0).normal(size=(4, 384)).tolist()
        assert httpx.post(f"{url}/memories", json={"namespace": "stuck", "memories": [
            {"text": f"m{i}", "embedding": v} for i, v in enumerate(vectors)
        ]}).status_code == 201
        with holder_engine.connect() as holder:
            holder.execute(text("SELECT FROM namespaces WHERE name = 'stuck' FOR UPDATE"))
            waiting = threading.Thread(target=lambda: httpx.post(f"{url}/retrieve", json={
                "namespace": "stuck", "query": "q", "query_embedding": vectors[0],
            }, timeout=WAIT_S), daemon=True)
            waiting.start()
            until_a_backend_waits_for_a_lock(holder_engine)
            service.send_signal(signal.SIGTERM)
            started = time.monotonic()
            try:
                service.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                raise AssertionError("earm serve ignored SIGTERM") from None
            stopped_s = time.monotonic() - started
            holder.rollback()
        assert stopped_s < WAIT_S
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        holder_engine.dispose()


def until_a_backend_waits_for_a_lock(engine: Engine) -> None:
    for _ in range(WAIT_S * 20):
        with engine.connect() as conn:
            if conn.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )):
                return
        time.sleep(0.05)
    raise AssertionError("the retrieve never waited for the namespace's lock")
