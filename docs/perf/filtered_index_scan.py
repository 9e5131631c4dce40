"""Whether pgvector's iterative-scan knobs complete a filtered top 200 through the shared HNSW
index (docs/performance.md, Many namespaces in one table): the `share` table of `earm bench
tenancy` (100k memories, a namespace of 50% of them), its large namespace searched with the
filter `{"tag": 0}` (10% of its memories, 5% of the table), the index query of the service
with each setting, against an exact scan of the namespace.

    python docs/perf/filtered_index_scan.py [memories]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from earm_bench.common.database import libpq_url, migrated_database
from earm_bench.load import LoadConfig, World
from earm_bench.tenancy import FILTER, TenancyConfig, _exact_ids, _load, layouts

QUERIES = 30
# name: ef_search, iterative_scan, max_scan_tuples, scan_mem_multiplier, rows fetched
VARIANTS = {
    "service (ef 200, relaxed, 20k tuples)": ("200", "relaxed_order", 20_000, 1, 200),
    "ef_search 1000": ("1000", "relaxed_order", 20_000, 1, 200),
    "strict_order": ("200", "strict_order", 20_000, 1, 200),
    "max_scan_tuples 100k, scan_mem_multiplier 16": ("200", "relaxed_order", 100_000, 16, 200),
    "fetch 800, keep the nearest 200": ("200", "relaxed_order", 20_000, 1, 800),
}
SQL = (
    "SELECT id FROM (SELECT id, embedding <=> %(q)s AS d FROM memories "
    "WHERE namespace = 'large' AND metadata @> %(f)s AND indexed "
    "ORDER BY embedding <=> %(q)s LIMIT {fetch}) s ORDER BY d LIMIT 200"
)


def main() -> None:
    config = TenancyConfig(memories=int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
    share = layouts(config)[0]
    world = World(LoadConfig(memories=share.total, candidates=1, obs_per_query=1))
    queries = [world.query(2**30 + i)[1] for i in range(QUERIES)]
    with tempfile.TemporaryDirectory() as tmp, migrated_database(None, 384, Path(tmp)) as url, \
            psycopg.connect(libpq_url(url), autocommit=True) as conn:
        register_vector(conn)
        _load(conn, world, share, config)
        truths = [_exact_ids(conn, "large", q, 200, True) for q in queries]
        for name, (ef, mode, tuples, multiplier, fetch) in VARIANTS.items():
            ms, recall = [], []
            for query, truth in zip(queries, truths, strict=True):
                with conn.transaction():
                    conn.execute(f"SET LOCAL hnsw.ef_search = {ef}")
                    conn.execute(f"SET LOCAL hnsw.iterative_scan = {mode}")
                    conn.execute(f"SET LOCAL hnsw.max_scan_tuples = {tuples}")
                    conn.execute(f"SET LOCAL hnsw.scan_mem_multiplier = {multiplier}")
                    began = time.perf_counter()
                    rows = conn.execute(SQL.format(fetch=fetch),
                                        {"q": query, "f": Jsonb(FILTER)}).fetchall()
                    ms.append((time.perf_counter() - began) * 1000)
                recall.append(len({r[0] for r in rows} & truth) / len(truth))
            print(f"{name:46s} p50 {statistics.median(ms):7.1f} ms   recall@200 mean "
                  f"{np.mean(recall):.4f} min {np.min(recall):.4f}", flush=True)


if __name__ == "__main__":
    main()
