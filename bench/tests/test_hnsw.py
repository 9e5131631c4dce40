"""A small `earm bench hnsw` (600 memories): a row per parameter set with sane values, and the
database left with the schema's index. Nothing about speed or recall targets is asserted."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import create_engine, text

from earm_bench.hnsw import HnswConfig, render_markdown, run_hnsw


def test_report_has_a_sane_row_per_parameter_set_and_restores_the_index(
    new_database: Callable[[str], str],
) -> None:
    scratch_url = new_database("earm_bench_hnsw")  # empty: the bench migrates it
    config = HnswConfig(memories=600, queries=5, candidates=50, ef_construction=(32, 64),
                        reindex=100, topics=8, database_url=scratch_url)
    report = run_hnsw(config)
    assert [(r["m"], r["ef_construction"]) for r in report["results"]] == [(16, 32), (16, 64)]
    for row in report["results"]:
        assert 0.0 < row["recall_min"] <= row["recall_mean"] <= 1.0
        assert row["build_s"] >= 0 and row["indexer_memories_per_s"] > 0
    assert "| 16 | 64 |" in render_markdown(report, "earm bench hnsw --memories 600")
    engine = create_engine(scratch_url)
    with engine.connect() as conn:
        index = conn.execute(
            text("SELECT pg_get_indexdef('ix_memories_embedding_hnsw'::regclass)")
        ).scalar_one()
        unindexed = conn.execute(
            text("SELECT count(*) FROM memories WHERE NOT indexed")
        ).scalar_one()
    engine.dispose()
    assert "ef_construction='128'" in index and index.endswith("WHERE indexed")
    assert unindexed == 0
