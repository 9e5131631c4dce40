"""The adaptive budget policy's decision (service/retrieve/budget.py), as pure functions."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from service.db.spending import SpentQuery
from service.retrieve.budget import (
    ERROR_HORIZON,
    AdaptivePolicy,
    BudgetHistory,
    adaptive_budget,
    budget_history,
    cold_head_share,
)
from service.settings import Settings

POLICY = AdaptivePolicy(target=0.2, floor=0.05, ceiling=0.5, noise=0.1)
QUIET = BudgetHistory(recent_error=None, credit=0.0)


def test_no_demand_scores_the_floor_and_full_demand_the_ceiling_when_saved_for() -> None:
    assert adaptive_budget(200, 0.0, QUIET, POLICY).budget == 10
    rich = BudgetHistory(recent_error=None, credit=5.0)
    decision = adaptive_budget(200, 1.0, rich, POLICY)
    assert decision.budget == 100
    assert "100% of the head without history" in decision.reason
    assert "may spend" in decision.reason


def test_demand_without_savings_is_held_to_the_target_and_overspending_to_the_floor() -> None:
    decision = adaptive_budget(200, 1.0, QUIET, POLICY)
    assert decision.budget == 40  # target 0.2 of 200
    assert "limited to 0.200" in decision.reason
    overspent = BudgetHistory(recent_error=None, credit=-3.0)
    assert adaptive_budget(200, 1.0, overspent, POLICY).budget == 10  # the floor always holds


@pytest.mark.parametrize(("error", "expected"), [(0.05, 10), (0.1, 10), (0.15, 55), (0.2, 100),
                                                 (0.9, 100)])
def test_recent_error_above_the_noise_asks_for_budget(error: float, expected: int) -> None:
    history = BudgetHistory(recent_error=error, credit=5.0)
    assert adaptive_budget(200, 0.0, history, POLICY).budget == expected


def test_history_weights_errors_by_anchors_over_the_latest_queries_and_sums_savings() -> None:
    latest = [SpentQuery(10, 100, 0.3, 1), SpentQuery(30, 100, 0.1, 3)]
    unmeasured = [SpentQuery(20, 100, None, 0)] * (ERROR_HORIZON - len(latest))
    older = [SpentQuery(15, 100, 5.0, 100)] * 20  # past the error horizon: spending only
    history = budget_history(latest + unmeasured + older, target=0.2)
    assert history.recent_error == pytest.approx((0.3 + 3 * 0.1) / 4)
    assert history.credit == pytest.approx(0.1 - 0.1 + 20 * 0.05)
    assert budget_history([], target=0.2) == BudgetHistory(None, 0.0)


def test_cold_share_counts_the_top_quarter_of_the_candidates_only() -> None:
    counts = np.array([0, 3, 0, 1] + [0] * 12)  # head = first 4
    assert cold_head_share(counts) == 0.5
    assert cold_head_share(np.zeros(0, dtype=np.int64)) == 0.0


def test_a_stream_with_shifts_averages_at_most_the_target_and_spends_most_after_shifts() -> None:
    window, n = 50, 200
    ratios: list[float] = []
    for t in range(600):
        cold = 1.0 if t % 150 < 10 else 0.1  # a new topic every 150 queries
        recent = [SpentQuery(round(r * n), n, None, 0) for r in reversed(ratios[-(window - 1):])]
        decision = adaptive_budget(n, cold, budget_history(recent, POLICY.target), POLICY)
        ratios.append(decision.budget / n)
    assert np.mean(ratios) <= POLICY.target + 0.005
    after_shift = [r for t, r in enumerate(ratios) if t % 150 < 10 and t >= 150]
    settled = [r for t, r in enumerate(ratios) if t % 150 >= 10]
    assert min(after_shift) > POLICY.target > max(settled)


def test_budget_bounds_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="EARM_BUDGET_FLOOR"):
        Settings(budget_floor=0.3, budget_target=0.2)
    with pytest.raises(ValidationError, match="EARM_BUDGET_FLOOR"):
        Settings(budget_ceiling=0.1)
