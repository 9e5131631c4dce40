"""The bench's entry point for its service processes (earm_bench.common.serve): with the bench's
EARM_BENCH_REFIT_IN_REQUEST=true a due refit runs inside the retrieve that makes it due, which
the service itself has no setting for; without it a service process is `earm serve`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from earm_bench.common.processes import entry_point, service_process
from earm_bench.common.serve import REFIT_IN_REQUEST, refit_in_request


def test_the_switch_is_true_or_false_and_off_unless_set() -> None:
    assert refit_in_request({}) is False
    assert refit_in_request({REFIT_IN_REQUEST: "true"}) is True
    assert refit_in_request({REFIT_IN_REQUEST: "False"}) is False
    with pytest.raises(SystemExit, match=REFIT_IN_REQUEST):
        refit_in_request({REFIT_IN_REQUEST: "yes"})


def test_a_service_process_is_earm_serve_unless_the_switch_is_set() -> None:
    assert entry_point({}, 8123) == ("service", ("serve", "--port", "8123"))
    assert entry_point({REFIT_IN_REQUEST: "false"}, 8123)[0] == "service"
    assert entry_point({REFIT_IN_REQUEST: "true"}, 8123) == (
        "earm_bench.common.serve", ("--port", "8123"))


def test_a_service_process_with_the_switch_has_refitted_when_each_retrieve_answers(
    migrated_database: Callable[[str], str], tmp_path: Path
) -> None:
    """refit_every=1 makes every retrieve's refit due: with the switch the namespace has no
    query since its last refit whenever a retrieve has answered."""
    url = migrated_database("earm_bench_serve")
    settings = {"EARM_DATABASE_URL": url, "EARM_EMBEDDER": "local", "EARM_SCORER": "local",
                "EARM_REFIT_EVERY": "1", REFIT_IN_REQUEST: "true"}
    engine = create_engine(url)
    try:
        with (
            service_process(settings, tmp_path) as service,
            httpx.Client(base_url=service.url, timeout=60) as client,
        ):
            assert service.process.args[2] == "earm_bench.common.serve"  # [python, -m, module]
            response = client.post("/memories", json={"namespace": "bench", "memories": [
                {"text": f"memory {i} about topic {i % 3}"} for i in range(12)]})
            assert response.status_code == 201, response.text
            for i in range(3):
                response = client.post("/retrieve", json={
                    "namespace": "bench", "query": f"topic {i}", "candidates": 12, "budget": 6})
                assert response.status_code == 200, response.text
                with engine.connect() as connection:
                    since_refit = connection.execute(text(
                        "SELECT queries_since_refit FROM namespaces WHERE name = 'bench'"
                    )).scalar_one()
                assert since_refit == 0, i
    finally:
        engine.dispose()
