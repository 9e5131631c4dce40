"""What paraphrase transfer's neighbour scan costs per retrieve, by EARM_PARAPHRASE_WINDOW
(docs/operations.md, Settings): the scan of service.db.search over a namespace of 20,000
recorded queries of 384 dimensions, in a temporary embedded Postgres, warm cache; planning +
execution time of ``EXPLAIN ANALYZE``, median of 15 fresh query vectors per window.

    python docs/perf/paraphrase_scan.py
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from earm_bench.common.database import libpq_url, migrated_database
from service.db.search import _NEIGHBOUR_SQL

QUERIES = 20_000
DIM = 384
WINDOWS = (1000, 2000, 5000, 20_000)
# The neighbour scan itself, without the join to the neighbours' scores (there are none here).
SCAN_SQL = (
    "EXPLAIN (ANALYZE, FORMAT JSON) "
    + _NEIGHBOUR_SQL.split("SELECT s.memory_id")[0]
    + " SELECT count(*) FROM nb WHERE nb.similarity >= %(min_similarity)s"
)


def unit_vector(rng: np.random.Generator) -> np.ndarray:
    vector = rng.standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def load_queries(conn: psycopg.Connection, rng: np.random.Generator) -> None:
    conn.execute("INSERT INTO namespaces (name) VALUES ('n')")
    columns = "namespace, query_index, text, embedding, policy, family_key, candidates, budget, " \
              "scorer_calls"
    with conn.cursor().copy(f"COPY queries ({columns}) FROM STDIN") as copy:
        for i in range(QUERIES):
            literal = "[" + ",".join(f"{x:.5f}" for x in unit_vector(rng)) + "]"
            copy.write_row(("n", i, f"q{i}", literal, "earm", i.to_bytes(4, "big"), 200, 35, 35))
    conn.execute("ANALYZE queries")


def scan_ms(conn: psycopg.Connection, rng: np.random.Generator, window: int) -> float:
    times = []
    for attempt in range(16):
        params = {"namespace": "n", "query": unit_vector(rng), "family": b"none",
                  "neighbours": 16, "min_similarity": 0.9, "window": window}
        plan = conn.execute(SCAN_SQL, params, binary=True).fetchone()[0][0]
        if attempt:  # the first one warms the cache
            times.append(plan["Planning Time"] + plan["Execution Time"])
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    with (
        tempfile.TemporaryDirectory() as tmp,
        migrated_database(None, DIM, Path(tmp)) as url,
        psycopg.connect(libpq_url(url), autocommit=True) as conn,
    ):
        register_vector(conn)
        load_queries(conn, rng)
        for window in WINDOWS:
            print(f"window {window:>6,}: {scan_ms(conn, rng, window):.2f} ms")


if __name__ == "__main__":
    main()
