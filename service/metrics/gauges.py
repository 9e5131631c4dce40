"""The gauges ``/metrics`` reads at scrape time: the namespace counters of the database
(identical in every worker) and the health of the scorer of the process that answers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from service.budget import BudgetSchedule
from service.db.stats import CounterSnapshot, NamespaceCounters
from service.providers.scorer_health import ScorerHealthSnapshot


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


@dataclass(frozen=True)
class ScorerBackendState:
    """What an HTTP scorer's traffic control says of its backend now."""

    window: int  # requests let in flight at once (the concurrency window)
    breaker_open: bool  # the backend refused its connects: requests fail at once but probes


def scorer_backend_gauges(scorer: str, state: ScorerBackendState) -> list[Metric]:
    """The HTTP scorer's concurrency window and breaker, labelled by scorer."""
    window = GaugeMetricFamily(
        "earm_scorer_concurrency_window",
        "Scorer requests let in flight at once now: halves when the backend sheds load (429, "
        "503, no answer), is cut to twice what a backend that queues silently works on, grows "
        "back by one per window of answers.",
        labels=["scorer"],
    )
    window.add_metric([scorer], float(state.window))
    breaker = GaugeMetricFamily(
        "earm_scorer_breaker_open",
        "1 while the scorer's backend counts as down (it refused its connects): its requests "
        "fail at once as unavailable but for a probe every EARM_SCORER_BREAKER_DELAY_S; else 0.",
        labels=["scorer"],
    )
    breaker.add_metric([scorer], 1.0 if state.breaker_open else 0.0)
    return [window, breaker]


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
