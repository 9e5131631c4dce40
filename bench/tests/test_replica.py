"""A small `earm bench replica` (400 memories over 8 namespaces, one round): a row per
topology, every measured search of the replica topology served by the standby and none of the
primary's. Nothing about speed is asserted."""

from __future__ import annotations

from earm_bench.replica import WARM_UP, ReplicaConfig, render_markdown, run_replica


def test_one_round_measures_both_topologies_and_the_replica_serves_its_searches() -> None:
    config = ReplicaConfig(memories=400, namespaces=8, requests=24, concurrency=4, rounds=1)
    report = run_replica(config)
    rows = {row["topology"]: row for row in report["results"]}
    assert set(rows) == {"primary", "replica"}
    assert rows["primary"]["replica_reads"] == {}
    assert rows["replica"]["replica_reads"] == {"replica": WARM_UP + config.requests}
    for row in rows.values():
        assert row["latency_ms"]["n"] == config.requests and row["throughput_rps"] > 0
    markdown = render_markdown(report, "earm bench replica --memories 400")
    assert "| 0 | replica |" in markdown and "Replica ÷ primary" in markdown
