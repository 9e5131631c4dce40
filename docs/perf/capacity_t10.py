"""``earm bench capacity`` at its ``--quick`` sizes but with the full run's chat latency, for the
scorer rows alone to read: T10 (the backend working on 4 calls at once) over ``retrieves``
retrieves, with the most calls it had at once in each; and T1's and T9's chat cells (an
unqueued judge: what a queue signal must leave alone). Every row runs (about two minutes); the
other rows' verdicts at these sizes say little. The service runs at the shipped defaults, so
the queue signal (``EARM_SCORER_QUEUE_SIGNAL``) is off; docs/performance.md's figures with it
are of commit 64ea42b, where it was on by default.

    PYTHONPATH=.:bench python docs/perf/capacity_t10.py [retrieves [chat_ms [score_requests]]]
"""

from __future__ import annotations

import dataclasses
import sys

from earm_bench.capacity import CapacityConfig, run_capacity
from earm_bench.capacity.config import QUICK


def main() -> None:
    given = [float(arg) for arg in sys.argv[1:4]]
    retrieves, chat_ms, score_requests = given + [4.0, 100.0, 8.0][len(given):]
    config = dataclasses.replace(CapacityConfig(**QUICK), limited_retrieves=int(retrieves),
                                 chat_ms=chat_ms, score_requests=int(score_requests))
    report = run_capacity(config, "docs/perf/capacity_t10.py")
    cell = report["limited_backend"]
    print(f"T10: most at once by retrieve {cell['most_at_once_each']}, score p50 "
          f"{cell['score_ms']['p50']} ms (floor {cell['anchors'] / cell['works_on']:g} x "
          f"{cell['backend_ms']:g} ms); load average {report['load_average']}")
    for row in report["rows"]:
        if row["target"] in ("T1", "T9") and "chat" in row["row"]:
            print(f"{row['target']}: {row['row']}: {row['measured']}")


if __name__ == "__main__":
    main()
