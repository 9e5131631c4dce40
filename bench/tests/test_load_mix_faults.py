"""A short `earm bench load-mix` with every fault injected at once (a stalling loopback judge,
deleting clients, a SIGKILLed embedded Postgres): the report carries each fault's figures and
they add up. Whether the service survives the faults is the report's to say, not this test's."""

from __future__ import annotations

import json

import pytest

from earm_bench.load_mix import LoadMixConfig, LoadMixReport, run_load_mix
from earm_bench.load_mix.config import Faults
from earm_bench.load_mix.fault_report import FIRST_AFTER_RECOVERY

SECONDS = 4.0
FAULTS = Faults(stalling_scorer=True, deletes=True, kill_postgres=True, scorer_timeout_s=0.5,
                recovery_grace_s=60.0)
EXPLAINED = {"503 database_unavailable", "404 not_found"}


@pytest.fixture(scope="module")
def report() -> LoadMixReport:
    # The in-process service over an embedded Postgres of its own (the one it kills).
    config = LoadMixConfig(clients=6, seconds=SECONDS, namespaces=2, candidates=20,
                           faults=FAULTS)
    return run_load_mix(config)


def test_fault_report_has_the_figures_of_every_fault(report: LoadMixReport) -> None:
    printed = json.loads(json.dumps(report.to_dict()))  # what the command prints
    assert set(printed["faults"]) == {"stalling_scorer", "deletes", "kill_postgres"}
    assert printed["faults"] == report.faults
    assert printed["expected_errors"] == report.expected_errors
    assert set(printed["operations"]) == {"ingest", "retrieve", "feedback", "delete"}
    for operation in printed["operations"].values():
        assert set(operation) >= {"ok", "errors", "expected_errors", "p50_ms"}
    assert printed["ok"] == (report.errors == 0 and all(report.audits.values()))


def test_only_what_a_fault_explains_is_expected_and_a_500_never_is(report: LoadMixReport) -> None:
    for stats in report.operations.values():
        assert set(stats.expected) <= EXPLAINED
        assert not any(outcome.startswith("5") and outcome != "503 database_unavailable"
                       for outcome in stats.expected)
    assert report.expected_errors == sum(
        sum(s.expected.values()) for s in report.operations.values()
    )
    assert report.errors == sum(sum(s.errors.values()) for s in report.operations.values())


def test_stall_figures_add_up(report: LoadMixReport) -> None:
    stall = report.faults["stalling_scorer"]
    start, end = stall["window_s"]
    assert 0 <= start < end <= SECONDS
    assert stall["judge_answers_after_s"] > stall["scorer_timeout_s"] == 0.5
    for bucket in (*stall["retrieves"].values(), stall["first_after_recovery"]):
        assert bucket["n"] == bucket["answered"] + bucket["failed"]
        assert 0 <= bucket["degraded"] <= bucket["answered"]
    first, after = stall["first_after_recovery"], stall["retrieves"]["after"]
    assert first["n"] == min(FIRST_AFTER_RECOVERY, after["n"])
    assert first["scored_normally"] == (first["answered"] > 0 and first["degraded"] == 0)
    assert stall["judge_calls"]["total"] >= stall["judge_calls"]["stalled"] >= 0
    answered = sum(b["answered"] for b in stall["retrieves"].values())
    assert answered <= report.operations["retrieve"].ok


def test_delete_figures_match_the_operations(report: LoadMixReport) -> None:
    deletes = report.faults["deletes"]
    assert deletes["deleting_clients"] == 2  # clients 0 and 5 of 6
    assert deletes["deleted"] == report.operations["delete"].ok
    assert deletes["delete_outcomes"].get("ok", 0) == deletes["deleted"]
    assert deletes["server_errors"] == sum(
        n for key, n in deletes["errors_by_operation"].items() if key.split()[1].startswith("5")
    )


def test_kill_figures_and_the_audits_after_postgres_is_back(report: LoadMixReport) -> None:
    kill = report.faults["kill_postgres"]
    assert 0 < kill["killed_at_s"] <= SECONDS
    assert kill["postmaster_pid"] > 0 and kill["processes_killed"] >= 1
    assert sum(kill["statuses_after_kill"].values()) >= kill["unavailable_503"]
    assert kill["unavailable_503"] == kill["statuses_after_kill"].get("503 database_unavailable", 0)
    assert kill["postgres_back"]["by"] == "service"  # its supervisor restarted Postgres
    # The audits ran against the database Postgres kept: with faults, by id as well.
    assert "database: every acknowledged observation of a live memory is stored" in report.audits
    assert "http: no retrieve returned a memory deleted before it started" in report.audits
    assert len(report.audits) == 10


def test_faults_that_need_the_in_process_service_are_refused_elsewhere() -> None:
    with pytest.raises(ValueError, match="in-process"):
        run_load_mix(LoadMixConfig(faults=Faults(stalling_scorer=True)), url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="embedded Postgres"):
        run_load_mix(LoadMixConfig(faults=Faults(kill_postgres=True)),
                     database_url="postgresql://127.0.0.1:9/none")
