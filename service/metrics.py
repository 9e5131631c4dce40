"""Prometheus metrics: the :class:`Metrics` of one app and the database gauges of ``/metrics``.

:class:`Metrics` is built by ``create_app`` (no module-level registry). With
``PROMETHEUS_MULTIPROC_DIR`` set in the environment before the process starts, values go to
prometheus-client's per-process files in that directory and ``/metrics`` merges every worker's;
otherwise they live in the app's own ``CollectorRegistry``. The HTTP request metrics are
recorded by ``service.http.middleware.RequestObservabilityMiddleware``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from service.db.stats import CounterSnapshot, NamespaceCounters
from service.providers.scorer_health import ScorerHealthSnapshot
from service.settings import BudgetSchedule

if TYPE_CHECKING:  # pragma: no cover
    # A type only: the pipeline is the metrics' caller's business, not a dependency of theirs.
    from service.retrieve.pipeline import RetrieveResult

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Metrics",
    "database_gauges",
    "multiprocess_directory",
    "scorer_health_gauges",
]

log = logging.getLogger(__name__)

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PHASE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)
_COMPLETION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0
)
_SCORER_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def multiprocess_enabled() -> bool:
    """True when prometheus-client writes per-process files: PROMETHEUS_MULTIPROC_DIR was set
    before it was imported (it picks its value class at import time)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")) and bool(
        getattr(values.ValueClass, "_multiprocess", False)
    )


