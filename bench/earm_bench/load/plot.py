"""The plot of ``earm bench load``: latency against size, for one run or several."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from earm_bench.common.http import POLICIES


def plot(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """Latency against size: retrieve overhead and floor vs memories (left), completion and
    total vs observations (right), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = sorted(reports, key=lambda r: r["config"]["memories"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    sizes = [r["config"]["memories"] for r in reports]
    policies = [p for p in POLICIES if any(c["policy"] == p for c in reports[0]["retrieve"])]
    for policy in policies:
        values = [
            next(c["overhead_ms"]["p50"] for c in r["retrieve"]
                 if c["policy"] == policy and c["concurrency"] == 1)
            for r in reports
        ]
        left.plot(sizes, values, marker="o", label=f"{policy} overhead")
    left.plot(sizes, [next(f["latency_ms"]["p50"] for f in r["floor"] if f["concurrency"] == 1)
                      for r in reports], marker="s", color="black", linestyle="--",
              label="pgvector floor")
    left.set_xscale("log")
    left.set_xlabel("memories")
    left.set_ylabel("p50 ms (concurrency 1)")
    left.set_title("retrieve: server-side overhead")
    left.legend(fontsize=7)
    for r in reports:
        tiers = r["observations"]
        xs = [t["observations"] for t in tiers]
        label = f"{r['config']['memories']:,} mem"
        right.plot(xs, [t["complete_ms"]["p50"] for t in tiers], marker="o",
                   label=f"complete, {label}")
        right.plot(xs, [t["earm"]["overhead_ms"]["p50"] for t in tiers], marker="^",
                   linestyle=":", label=f"overhead, {label}")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("observations")
    right.set_ylabel("p50 ms (earm, concurrency 1)")
    right.set_title("completion vs observations")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
