"""The health of a process's refits: a failure burst is logged once (then at most a reminder
per interval), a success ends it, and the snapshot says so. No database: the outcomes are
told to it as the learner tells them."""

from __future__ import annotations

import logging

import pytest

from service.retrieve.refit_health import WARN_INTERVAL_S, RefitHealth, RefitOutcome


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_refit_failures_logs_one_traceback_then_a_reminder_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outcomes: list[RefitOutcome] = []
    health = RefitHealth(outcomes.append, clock)
    with caplog.at_level(logging.INFO, logger="service.retrieve.refit_health"):
        for _ in range(50):  # a namespace due at every query fails at every query
            clock.now += 1.0
            health.failed("ns", RuntimeError("the refit process died"))
        clock.now += WARN_INTERVAL_S
        health.failed("ns", RuntimeError("the refit process died"))
    records = caplog.records
    assert [r.levelname for r in records] == ["ERROR", "WARNING"]
    assert records[0].exc_info is not None  # the first failure's traceback, once
    assert "51 in a row" in records[1].getMessage()
    assert outcomes == [RefitOutcome.FAILED] * 51


def test_a_successful_refit_ends_the_failure_streak_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = RefitHealth(clock=Clock())
    health.failed("ns", RuntimeError("boom"))
    failing = health.snapshot()
    assert not failing.healthy
    assert failing.consecutive_failures == 1
    assert failing.last_error == "RuntimeError: boom"
    assert failing.last_failure_at is not None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="service.retrieve.refit_health"):
        health.ended("ns", RefitOutcome.SKIPPED)  # another process refits: no verdict
        assert not health.snapshot().healthy
        health.ended("ns", RefitOutcome.REFITTED)
    recovered = health.snapshot()
    assert recovered.healthy and recovered.consecutive_failures == 0
    assert [r.getMessage() for r in caplog.records] == [
        "refits succeed again (namespace 'ns') after 1 failures"
    ]
