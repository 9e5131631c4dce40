"""A small `earm bench tenancy` (two tables of ~2,000 memories): a cell per table, filter,
``exact_below`` and namespace, and a verdict row per table and filter. Nothing about speed is
asserted; the shipped threshold scans the small namespaces exactly, so their recall is 1."""

from __future__ import annotations

from collections.abc import Callable

from earm_bench.tenancy import TenancyConfig, render_markdown, run_tenancy


def test_report_has_its_cells_and_verdicts(new_database: Callable[[str], str]) -> None:
    scratch_url = new_database("earm_bench_tenancy")  # empty: the bench migrates it
    config = TenancyConfig(memories=2_000, tenants=10, tenant_size=20, queries=3, candidates=30,
                           exact_below=(0,), topics=8, database_url=scratch_url)
    report = run_tenancy(config, shipped=(1_000, 1_000))
    cells = {(c["layout"], c["filtered"], c["exact_below"], c["role"]) for c in report["cells"]}
    roles = {"share": ("large", "mid", "small"), "tenants": ("large", "small")}
    assert cells == {(layout, filtered, exact_below, role) for layout in ("share", "tenants")
                     for filtered in (False, True) for exact_below in (0, 1_000)
                     for role in roles[layout]}
    for cell in report["cells"]:
        assert 0.0 <= cell["recall_min"] <= cell["recall_mean"] <= 1.0
        assert cell["search_ms"]["n"] == 3 and cell["search_ms"]["p50"] > 0
    verdicts = report["verdicts"]
    assert [(v["layout"], v["filtered"]) for v in verdicts] == [
        ("share", False), ("share", True), ("tenants", False), ("tenants", True)]
    assert all(v["recall_mean"] == 1.0 and v["recall_met"] for v in verdicts)
    assert [v["small_memories"] for v in verdicts] == [20, 20, 20, 20]
    markdown = render_markdown(report, "earm bench tenancy --memories 2000")
    assert markdown.count("| share (20 beside 1,000) |") == 2
