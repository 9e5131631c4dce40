"""What the clients of ``earm bench load-mix`` were told: per operation and per namespace."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from service.bench.common.stats import percentiles


@dataclass
class OperationStats:
    ok: int = 0
    errors: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        latency = percentiles(self.latencies_ms, digits=1)
        return {
            "ok": self.ok,
            "errors": dict(self.errors),
            **{f"{name}_ms": latency[name] for name in ("p50", "p95", "p99", "mean")},
        }


@dataclass(frozen=True)
class Answer:
    """An answered retrieve."""

    query_id: int
    query_index: int
    scorer_calls: int
    degraded: bool
    memory_ids: list[int]


@dataclass
class NamespaceLedger:
    """What the clients were told, per namespace."""

    seeded: int = 0
    created: int = 0
    memory_ids: list[int] = field(default_factory=list)
    retrieves: list[Answer] = field(default_factory=list)
    feedback_recorded: int = 0

    @property
    def scorer_calls(self) -> int:
        return sum(a.scorer_calls for a in self.retrieves)

    @property
    def degraded(self) -> bool:
        return any(a.degraded for a in self.retrieves)
