"""What the clients of ``earm bench load-mix`` were told: per operation, per namespace, and
every request on the run's clock."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from earm_bench.common.stats import percentiles


@dataclass
class OperationStats:
    ok: int = 0
    #: Failures by status (``"500 internal_error"``) or transport error: each fails the run.
    errors: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: Failures an injected fault explains (a 503 while Postgres is down), by status.
    expected: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self, with_expected: bool = False) -> dict[str, Any]:
        latency = percentiles(self.latencies_ms, digits=1)
        out: dict[str, Any] = {"ok": self.ok, "errors": dict(self.errors)}
        if with_expected:
            out["expected_errors"] = dict(self.expected)
        return out | {f"{name}_ms": latency[name] for name in ("p50", "p95", "p99", "mean")}


@dataclass(frozen=True)
class Event:
    """One request on the run's clock (seconds since the load started)."""

    op: str
    namespace: str
    started: float
    ended: float
    #: ``"ok"``, ``"<status> <error code>"`` or the transport error's name.
    outcome: str
    expected: bool = False
    degraded: bool | None = None  # retrieves only

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True)
class Answer:
    """An answered retrieve."""

    query_id: int
    query_index: int
    scorer_calls: int
    degraded: bool
    memory_ids: list[int]
    #: The returned memories this query's scorer calls observed (their scores are stored).
    observed_ids: list[int] = field(default_factory=list)
    started: float = 0.0


@dataclass
class NamespaceLedger:
    """What the clients were told, per namespace."""

    seeded: int = 0
    created: int = 0
    memory_ids: list[int] = field(default_factory=list)
    retrieves: list[Answer] = field(default_factory=list)
    feedback_recorded: int = 0
    #: (query id, memory id) of every acknowledged feedback score.
    feedback_pairs: set[tuple[int, int]] = field(default_factory=set)
    #: Deleted memory id -> when the delete was acknowledged.
    deleted: dict[int, float] = field(default_factory=dict)
    #: Writes that failed with a 5xx or on the wire, per operation: they may have committed.
    in_doubt: Counter[str] = field(default_factory=Counter)

    @property
    def scorer_calls(self) -> int:
        return sum(a.scorer_calls for a in self.retrieves)

    @property
    def degraded(self) -> bool:
        return any(a.degraded for a in self.retrieves)

    def live_memory_ids(self) -> set[int]:
        return set(self.memory_ids) - set(self.deleted)
