"""The configuration of ``earm bench load``: the CLI flags, as a dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from earm_bench.common.http import POLICIES


@dataclass
class LoadConfig:
    """Everything a run depends on (the CLI flags, as a dataclass)."""

    memories: int = 10_000
    observations: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    embed_memories: int = 1_000
    copy_memories: int = 2_000
    concurrency: tuple[int, ...] = (1, 8, 32)
    policies: tuple[str, ...] = POLICIES
    requests: int = 64
    completion_requests: int = 30
    slow_requests: int = 24
    dashboard_requests: int = 10
    latency_ms: float = 0.0
    slow_latency_ms: float = 50.0
    candidates: int = 200
    k: int = 10
    dim: int = 384
    topics: int = 64
    true_rank: int = 4
    obs_per_query: int = 50
    scorer_concurrency: int = 16
    ingest_batch: int = 1_000
    ingest_clients: int = 2
    db_pool_size: int = 10
    scale_out: bool = False
    api_processes: int = 2
    workers: int = 1
    scale_out_concurrency: int = 8
    scale_out_requests: int = 128
    seed: int = 0
    database_url: str | None = None
    citus: bool = False
    out: Path | None = None
    plot: Path | None = None
    plot_with: tuple[Path, ...] = ()
    progress: bool | None = None
    command: str = ""

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if self.memories < self.candidates:
            raise ValueError("--memories must be at least --candidates")
        if sorted(self.observations) != list(self.observations) or any(
            o < 1 for o in self.observations
        ):
            raise ValueError("--observations must be increasing positive counts")
        if self.obs_per_query > self.memories // self.topics:
            raise ValueError("--obs-per-query exceeds the memories of one topic")
        if min(self.concurrency, default=0) < 1 or self.requests < 1:
            raise ValueError("--concurrency and --requests must be positive")
        if self.slow_requests < 0:
            raise ValueError("--slow-requests must be 0 (no slow judge) or more")
        if self.citus and self.database_url:
            raise ValueError("--citus starts a cluster of its own: drop --database-url")
        if min(self.api_processes, self.workers, self.scale_out_concurrency,
               self.scale_out_requests) < 1:
            raise ValueError("--api-processes, --workers, --scale-out-concurrency and "
                             "--scale-out-requests must be positive")

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("out", "plot"):
            out[key] = None if out[key] is None else str(out[key])
        out["plot_with"] = [str(p) for p in self.plot_with]
        out["database_url"] = "external" if self.database_url else None
        for key in ("observations", "concurrency", "policies"):
            out[key] = list(out[key])
        return out
