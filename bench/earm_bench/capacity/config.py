"""The configuration of ``earm bench capacity``: the sizes of one run, full or ``--quick``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CapacityConfig:
    """Everything a run depends on. The backend latencies and the targets' own settings (the
    deadline, the concurrencies, the observation sizes) are the issue's; the rest sizes the
    run so that a full one stays under half an hour on two cores."""

    memories: int = 100_000  # T7's shared table
    serving_memories: int = 2_000  # each namespace the service serves
    topics: int = 16
    small_observations: int = 10_000
    large_observations: int = 1_000_000
    obs_per_query: int = 50
    chat_ms: float = 100.0
    rerank_ms: float = 50.0
    score_requests: int = 30  # per T1 cell
    throughput_requests: int = 160  # per T3 cell
    tail_requests: int = 200  # T5
    refit_repeats: int = 3  # T4: the median of this many refits per size
    window_refits: int = 2  # T6: refits that must land in each window
    window_chunk: int = 32  # T6: retrieves between two looks at the latest refit
    window_timeout_s: float = 600.0
    deadline_ms: float = 150.0
    deadline_backend_ms: float = 500.0
    deadline_retrieves: int = 100
    tenants: int = 1_000
    tenant_size: int = 100
    tenancy_queries: int = 40
    backlog_retrieves: int = 3  # T9: cold-pool retrieves per backend
    limited_retrieves: int = 3  # T10
    seed: int = 0
    quick: bool = False
    database_url: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "database_url": "external" if self.database_url else None}


#: ``--quick``: the same rows at sizes a smoke test runs in well under a minute.
QUICK: dict[str, Any] = {
    "memories": 2_000, "serving_memories": 300, "topics": 4, "small_observations": 500,
    "large_observations": 5_000, "score_requests": 3, "throughput_requests": 16,
    "tail_requests": 10, "refit_repeats": 1, "window_chunk": 8, "deadline_retrieves": 4,
    "tenants": 10, "tenant_size": 20, "tenancy_queries": 3,
    "backlog_retrieves": 1, "limited_retrieves": 1, "quick": True,
    # Faster backends: the rows' ratios are to these latencies, so they keep their meaning.
    "chat_ms": 20.0, "rerank_ms": 10.0, "deadline_ms": 30.0, "deadline_backend_ms": 100.0,
}