class _Families:
    """A collector that yields metric families gathered elsewhere (one exposition)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class Metrics:
    """Every metric of one app. Thread- and task-safe (prometheus-client locks its values)."""

    # Over 60 lines as a list of declarations, one metric per attribute: split, it would read
    # no better.
    def __init__(self) -> None:
        self.multiprocess = multiprocess_enabled()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not self.multiprocess:
            log.warning(
                "PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported; "
                "/metrics reports this process only (set it before the process starts)"
            )
        self.registry = CollectorRegistry()
        if not self.multiprocess:
            # Process and runtime metrics are per process; multiprocess mode cannot merge them.
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        registry = self.registry
        self.http_requests = Counter(
            "earm_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.http_duration = Histogram(
            "earm_http_request_duration_seconds",
            "HTTP request latency by method, route template and status.",
            ["method", "route", "status"],
            buckets=_HTTP_BUCKETS,
            registry=registry,
        )
        self.retrieves = Counter(
            "earm_retrieves",
            "Answered /retrieve requests by policy and whether some scorer calls failed.",
            ["policy", "degraded"],
            registry=registry,
        )
        self.retrieve_phase = Histogram(
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
        self.retrieve_scorer_calls = Counter(
            "earm_retrieve_scorer_calls",
            "Scorer calls made by /retrieve, by policy (one per scored pair).",
            ["policy"],
            registry=registry,
        )
        self.retrieve_scorer_requests = Counter(
            "earm_retrieve_scorer_requests",
            "HTTP requests the scorer made for /retrieve, retries included, by scorer backend.",
            ["scorer"],
            registry=registry,
        )
        self.retrieve_reused = Counter(
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
        self.scorer_calls = Counter(
            "earm_scorer_calls",
            "Relevance scorer calls (one per (query, memory) pair) by scorer and outcome.",
            ["scorer", "outcome"],
            registry=registry,
        )
        self.scorer_duration = Histogram(
            "earm_scorer_call_duration_seconds",
            "Latency of one scorer call, retries included, by scorer.",
            ["scorer"],
            buckets=_SCORER_BUCKETS,
            registry=registry,
        )

    # ------------------------------------------------------------------------- recording

    def observe_request(self, method: str, route: str, status: int, duration_s: float) -> None:
        labels = {"method": method, "route": route, "status": str(status)}
        self.http_requests.labels(**labels).inc()
        self.http_duration.labels(**labels).observe(duration_s)

    def observe_retrieve(self, result: RetrieveResult, scorer: str) -> None:
        policy = str(result.policy)
        self.retrieves.labels(policy=policy, degraded=str(bool(result.degraded)).lower()).inc()
        for name, milliseconds in asdict(result.timings).items():
            phase = name.removesuffix("_ms")
            self.retrieve_phase.labels(phase=phase, policy=policy).observe(milliseconds / 1000.0)
        self.completion.labels(policy=policy).observe(result.timings.complete_ms / 1000.0)
        if result.scorer_calls:
            self.retrieve_scorer_calls.labels(policy=policy).inc(result.scorer_calls)
        if result.reused:
            self.retrieve_reused.labels(policy=policy).inc(result.reused)
        if result.scorer_requests:
            self.retrieve_scorer_requests.labels(scorer=scorer).inc(result.scorer_requests)
        for source, count in Tally(m.source for m in result.memories).items():
            self.returned.labels(source=source).inc(count)

    def observe_scorer_call(
        self, scorer: str, outcome: str, duration_s: float, calls: int = 1
    ) -> None:
        """A :class:`service.providers.scorers.ScorerObserver`."""
        self.scorer_calls.labels(scorer=scorer, outcome=outcome).inc(calls)
        duration = self.scorer_duration.labels(scorer=scorer)
        for _ in range(calls):
            duration.observe(duration_s)

    # ------------------------------------------------------------------------- exposition

    def render(
        self,
        snapshot: CounterSnapshot | None,
        schedule: BudgetSchedule,
        scorer_health: ScorerHealthSnapshot,
    ) -> bytes:
        """The exposition: this app's (or every worker's) metrics plus the database gauges
        (``snapshot`` None: the database did not answer, ``earm_database_up 0``) and the
        scorer health gauges (of the process that answers the scrape)."""
        if self.multiprocess:
            # prometheus_client's multiprocess module has no annotations (the rest is typed).
            collector = MultiProcessCollector(None)  # type: ignore[no-untyped-call]
            families = list(collector.collect())  # type: ignore[no-untyped-call]
        else:
            families = list(self.registry.collect())
        families.extend(database_gauges(snapshot, schedule))
        families.extend(scorer_health_gauges(scorer_health))
        return generate_latest(_Families(families))


def scorer_health_gauges(health: ScorerHealthSnapshot) -> list[Metric]:
    """The scorer's recent calls, their success ratio (NaN without recent calls) and whether
    it counts as healthy, labelled by scorer."""
    gauges = [
        ("earm_scorer_recent_calls", "Scorer calls in the health window.", health.recent_calls),
        (
            "earm_scorer_recent_success_ratio",
            "Share of the recent scorer calls that returned a score (NaN: none recently).",
            math.nan if health.recent_success_rate is None else health.recent_success_rate,
        ),
        (
            "earm_scorer_healthy",
            "0 while most recent scorer calls fail (retrieves answer degraded), else 1.",
            1.0 if health.healthy else 0.0,
        ),
    ]
    families: list[Metric] = []
    for name, documentation, value in gauges:
        family = GaugeMetricFamily(name, documentation, labels=["scorer"])
        family.add_metric([health.name], float(value))
        families.append(family)
    return families


def database_gauges(snapshot: CounterSnapshot | None, schedule: BudgetSchedule) -> list[Metric]:
    """Gauges from the namespace counters (read at scrape time; identical in every worker)."""
    up = GaugeMetricFamily("earm_database_up", "1 if the database answered this scrape.")
    up.add_metric([], 0.0 if snapshot is None else 1.0)
    if snapshot is None:
        return [up]

    def total(name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation)
        family.add_metric([], value)
        return family

    saved = (
        1.0 - snapshot.scorer_calls / snapshot.full_rerank_calls
        if snapshot.full_rerank_calls
        else 0.0
    )
    return [
        up,
        total("earm_namespaces", "Namespaces.", snapshot.namespaces),
        total("earm_queries_recorded", "Queries recorded, all namespaces.", snapshot.queries),
        total("earm_observations", "Observed cells, all namespaces.", snapshot.observations),
        total(
            "earm_scorer_calls_recorded",
            "Scorer calls recorded with queries, all namespaces.",
            snapshot.scorer_calls,
        ),
        total(
            "earm_full_rerank_calls",
            "Scorer calls full reranking would have made for the same queries, all namespaces.",
            snapshot.full_rerank_calls,
        ),
        total(
            "earm_reused_cells",
            "Cells repeated queries took from earlier askings instead of scoring them, all "
            "namespaces.",
            snapshot.reused_cells,
        ),
        total(
            "earm_reuse_saved_calls",
            "Scorer calls reuse saved (budget not spent: the family had observed the "
            "candidates), all namespaces.",
            snapshot.reuse_saved_calls,
        ),
        total(
            "earm_calls_saved_ratio",
            "1 - scorer calls / full rerank calls, all namespaces (0 before any query).",
            saved,
        ),
        *_namespace_gauges(snapshot, schedule),
    ]


def _namespace_gauges(snapshot: CounterSnapshot, schedule: BudgetSchedule) -> list[Metric]:
    """Per-namespace gauges, of the namespaces with the most queries."""
    per_namespace: dict[str, tuple[str, Callable[[NamespaceCounters], float]]] = {
        "queries": ("Queries recorded.", lambda c: c.queries),
        "observations": (
            "Observed cells (running count, exact after each refit).",
            lambda c: c.observations,
        ),
        "scorer_calls": ("Scorer calls recorded with queries.", lambda c: c.scorer_calls),
        "full_rerank_calls": (
            "Calls full reranking would have made.",
            lambda c: c.full_rerank_calls,
        ),
        "calls_saved_ratio": (
            "1 - scorer calls / full rerank calls (0 before any query).",
            lambda c: 1.0 - c.scorer_calls / c.full_rerank_calls if c.full_rerank_calls else 0.0,
        ),
        "stage": ("Budget stage of the next query.", lambda c: schedule.stage_for(c.queries)),
        "next_budget_ratio": (
            "Share of candidates the next query will score.",
            lambda c: schedule.stages[schedule.stage_for(c.queries)][1],
        ),
        "last_refit_timestamp_seconds": (
            "Unix time of the last full refit (0: never).",
            lambda c: c.last_refit_at.timestamp() if c.last_refit_at else 0.0,
        ),
    }
    families: list[Metric] = []
    for suffix, (documentation, value) in per_namespace.items():
        family = GaugeMetricFamily(
            f"earm_namespace_{suffix}",
            documentation + " Namespaces with the most queries only.",
            labels=["namespace"],
        )
        for counters in snapshot.busiest:
            family.add_metric([counters.namespace], float(value(counters)))
        families.append(family)
    return families


@contextlib.contextmanager
def multiprocess_directory() -> Iterator[str]:
    """For ``earm serve --workers N``: the PROMETHEUS_MULTIPROC_DIR the workers will share.
    A given one is used as is (empty it before start); otherwise a fresh temporary directory is
    created and removed at exit. Workers are spawned after this, so they see the variable."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        yield given
        return
    directory = tempfile.mkdtemp(prefix="earm-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        yield directory
    finally:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(directory, ignore_errors=True)
