"""Per-fault figures of ``earm bench load-mix``, from the requests on the run's clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from earm_bench.common.stats import percentile
from earm_bench.load_mix.faults import DELETER_EVERY, STALL_FACTOR, FaultInjector
from earm_bench.load_mix.ledger import Event, NamespaceLedger

#: How many retrieves right after the stall tell whether the scorer recovered.
FIRST_AFTER_RECOVERY = 10


def _retrieves(events: Iterable[Event]) -> dict[str, Any]:
    events = list(events)
    answered = [e for e in events if e.ok]
    p50 = percentile([(e.ended - e.started) * 1000 for e in answered], 50)
    return {
        "n": len(events),
        "answered": len(answered),
        "degraded": sum(bool(e.degraded) for e in answered),
        "failed": len(events) - len(answered),
        "p50_ms": None if p50 is None else round(p50, 1),
    }


def stalling_scorer(events: list[Event], injector: FaultInjector) -> dict[str, Any]:
    """Degraded retrieves before, during and after the judge's stall (by when each retrieve
    started; "after" ends at the kill when Postgres is killed too), and whether the first ones
    after it were scored normally again."""
    start, end = injector.timeline.stall_window or (float("inf"), float("inf"))
    until = injector.timeline.killed_at or float("inf")
    retrieves = sorted((e for e in events if e.op == "retrieve" and e.started >= 0),
                       key=lambda e: e.started)
    after = [e for e in retrieves if end <= e.started < until]
    first = _retrieves(after[:FIRST_AFTER_RECOVERY])
    judge = injector.judge
    return {
        "scorer_timeout_s": injector.faults.scorer_timeout_s,
        "judge_answers_after_s": injector.faults.scorer_timeout_s * STALL_FACTOR,
        "window_s": list(injector.timeline.stall_window or ()),
        "retrieves": {
            "before": _retrieves(e for e in retrieves if e.started < start),
            "during": _retrieves(e for e in retrieves if start <= e.started < end),
            "after": _retrieves(after),
        },
        # Scored normally: answered and none degraded (a failure, e.g. a 503 of a kill that
        # follows, is counted apart).
        "first_after_recovery": first | {
            "scored_normally": first["answered"] > 0 and first["degraded"] == 0,
        },
        "judge_calls": {"total": judge.calls, "stalled": judge.stalled_calls} if judge else None,
    }


def deletes(events: list[Event], ledgers: Mapping[str, NamespaceLedger],
            clients: int) -> dict[str, Any]:
    """Deletes acknowledged and refused, the errors of every operation meanwhile, and
    retrieves that returned a memory deleted before they started."""
    stale = sum(
        any(ledger.deleted.get(m, a.started) < a.started for m in a.memory_ids)
        for ledger in ledgers.values() for a in ledger.retrieves
    )
    failed = Counter(f"{e.op} {e.outcome}" for e in events if not e.ok)
    return {
        "deleting_clients": len(range(0, clients, DELETER_EVERY)),
        "deleted": sum(len(ledger.deleted) for ledger in ledgers.values()),
        "delete_outcomes": dict(Counter(e.outcome for e in events if e.op == "delete")),
        "errors_by_operation": dict(sorted(failed.items())),
        "server_errors": sum(n for key, n in failed.items() if key.split()[1].startswith("5")),
        "retrieves_returning_deleted_memories": stale,
    }


def kill_postgres(events: list[Event], injector: FaultInjector) -> dict[str, Any]:
    """The outage a killed Postgres caused: statuses of the requests that ended after the
    kill, the 503s, and how long until a request that started after the kill succeeded."""
    timeline = injector.timeline
    killed_at = timeline.killed_at
    if killed_at is None:
        return {"killed": False}
    after = [e for e in events if e.ended >= killed_at]
    unavailable = [e.ended - killed_at for e in after if e.outcome.startswith("503")]
    recovered = [e.ended - killed_at for e in after if e.ok and e.started >= killed_at]
    return {
        "killed_at_s": round(killed_at, 2),
        "postmaster_pid": timeline.postmaster_pid,
        "processes_killed": timeline.processes_killed,
        "statuses_after_kill": dict(Counter(e.outcome for e in after).most_common()),
        "unavailable_503": len(unavailable),
        "first_503_after_s": round(min(unavailable), 2) if unavailable else None,
        "last_503_after_s": round(max(unavailable), 2) if unavailable else None,
        "recovered_after_s": round(min(recovered), 2) if recovered else None,
        "postgres_back": timeline.postgres_back,
    }


def figures(injector: FaultInjector, events: list[Event],
            ledgers: Mapping[str, NamespaceLedger], clients: int) -> dict[str, Any]:
    """The figures of each injected fault."""
    faults = injector.faults
    out: dict[str, Any] = {}
    if faults.stalling_scorer:
        out["stalling_scorer"] = stalling_scorer(events, injector)
    if faults.deletes:
        out["deletes"] = deletes(events, ledgers, clients)
    if faults.kill_postgres:
        out["kill_postgres"] = kill_postgres(events, injector)
    return out
