"""A small `earm bench load` (500 memories, 5k observations, the scale-out cell): every section
of the report is there and its values are sane. Nothing about speed is asserted: targets live in
the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from earm_bench.load import LoadConfig, plot, render_markdown, run_load


@pytest.fixture(scope="module")
def report(postgres_server: str) -> dict:
    # A database of its own (the run leaves its namespaces behind); the bench migrates it.
    engine = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text('DROP DATABASE IF EXISTS "earm_bench_load" WITH (FORCE)'))
        conn.execute(text('CREATE DATABASE "earm_bench_load"'))
    engine.dispose()
    url = postgres_server.replace("/postgres?", "/earm_bench_load?")
    config = LoadConfig(
        memories=500,
        # The second tier adds more rows than the first holds: its growth on disk then cannot
        # vanish into the free space that refits' rewrites of the first tier's scores leave.
        observations=(1_000, 5_000),
        embed_memories=20,
        copy_memories=100,
        concurrency=(1, 4),
        requests=4,
        completion_requests=3,
        slow_requests=2,
        slow_latency_ms=20,
        topics=8,
        obs_per_query=20,
        ingest_batch=200,
        scale_out=True,
        scale_out_concurrency=4,
        scale_out_requests=8,
        database_url=url,
        progress=False,
    )
    return json.loads(json.dumps(run_load(config)))  # what --out writes


def test_report_has_every_section(report: dict) -> None:
    for section in ("ingest", "retrieve", "floor", "slow_judge", "observations", "targets",
                    "environment", "rss_start", "rss_end", "service_settings"):
        assert report[section], section
    assert [row["path"].split(",")[0] for row in report["ingest"]] == [
        "POST /memories", "POST /memories", "floor: raw binary COPY", "POST /memories"
    ]
    assert report["ingest"][1]["path"].endswith("until all are in the HNSW index")
    cells = {(c["policy"], c["concurrency"]) for c in report["retrieve"]}
    assert cells == {(p, c) for p in ("semantic", "observed", "earm", "full") for c in (1, 4)}
    assert [f["concurrency"] for f in report["floor"]] == [1, 4]
    assert [f["concurrency"] for f in report["floor_replayed"]] == [1, 4]
    assert len(report["observations"]) == 2
    names = [t["target"] for t in report["targets"]]
    assert len(names) == 8
    # The acceptance bounds are verdicts of the report, beside the original 1.5 × target.
    assert any(n.startswith("earm server-side overhead") and "≤ 2 × floor" in n for n in names)
    first, last = (tier["observations"] for tier in report["observations"])
    growth = (f"record p50 at {last:,} observations ≤ 1.5 × its value at {first:,} "
              "(learning at constant cost)")
    assert growth in names
    for tier in report["observations"]:
        pages = {row["page"]: row for row in tier["dashboard"]}
        assert set(pages) == {"namespaces", "namespace", "experience matrix", "query trace"}
        assert all(row["bytes"] > 0 and row["client_ms"]["n"] == 10 for row in pages.values())
    markdown = render_markdown(report)
    for heading in ("## Ingest", "## Retrieve", "## Floor", "## Slow judge",
                    "## Completion, refit and memory", "## Database size", "## Scale-out",
                    "## Dashboard pages",
                    "## Targets"):
        assert heading in markdown


def test_report_values_are_sane(report: dict) -> None:
    assert report["ingest"][0]["memories"] == 500
    assert all(row["memories_per_s"] > 0 for row in report["ingest"])
    for cell in report["retrieve"]:
        assert cell["errors"] == 0 and cell["degraded"] == 0
        assert cell["requests"] == 4
        total, overhead = cell["total_ms"], cell["overhead_ms"]
        assert 0 < overhead["p50"] <= total["p50"] <= total["p99"]
        assert cell["throughput_rps"] > 0
        expected_calls = {"semantic": 0, "full": 200}.get(cell["policy"])
        if expected_calls is not None:
            assert cell["scorer_calls_mean"] == expected_calls
    for floor in [*report["floor"], *report["floor_replayed"]]:
        assert floor["rows_min"] == 200 and floor["latency_ms"]["p50"] > 0
    for cell in report["slow_judge"]:
        # Every scored call waited at least the judge's latency.
        assert cell["score_ms"]["p50"] >= cell["judge_latency_ms"]
        assert cell["errors"] == 0 and cell["degraded"] == 0
    rerank = [cell for cell in report["slow_judge"] if cell["scorer"] == "rerank"]
    assert len(rerank) == 1
    # One request per round of the anchor rule: one, every anchor at once.
    assert (rerank[0]["scorer_calls_mean"], rerank[0]["scorer_requests_mean"]) == (35, 1)
    assert rerank[0]["warm_up"] > 0  # its fresh service warmed up, as the matrix's is
    chat = [cell for cell in report["slow_judge"] if cell["scorer"] == "openai"]
    assert all(cell["scorer_requests_mean"] == cell["scorer_calls_mean"] for cell in chat)
    first, second = report["observations"]
    assert 1_000 <= first["observations"] < second["observations"]
    assert second["observations"] >= 2_000
    for tier in report["observations"]:
        assert tier["refit_s"] > 0 and tier["memories_with_history"] > 0
        assert 0 < tier["complete_ms"]["p50"] < tier["earm"]["total_ms"]["p50"]
        assert 0 < tier["record_ms"]["p50"] < tier["earm"]["total_ms"]["p50"]
        refit = tier["service_refit"]
        assert 0 < refit["rss_mb"] <= refit["peak_rss_mb"]
        sizes = tier["database"]
        assert sizes["scores"]["rows"] >= tier["observations"]
        assert sizes["hnsw_index"]["rows"] == sizes["memories"]["rows"] >= 500
        assert all(part["bytes"] > 0 for part in sizes.values())
    assert report["observations"][1]["database"]["scores"]["bytes"] > (
        report["observations"][0]["database"]["scores"]["bytes"])
    assert report["rss_end"]["rss_mb"] > 0


def test_scale_out_cell_spreads_retrieves_over_api_processes_and_refits_in_the_worker(
    report: dict,
) -> None:
    one, scaled = report["scale_out"]
    for row in (one, scaled):
        assert (row["requests"], row["errors"], row["concurrency"]) == (8, 0, 4)
        assert row["throughput_rps"] > 0 and row["total_ms"]["p50"] > 0
        assert all(p["peak_rss_mb"] > 0 for p in [*row["api"], *row["worker"]])
    # One API process answers everything and refits itself.
    assert (one["api_processes"], one["workers"], one["worker"]) == (1, 0, [])
    assert one["api"][0]["retrieves"] == 8 and one["api"][0]["refits"] >= 1
    # Two API processes share the retrieves round robin and do no background work; the
    # worker refits the namespace the retrieves made due.
    assert (scaled["api_processes"], scaled["workers"]) == (2, 1)
    assert [p["retrieves"] for p in scaled["api"]] == [4, 4]
    assert all(p["refits"] == p["index_batches"] == 0 for p in scaled["api"])
    assert scaled["worker"][0]["refits"] >= 1
    markdown = render_markdown(report)
    assert "2 API processes without background work + 1 worker(s)" in markdown
    assert "record p50 ms" in markdown


def test_report_plots_latency_against_size(report: dict, tmp_path: Path) -> None:
    path = tmp_path / "load.png"
    plot([report], path)
    assert path.read_bytes().startswith(b"\x89PNG")
