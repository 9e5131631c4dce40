"""The metrics an app records while it serves, grouped by what they measure: HTTP requests,
retrieves and scorer calls; and the exposition that adds the scrape-time gauges to them."""

from __future__ import annotations

import logging
import os
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import Metric

from service.budget import BudgetSchedule
from service.db.stats import CounterSnapshot
from service.metrics.gauges import (
    ScorerBackendState,
    database_gauges,
    scorer_backend_gauges,
    scorer_health_gauges,
)
from service.metrics.multiprocess import merged_families, multiprocess_enabled
from service.providers.scorer_health import ScorerHealthSnapshot

if TYPE_CHECKING:  # pragma: no cover
    # A type only: the pipeline is the metrics' caller's business, not a dependency of theirs.
    from service.api.retrieve import RetrieveResult

log = logging.getLogger(__name__)

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PHASE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)
_COMPLETION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0
)
_SCORER_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Families:
    """A collector that yields metric families gathered elsewhere (one exposition)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class _HttpMetrics:
    """HTTP requests by method, route template and status, and their latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["method", "route", "status"]
        self.requests = Counter(
            "earm_http_requests",
            "HTTP requests by method, route template and status.",
            labels,
            registry=registry,
        )
        self.duration = Histogram(
            "earm_http_request_duration_seconds",
            "HTTP request latency by method, route template and status.",
            labels,
            buckets=_HTTP_BUCKETS,
            registry=registry,
        )

    def observe(self, method: str, route: str, status: int, duration_s: float) -> None:
        labels = {"method": method, "route": route, "status": str(status)}
        self.requests.labels(**labels).inc()
        self.duration.labels(**labels).observe(duration_s)


class _RetrieveMetrics:
    """Answered retrieves: their phases' times, the scorer calls and reuse they cost, and where
    the scores of the memories they returned came from."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.answered = Counter(
            "earm_retrieves",
            "Answered /retrieve requests by policy and whether some scorer calls failed.",
            ["policy", "degraded"],
            registry=registry,
        )
        self.phase = Histogram(
            "earm_retrieve_phase_seconds",
            "Time of each /retrieve phase (embed, search, score, complete, record, total).",
            ["phase", "policy"],
            buckets=_PHASE_BUCKETS,
            registry=registry,
        )
        self.completion = Histogram(
            "earm_completion_seconds",
            "Time of the completion and rerank of one /retrieve (the `complete` phase).",
            ["policy"],
            buckets=_COMPLETION_BUCKETS,
            registry=registry,
        )
        self.scorer_calls = Counter(
            "earm_retrieve_scorer_calls",
            "Scorer calls made by /retrieve, by policy (one per scored pair).",
            ["policy"],
            registry=registry,
        )
        self.scorer_requests = Counter(
            "earm_retrieve_scorer_requests",
            "HTTP requests the scorer made for /retrieve, retries included, by scorer backend.",
            ["scorer"],
            registry=registry,
        )
        self.reused = Counter(
            "earm_retrieve_reused_cells",
            "Cells /retrieve took from earlier askings of the same query instead of scoring "
            "them, by policy.",
            ["policy"],
            registry=registry,
        )
        self.returned = Counter(
            "earm_returned_memories",
            "Memories returned by /retrieve, by where their score came from.",
            ["source"],
            registry=registry,
        )
        self.late_anchors = Counter(
            "earm_late_anchors",
            "Anchors whose scores missed the answer deadline (EARM_SCORE_DEADLINE_MS), by how "
            "they ended: recorded, superseded (the pair had feedback already, or its memory is "
            "gone), failed, dropped (still pending at shutdown).",
            ["outcome"],
            registry=registry,
        )

    def observe(self, result: RetrieveResult, scorer: str) -> None:
        policy = str(result.policy)
        self.answered.labels(policy=policy, degraded=str(bool(result.degraded)).lower()).inc()
        for name, milliseconds in asdict(result.timings).items():
            phase = name.removesuffix("_ms")
            self.phase.labels(phase=phase, policy=policy).observe(milliseconds / 1000.0)
        self.completion.labels(policy=policy).observe(result.timings.complete_ms / 1000.0)
        if result.scorer_calls:
            self.scorer_calls.labels(policy=policy).inc(result.scorer_calls)
        if result.reused:
            self.reused.labels(policy=policy).inc(result.reused)
        if result.scorer_requests:
            self.scorer_requests.labels(scorer=scorer).inc(result.scorer_requests)
        for source, count in Tally(m.source for m in result.memories).items():
            self.returned.labels(source=source).inc(count)


class _ScorerMetrics:
    """Relevance scorer calls by scorer and outcome, and their latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "earm_scorer_calls",
            "Relevance scorer calls (one per (query, memory) pair) by scorer and outcome.",
            ["scorer", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "earm_scorer_call_duration_seconds",
            "Latency of one scorer call, retries included, by scorer.",
            ["scorer"],
            buckets=_SCORER_BUCKETS,
            registry=registry,
        )

    def observe(self, scorer: str, outcome: str, duration_s: float, calls: int) -> None:
        self.calls.labels(scorer=scorer, outcome=outcome).inc(calls)
        duration = self.duration.labels(scorer=scorer)
        for _ in range(calls):
            duration.observe(duration_s)


