"""A small `earm bench capacity` (``--quick`` sizes): one run yields every target's rows, T1 to
T10, each with a figure, a bound, a ratio and a verdict, in the JSON and the markdown. Nothing
about speed is asserted; what the run itself guarantees is: the late anchors are all recorded,
the refit windows saw their refits land, the rule's refit counts fall with size, a retrieve's
anchors leave in one round and the limited backend got at least the calls it works on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from earm_bench.capacity import CapacityConfig, render_markdown, run_capacity
from earm_bench.capacity.config import QUICK


def test_one_quick_run_reports_every_target_with_its_verdict(
    new_database: Callable[[str], str],
) -> None:
    config = dataclasses.replace(CapacityConfig(**QUICK), tail_requests=4, score_requests=2,
                                 database_url=new_database("earm_bench_capacity"))
    report = run_capacity(config, "earm bench capacity --quick")
    rows = report["rows"]
    targets = [row["target"] for row in rows]
    assert targets == ["T1"] * 4 + ["T2"] * 2 + ["T3"] * 2 + ["T4"] + ["T5"] + ["T6"] * 2 + \
        ["T7"] * 8 + ["T8"] * 3 + ["T9"] + ["T10"]
    for row in rows:
        assert row["verdict"] in ("met", "missed")
        assert row["ratio"] == round(row["measured"] / row["allowed"], 3) or row["allowed"] == 0
    assert rows[5]["row"] == "late anchors recorded" and rows[5]["verdict"] == "met"
    assert all(w["refits_landed"] >= 2 for w in report["refit_window"].values())
    assert rows[20]["row"].endswith("scorer rounds per retrieve, most")
    assert rows[20]["verdict"] == "met"
    assert report["limited_backend"]["most_at_once"] >= report["limited_backend"]["works_on"]
    assert report["backlog"]["backlog_5"]["errors"] == report["backlog"]["deep"]["errors"] == 0
    small, large = report["refit_costs"]
    assert small["refits_per_1000"] > large["refits_per_1000"] > 0
    assert report["load_average"]["start"] and report["load_average"]["end"]
    markdown = render_markdown(report, "earm bench capacity --quick")
    assert markdown.count("\n| T") == len(rows)
