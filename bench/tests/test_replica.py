"""A small `earm bench replica` (400 memories over 8 namespaces, one round, the HNSW index
first): a row per layout and topology, every measured search of the replica topology served by
the standby and none of the primary's, and the ratios of both comparisons. Nothing about speed
is asserted."""

from __future__ import annotations

from earm_bench.replica import WARM_UP, ReplicaConfig, ratios, render_markdown, run_replica


def test_one_round_measures_both_layouts_and_topologies_and_the_replica_serves_its_searches(
) -> None:
    config = ReplicaConfig(memories=400, namespaces=8, requests=24, concurrency=4, rounds=1,
                           exact_below=(0,))
    report = run_replica(config)
    rows = {(row["layout"], row["topology"]): row for row in report["results"]}
    assert set(rows) == {(layout, topology) for layout in ("partitioned", "shared")
                         for topology in ("primary", "replica")}
    for (_, topology), row in rows.items():
        expected = {} if topology == "primary" else {"replica": WARM_UP + config.requests}
        assert row["replica_reads"] == expected
        assert row["latency_ms"]["n"] == config.requests and row["throughput_rps"] > 0
    compared = {(r["compared"], r["of"]) for r in ratios(report["results"])
                if r["p50"] is not None and r["throughput"] is not None}
    assert compared == {("replica ÷ primary", "partitioned"), ("replica ÷ primary", "shared"),
                        ("partitioned ÷ shared", "primary"), ("partitioned ÷ shared", "replica")}
    markdown = render_markdown(report, "earm bench replica --memories 400")
    assert "| 0 | partitioned | 0 | replica |" in markdown and "partitioned ÷ shared" in markdown
