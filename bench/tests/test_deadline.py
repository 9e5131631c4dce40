"""A small `earm bench deadline` (a backend slower than the deadline): every answer counts its
late anchors, each of them ends recorded, and the report has both target rows. Nothing about
speed is asserted."""

from __future__ import annotations

from collections.abc import Callable

from earm_bench.deadline import DeadlineConfig, render_markdown, run_deadline


def test_late_anchors_are_counted_and_recorded_and_the_targets_reported(
    new_database: Callable[[str], str],
) -> None:
    config = DeadlineConfig(deadline_ms=100, backend_ms=400, memories=20, candidates=10,
                            retrieves=4, clients=2,
                            database_url=new_database("earm_bench_deadline"))
    report = run_deadline(config)
    assert report["client_ms"]["n"] == 4
    assert report["late"] > 0
    assert report["late_outcomes"] == {"recorded": report["late"], "superseded": 0,
                                       "failed": 0, "dropped": 0}
    assert report["observations"] == report["anchors_sent"]
    assert [t["target"].split(" (")[0] for t in report["targets"]] == [
        "client p99 ≤ 1.5 × the deadline", "every late anchor recorded"]
    assert report["targets"][1]["met"]
    markdown = render_markdown(report, "earm bench deadline --retrieves 4")
    assert "| every late anchor recorded |" in markdown
