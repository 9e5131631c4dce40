"""The coordinator's hop, per retrieve: ``earm bench load`` reports on one node and on a Citus
cluster (``--citus``), run in turn on one machine, compared cell by cell (policy,
concurrency): p50 / p95 of the server's ``total_ms`` and of the client's end-to-end time,
throughput, and cluster − single node of each p50, per round and as the median over rounds.

    python docs/perf/citus_load_compare.py SINGLE.json CLUSTER.json [SINGLE2.json CLUSTER2.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

Cell = tuple[str, int]


def cells(report: dict[str, Any]) -> dict[Cell, dict[str, Any]]:
    return {(cell["policy"], cell["concurrency"]): cell for cell in report["retrieve"]}


def row(cell: dict[str, Any]) -> dict[str, float]:
    return {"total_p50": cell["total_ms"]["p50"], "total_p95": cell["total_ms"]["p95"],
            "client_p50": cell["client_ms"]["p50"], "client_p95": cell["client_ms"]["p95"],
            "rps": cell["throughput_rps"]}


def main(paths: list[str]) -> None:
    if not paths or len(paths) % 2:
        raise SystemExit(__doc__)
    rounds = [(json.loads(Path(a).read_text()), json.loads(Path(b).read_text()))
              for a, b in zip(paths[::2], paths[1::2], strict=True)]
    print("| round | policy | conc. | node | total p50 / p95 ms | client p50 / p95 ms | req/s | "
          "load avg (1 min) at start → end |")
    print("|---:|---|---:|---|---|---|---:|---|")
    differences: dict[Cell, list[tuple[float, float, float]]] = {}
    for number, (single, cluster) in enumerate(rounds, 1):
        for key, one in cells(single).items():
            figures = {"1 node": row(one), "Citus": row(cells(cluster)[key])}
            for node, report in (("1 node", single), ("Citus", cluster)):
                f, env = figures[node], report["environment"]
                print(f"| {number} | {key[0]} | {key[1]} | {node} | {f['total_p50']:.1f} / "
                      f"{f['total_p95']:.1f} | {f['client_p50']:.1f} / {f['client_p95']:.1f} | "
                      f"{f['rps']:.1f} | {env['load_average_at_start'][0]} → "
                      f"{env['load_average_at_end'][0]} |")
            citus, node = figures["Citus"], figures["1 node"]
            differences.setdefault(key, []).append((
                citus["total_p50"] - node["total_p50"], citus["client_p50"] - node["client_p50"],
                citus["rps"] - node["rps"]))
    print()
    print("| policy | conc. | Citus − 1 node, total p50 ms | client p50 ms | req/s "
          "(median over rounds; each round) |")
    print("|---|---:|---|---|---|")
    for (policy, concurrency), found in differences.items():
        columns = []
        for i in range(3):
            values = [d[i] for d in found]
            columns.append(f"{statistics.median(values):+.1f} ("
                           + ", ".join(f"{v:+.1f}" for v in values) + ")")
        print(f"| {policy} | {concurrency} | " + " | ".join(columns) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
