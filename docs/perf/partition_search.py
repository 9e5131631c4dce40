"""The search alone, on the partitioned schema and on one partition per table: what a
``semantic`` retrieve's search statement costs (``service.db.search.search``, in-process, one
pipelined round trip plus the exact scan's when the index falls short) at ``--memories``
memories over ``--namespaces`` namespaces, loaded as ``earm bench replica`` loads them, for
``EARM_EXACT_SCAN_BELOW`` 20,000 (the shipped value: namespaces of this size are scanned
exactly) and 0 (the HNSW index first). Each query runs on both layouts in turn; recall is the
share of the exact top-N returned.

    python docs/perf/partition_search.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from earm_bench.replica import LAYOUTS, ReplicaConfig, _load, _namespace, _vectors
from service.db import migrate
from service.db.engine import EmbeddedPostgres
from service.db.engine import create_engine as create_async_engine
from service.db.search import CandidateSearch, search


async def timed(urls: dict[str, str], probes: list[tuple[str, np.ndarray]], exact_below: int,
                limit: int) -> dict[str, tuple[list[float], list[list[int]]]]:
    """Each probe searched on every layout in turn (the order alternating from one probe to
    the next), so the machine's load weighs on both alike: times (ms) and ids found."""
    engines = {layout: create_async_engine(url, 2) for layout, url in urls.items()}
    results: dict[str, tuple[list[float], list[list[int]]]] = {name: ([], []) for name in urls}
    try:
        for i, (namespace, vector) in enumerate(probes):
            for layout in (list(urls) if i % 2 else list(reversed(urls))):
                sessions = async_sessionmaker(engines[layout], expire_on_commit=False)
                async with sessions() as session:
                    began = time.perf_counter()
                    _, candidates, _ = await search(session, CandidateSearch(
                        namespace, vector, limit, rank=8, exact_below=exact_below))
                    results[layout][0].append((time.perf_counter() - began) * 1000)
                    results[layout][1].append([int(m) for m in candidates.ids])
    finally:
        for engine in engines.values():
            await engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=50)
    args = parser.parse_args()
    config = ReplicaConfig(memories=args.memories, namespaces=args.namespaces)
    vectors = _vectors(config)
    rng = np.random.default_rng(1)
    picks = rng.integers(config.memories, size=args.queries)
    probes = [(_namespace(int(m) % config.namespaces),
               (vectors[m] + rng.normal(scale=0.5 / np.sqrt(config.dim), size=config.dim))
               .astype(np.float32)) for m in picks]
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pgdata")
        server_url = server.start()
        try:
            urls = {}
            for layout, (database, partitions) in LAYOUTS.items():
                engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
                with engine.connect() as conn:
                    conn.execute(text(f'CREATE DATABASE "{database}"'))
                engine.dispose()
                urls[layout] = server_url.replace("/postgres?", f"/{database}?")
                migrate.upgrade_to_head(urls[layout], config.dim, partitions)
                print(f"{layout}: loaded in {_load(urls[layout], config, vectors):.1f} s")
            report(urls, probes, args.candidates)
        finally:
            server.stop()


def report(urls: dict[str, str], probes: list[tuple[str, np.ndarray]], limit: int) -> None:
    exact = asyncio.run(timed(urls, probes, 10**9, limit))
    for exact_below in (20_000, 0):
        asyncio.run(timed(urls, probes[:40], exact_below, limit))  # warm both
        for layout, (times, found) in asyncio.run(timed(urls, probes, exact_below, limit)).items():
            truth = exact[layout][1]
            recall = statistics.mean(
                len(set(f) & set(e)) / len(e) for f, e in zip(found, truth, strict=True)
            )
            print(f"exact_below {exact_below:>6}  {layout:<11}  search p50 "
                  f"{statistics.median(times):6.2f} ms  p95 "
                  f"{np.percentile(times, 95):6.2f} ms  recall {recall:.4f}")


if __name__ == "__main__":
    main()
