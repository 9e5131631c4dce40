"""The scorer's health window: recent success rate, when it counts as unhealthy, and the
rate-limited warning (with an injected clock instead of sleeping)."""

from __future__ import annotations

import logging

import pytest

from service.providers.scorer_health import (
    MAX_AGE_S,
    MIN_CALLS,
    WARN_INTERVAL_S,
    WINDOW_CALLS,
    ScorerHealth,
)
from service.providers.scorers import Outcome


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(health: ScorerHealth, outcome: Outcome, times: int) -> None:
    for _ in range(times):
        health("openai", outcome, 0.01)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_without_calls_the_scorer_is_healthy_with_no_rate() -> None:
    snapshot = ScorerHealth("openai", clock=Clock()).snapshot()
    assert (snapshot.name, snapshot.recent_calls, snapshot.recent_success_rate) == (
        "openai", 0, None
    )
    assert snapshot.healthy


def test_the_success_rate_covers_the_most_recent_calls_only() -> None:
    health = ScorerHealth("openai", clock=Clock())
    record(health, "timeout", WINDOW_CALLS)
    record(health, "ok", 60)
    snapshot = health.snapshot()
    assert snapshot.recent_calls == WINDOW_CALLS
    assert snapshot.recent_success_rate == pytest.approx(60 / WINDOW_CALLS)
    assert snapshot.healthy


def test_most_calls_failing_makes_the_scorer_unhealthy_once_there_are_enough_calls() -> None:
    health = ScorerHealth("openai", clock=Clock())
    record(health, "ok", 4)
    record(health, "http_error", MIN_CALLS - 5)
    assert health.snapshot().healthy  # too few calls to judge
    record(health, "transport_error", 1)
    snapshot = health.snapshot()
    assert snapshot.recent_calls == MIN_CALLS
    assert snapshot.recent_success_rate == pytest.approx(4 / MIN_CALLS)
    assert not snapshot.healthy


def test_calls_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    health = ScorerHealth("openai", clock=clock)
    record(health, "timeout", 20)
    clock.now += MAX_AGE_S / 2
    record(health, "ok", 5)
    assert health.snapshot().recent_calls == 25
    clock.now += MAX_AGE_S / 2 + 1
    snapshot = health.snapshot()
    assert (snapshot.recent_calls, snapshot.recent_success_rate, snapshot.healthy) == (5, 1.0, True)


def test_the_warning_is_logged_at_most_once_a_minute_while_most_calls_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="service.providers.scorer_health")
    clock = Clock()
    health = ScorerHealth("openai", clock=clock)
    for _ in range(50):  # one failed call a second
        record(health, "timeout", 1)
        clock.now += 1.0
    assert len(warnings(caplog)) == 1
    assert (
        "relevance scorer openai is failing: 0% of its last 10 calls succeeded"
        in warnings(caplog)[0]
    )

    clock.now += WARN_INTERVAL_S  # still failing a minute later: warned again, once
    record(health, "timeout", 30)
    assert len(warnings(caplog)) == 2

    record(health, "ok", WINDOW_CALLS)  # recovered: no more warnings
    clock.now += WARN_INTERVAL_S
    record(health, "ok", 10)
    assert len(warnings(caplog)) == 2


def test_a_healthy_scorer_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="service.providers.scorer_health")
    health = ScorerHealth("openai", clock=Clock())
    for _ in range(50):
        record(health, "ok", 1)
        record(health, "unparseable", 1)  # half fail: not most
    assert health.snapshot().healthy
    assert warnings(caplog) == []
