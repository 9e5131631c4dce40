"""A served earm under load: `python -m service serve` as a subprocess, concurrent HTTP
clients (threads) that ingest and retrieve, a ledger of what they were told, and the check that
everything acknowledged is in the database. Shared by the tests of what happens to a serving
earm while its database is disturbed (a crash, a tenant moved between Citus workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text

from service.testing.processes import free_port

DIM = 384
NAMESPACES = ("agent-a", "agent-b")

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
    """`python -m service serve` as a subprocess configured by ``env`` (EARM_* settings: a
    data directory or a database URL); ``as_subreaper``: in the position of PID 1 in a
    container (the image's CMD is `earm serve`)."""

    def __init__(
        self, env: Mapping[str, str], log_path: Path, as_subreaper: bool = False
    ) -> None:
        self.env = dict(env)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.as_subreaper = as_subreaper
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
            "EARM_EMBEDDER": "none",
            "EARM_LOG_LEVEL": "WARNING",
            **self.env,
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


@dataclass(frozen=True)
class Request:
    """One request a client made: when it started and how long its answer took."""

    path: str
    namespace: str
    started: float  # time.monotonic()
    seconds: float
    status: int


@dataclass
class Ledger:
    """What clients were told (acknowledged), every request they made, and the requests that
    got no HTTP answer (the connection failed)."""

    memories: list[tuple[str, str, int]] = field(default_factory=list)  # ns, external id, id
    retrieves: list[tuple[str, int, int, int, bool]] = field(default_factory=list)
    statuses: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    requests: list[Request] = field(default_factory=list)
    transport_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Load:
    """Concurrent clients (threads with httpx): ingesters and retrievers, each going round
    ``namespaces``. Each load's memories have external ids of their own: a namespace's count
    grows by what the clients were told."""

    def __init__(
        self, url: str, ledger: Ledger, ingesters: int = 3, retrievers: int = 4,
        namespaces: Sequence[str] = NAMESPACES,
    ) -> None:
        self.url = url
        self.ledger = ledger
        self.namespaces = tuple(namespaces)
        self.run = uuid.uuid4().hex[:8]
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

    def _post(self, client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response | None:
        started = time.monotonic()
        try:
            response = client.post(path, json=body)
        except httpx.TransportError as error:
            with self.ledger.lock:
                self.ledger.transport_errors.append(f"{path}: {error!r}")
            time.sleep(0.05)  # the service is down: keep trying until told to stop
            return None
        request = Request(path, body["namespace"], started, time.monotonic() - started,
                          response.status_code)
        with self.ledger.lock:
            self.ledger.statuses[response.status_code] += 1
            self.ledger.requests.append(request)
        return response

    def _ingest(self, worker: int) -> None:
        rng = np.random.default_rng(1000 + worker)
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for batch in range(1_000_000):
                if self.stop.is_set():
                    return
                namespace = self.namespaces[batch % len(self.namespaces)]
                external = [f"{self.run}-w{worker}-b{batch}-{i}" for i in range(3)]
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
                namespace = self.namespaces[(n + worker) % len(self.namespaces)]
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


def seed(url: str, namespaces: Sequence[str] = NAMESPACES) -> None:
    rng = np.random.default_rng(0)
    for namespace in namespaces:
        response = httpx.post(
            f"{url}/memories",
            json={
                "namespace": namespace,
                "memories": [{"text": f"seed {i}", "embedding": vector(rng)} for i in range(30)],
            },
            timeout=30,
        )
        assert response.status_code == 201, response.text


def wait_for(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def check_everything_acknowledged_is_there(database_url: str, ledger: Ledger) -> None:
    """Every acknowledged memory is stored under its namespace and external id with the id the
    client was told; every answered retrieve's query is there with all its observations; each
    namespace's query indexes are gap-free."""
    engine = create_engine(database_url)
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
