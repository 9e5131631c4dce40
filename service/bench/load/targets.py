"""The targets of ``earm bench load`` (issue's), each with the measured value and whether it
holds. They live in the report, never in timed tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Target = dict[str, Any]


def _overhead(report: dict[str, Any], floors: dict[int, float]) -> Iterator[Target]:
    for cell in report.get("retrieve", []):
        if cell["concurrency"] == 1 and cell["policy"] == "earm" and floors.get(1):
            ratio = cell["overhead_ms"]["p50"] / floors[1]
            yield {
                "target": "earm server-side overhead (total − score) p50 ≤ 1.5 × floor p50, "
                          "concurrency 1",
                "measured": f"{cell['overhead_ms']['p50']:.2f} ms = {ratio:.2f} × floor "
                            f"{floors[1]:.2f} ms",
                "met": ratio <= 1.5,
                "margin": f"{ratio / 1.5:.2f} × the allowed 1.5",
            }


def _completion(report: dict[str, Any]) -> Iterator[Target]:
    tiers = report.get("observations", [])
    if tiers:
        last = tiers[-1]
        p50 = last["complete_ms"]["p50"]
        yield {
            "target": f"completion p50 ≤ 2 ms at the largest tier ({last['observations']} "
                      "observations)",
            "measured": f"{p50:.2f} ms",
            "met": p50 is not None and p50 <= 2.0,
            "margin": f"{p50 / 2.0:.2f} × the allowed 2 ms" if p50 is not None else "-",
        }


def _ingest(report: dict[str, Any]) -> Iterator[Target]:
    ingest = report.get("ingest", [])
    if ingest:
        rate = ingest[0]["memories_per_s"]
        indexed = next((row for row in ingest if "HNSW index" in row["path"]), None)
        yield {
            "target": "ingest ≥ 5,000 memories/s with client vectors",
            "measured": f"{rate:.0f} memories/s acknowledged (committed, searchable)"
            + (f"; all in the HNSW index after {indexed['seconds']:.0f} s "
               f"({indexed['memories_per_s']:.0f}/s)" if indexed else ""),
            "met": rate >= 5000,
            "margin": f"{rate / 5000:.2f} × the required 5,000",
        }


def _slow_judge(report: dict[str, Any], floors: dict[int, float]) -> Iterator[Target]:
    for cell in report.get("slow_judge", []):
        if cell["concurrency"] == 1 and cell["budget"] != "schedule" and floors.get(1):
            latency = cell["judge_latency_ms"]
            allowed = 1.3 * latency + floors[1]
            p50 = cell["total_ms"]["p50"]
            yield {
                "target": f"{latency:g} ms judge, budget {cell['budget']} ≤ scorer concurrency: "
                          f"total p50 ≤ 1.3 × {latency:g} ms + floor",
                "measured": f"{p50:.2f} ms (allowed {allowed:.2f} ms)",
                "met": p50 <= allowed,
                "margin": f"{p50 / allowed:.2f} × the allowed",
            }


def targets(report: dict[str, Any]) -> list[Target]:
    """The issue's targets, each with the measured value and whether it holds."""
    floors = {f["concurrency"]: f["latency_ms"]["p50"] for f in report.get("floor", [])}
    return [*_overhead(report, floors), *_completion(report), *_ingest(report),
            *_slow_judge(report, floors)]
