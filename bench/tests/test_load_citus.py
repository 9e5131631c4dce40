"""A small `earm bench load --citus`: the run starts its own Citus cluster (a coordinator and two
workers on loopback), migrates a database there with `earm migrate`, and every phase runs
through the coordinator. Nothing about speed is asserted: docs/perf/citus-load.md has the
measured comparison with one node."""

from __future__ import annotations

import json

import pytest

from earm_bench.load import LoadConfig, render_markdown, run_load
from service.testing.citus import CITUS_VERSION, ensure_built

pytestmark = [pytest.mark.bench, pytest.mark.citus]

CANDIDATES = 50


@pytest.fixture(scope="module")
def report() -> dict:
    why_not = ensure_built()
    if why_not is not None:
        pytest.skip(why_not)
    config = LoadConfig(
        memories=200, observations=(200,), embed_memories=0, copy_memories=50,
        concurrency=(1,), policies=("semantic", "earm"), requests=3, completion_requests=2,
        slow_requests=0, dashboard_requests=1, topics=4, obs_per_query=10, ingest_batch=100,
        candidates=CANDIDATES, citus=True, progress=False,
    )
    return json.loads(json.dumps(run_load(config)))  # what --out writes


def test_the_run_measures_a_citus_coordinator_with_two_workers(report: dict) -> None:
    environment = report["environment"]
    assert environment["citus"].startswith(f"Citus {CITUS_VERSION} ")
    assert environment["citus_workers"] == 2
    assert f"On Citus (Citus {CITUS_VERSION}): the service talks to the coordinator" in (
        render_markdown(report))


def test_every_phase_answers_through_the_coordinator(report: dict) -> None:
    assert {cell["policy"] for cell in report["retrieve"]} == {"semantic", "earm"}
    assert report["slow_judge"] == []  # left out: --slow-requests 0
    for cell in report["retrieve"]:
        assert cell["errors"] == cell["degraded"] == 0 and cell["requests"] > 0
    assert all(floor["rows_min"] == CANDIDATES for floor in report["floor"])
    (tier,) = report["observations"]
    assert tier["observations"] >= 200 and tier["refit_s"] > 0
    assert tier["earm"]["errors"] == 0


def test_database_sizes_are_the_shards_on_the_workers(report: dict) -> None:
    """The coordinator's tables are empty shells: Citus's size functions count the shards."""
    sizes = report["observations"][0]["database"]
    assert sizes["memories"]["rows"] == sizes["hnsw_index"]["rows"] >= 200
    assert all(part["bytes"] > 0 for part in sizes.values())