class _ReplicaMetrics:
    """Reads that may run on a read replica, by where they ran (service.db.replicas)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reads = Counter(
            "earm_replica_reads",
            "Reads a read replica may serve, by outcome: replica, or the primary because the "
            "replica lagged (primary_lag), failed (primary_error) or is marked down after a "
            "failure (primary_down).",
            ["outcome"],
            registry=registry,
        )


class _RefitMetrics:
    """Full refits run by this process, by how they ended (service.retrieve.refit_health)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.refits = Counter(
            "earm_refits",
            "Full refits by outcome: refitted, skipped (another process held the namespace's "
            "refit lock), erased (the namespace was deleted first), failed (it stays due).",
            ["outcome"],
            registry=registry,
        )


def _app_registry(multiprocess: bool) -> CollectorRegistry:
    registry = CollectorRegistry()
    if not multiprocess:
        # Process and runtime metrics are per process; multiprocess mode cannot merge them.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


class Metrics:
    """Every metric of one app, grouped by what they measure (HTTP requests, retrieves, scorer
    calls). Thread- and task-safe (prometheus-client locks its values)."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_enabled()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not self.multiprocess:
            log.warning(
                "PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported; "
                "/metrics reports this process only (set it before the process starts)"
            )
        self.registry = _app_registry(self.multiprocess)
        self.http = _HttpMetrics(self.registry)
        self.retrieve = _RetrieveMetrics(self.registry)
        self.scorer = _ScorerMetrics(self.registry)
        self.replica = _ReplicaMetrics(self.registry)
        self.refit = _RefitMetrics(self.registry)

    # ------------------------------------------------------------------------- recording

    def observe_request(self, method: str, route: str, status: int, duration_s: float) -> None:
        self.http.observe(method, route, status, duration_s)

    def observe_retrieve(self, result: RetrieveResult, scorer: str) -> None:
        self.retrieve.observe(result, scorer)

    def observe_late_anchors(self, outcome: str, anchors: int) -> None:
        """A :data:`service.retrieve.late.LateObserver`."""
        self.retrieve.late_anchors.labels(outcome=outcome).inc(anchors)

    def observe_scorer_call(
        self, scorer: str, outcome: str, duration_s: float, calls: int = 1
    ) -> None:
        """A :class:`service.providers.scorers.ScorerObserver`."""
        self.scorer.observe(scorer, outcome, duration_s, calls)

    def observe_replica_read(self, outcome: str) -> None:
        """A :data:`service.db.replicas.ReadObserver`."""
        self.replica.reads.labels(outcome=outcome).inc()

    def observe_refit(self, outcome: str) -> None:
        """A :data:`service.retrieve.refit_health.RefitObserver`."""
        self.refit.refits.labels(outcome=outcome).inc()

    # ------------------------------------------------------------------------- exposition

    def render(
        self,
        snapshot: CounterSnapshot | None,
        schedule: BudgetSchedule,
        scorer_health: ScorerHealthSnapshot,
        scorer_backend: ScorerBackendState | None = None,
    ) -> bytes:
        """The exposition: this app's (or every worker's) metrics plus the database gauges
        (``snapshot`` None: the database did not answer, ``earm_database_up 0``), the scorer
        health gauges and an HTTP scorer's concurrency window and breaker (of the process that
        answers the scrape)."""
        families = merged_families() if self.multiprocess else list(self.registry.collect())
        families.extend(database_gauges(snapshot, schedule))
        families.extend(scorer_health_gauges(scorer_health))
        if scorer_backend is not None:
            families.extend(scorer_backend_gauges(scorer_health.name, scorer_backend))
        return generate_latest(_Families(families))
