"""A small `earm bench ingest-stall` (8 texts): the report has the ingest's time and a row per
kind of retrieve and phase, each with retrieves in it. Nothing about speed is asserted."""

from __future__ import annotations

from collections.abc import Callable

from earm_bench.ingest_stall import (
    KINDS,
    StallConfig,
    bulk_texts,
    render_markdown,
    run_ingest_stall,
)


def test_bulk_texts_are_distinct_and_of_the_asked_length() -> None:
    texts = bulk_texts(5, 300, seed=1)
    assert len(set(texts)) == 5 and {len(text) for text in texts} == {300}
    assert texts == bulk_texts(5, 300, seed=1)


def test_report_has_the_ingest_time_and_every_retrieve_row(
    new_database: Callable[[str], str],
) -> None:
    config = StallConfig(texts=8, chars=2_000, clients=2,
                         database_url=new_database("earm_bench_ingest_stall"))
    report = run_ingest_stall(config)
    assert report["ingest_s"] > 0
    rows = {(row["kind"], row["while"]): row for row in report["retrieves"]}
    assert set(rows) == {(kind, phase) for kind in KINDS
                         for phase in ("alone", "during the ingest")}
    for row in rows.values():
        assert row["n"] >= 1 and 0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
    markdown = render_markdown(report, "earm bench ingest-stall --texts 8")
    assert "| query text | during the ingest |" in markdown
