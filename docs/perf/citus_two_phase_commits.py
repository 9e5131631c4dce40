"""How many two-phase commits a retrieve costs on Citus: a loopback cluster (a coordinator and
two workers, ``service.testing.citus``), a database distributed by ``earm migrate``, the app
with the local embedder and scorer, 30 memories, then ``--retrieves`` retrieves; the rows
they add to ``pg_dist_transaction`` (one per worker a two-phase commit prepared on; the
recovery daemon deletes them, by default a minute later at the earliest).

    python docs/perf/citus_two_phase_commits.py
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient

from service.db import migrate
from service.http.app import create_app
from service.settings import Settings
from service.testing.citus import start_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--retrieves", type=int, default=3)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="earm-citus-2pc-"))
    cluster = start_cluster(directory)
    try:
        url = cluster.database("two_phase")
        migrate.upgrade_to_head(url, 384)

        def prepared() -> int:
            with psycopg.connect(cluster.coordinator.libpq("two_phase")) as conn:
                row = conn.execute("SELECT count(*) FROM pg_dist_transaction").fetchone()
            return int(row[0]) if row else 0

        settings = Settings(database_url=url, embedder="local", scorer="local",
                            background_work=False, _env_file=None)
        with TestClient(create_app(settings)) as client:
            memories = [{"text": f"note {i} about hiking"} for i in range(30)]
            assert client.post("/memories", json={"namespace": "ns", "memories": memories}
                               ).status_code == 201
            before = prepared()
            for number in range(args.retrieves):
                answer = client.post("/retrieve", json={
                    "namespace": "ns", "query": f"where did I hike? {number}", "k": 5,
                    "candidates": 20, "policy": ("semantic", "earm")[number % 2],
                })
                assert answer.status_code == 200, answer.text
            print(f"{args.retrieves} retrieves added {prepared() - before} rows to "
                  f"pg_dist_transaction ({len(cluster.workers)} workers)")
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
