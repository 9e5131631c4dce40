"""The anchors: which candidates of query t the relevance scorer sees, and how many. The budget
schedule (``EARM_BUDGET_SCHEDULE``) is :class:`service.settings.BudgetSchedule`; the adaptive
policy (``EARM_BUDGET_POLICY=adaptive``) is decided here, from pure inputs."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.db.spending import SpentQuery
from service.settings import Settings


def anchor_seed(namespace: str, query_index: int, seed: int) -> int:
    """A stable 64-bit seed: the same (namespace, index, seed) replays the same anchors."""
    digest = hashlib.blake2b(f"{namespace}\x1f{query_index}\x1f{seed}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def sample_anchors(
    n_candidates: int, budget: int, rng_seed: int, not_explored: np.ndarray | None = None
) -> np.ndarray:
    """Candidate positions (0 = most similar) to score, ascending.

    Half the budget (rounded up) exploits the top of the semantic ranking; the other half is
    drawn uniformly from the lower-ranked rest, which both finds relevant memories that
    similarity under-ranks and spreads observations over the matrix for completion to learn from.
    The exploring half leaves ``not_explored`` alone (fewer anchors if nothing else is left).
    """
    budget = max(0, min(budget, n_candidates))
    n_top = (budget + 1) // 2
    top = np.arange(n_top)
    rest = np.arange(n_top, n_candidates)
    if not_explored is not None:
        rest = np.setdiff1d(rest, not_explored)
    explored = np.random.default_rng(rng_seed).choice(
        rest, size=min(budget - n_top, len(rest)), replace=False
    )
    return np.sort(np.concatenate([top, explored]).astype(np.int64))


# --- the adaptive budget policy (EARM_BUDGET_POLICY=adaptive) ---------------------------------

#: The share of the candidates, from the top of the semantic ranking, whose lack of history
#: asks for budget: the relevant memories sit there and the exploiting anchors go there, while
#: the tail is always mostly cold and says nothing about this query.
HEAD_SHARE = 0.25
#: The recent error is read over this many of the latest queries: short enough to see a shift.
ERROR_HORIZON = 10


@dataclass(frozen=True)
class AdaptivePolicy:
    """The bounds of the adaptive budget, as shares of the candidates (the settings)."""

    target: float
    floor: float
    ceiling: float
    noise: float

    @classmethod
    def from_settings(cls, settings: Settings) -> AdaptivePolicy:
        return cls(settings.budget_target, settings.budget_floor, settings.budget_ceiling,
                   settings.budget_noise)


@dataclass(frozen=True)
class BudgetHistory:
    """What the namespace's recent queries tell the next budget."""

    # Anchor-weighted mean prequential error of the last ERROR_HORIZON queries; None if none.
    recent_error: float | None
    # Σ (target − spent ratio) over the recent queries: what they saved (negative: overspent).
    credit: float


@dataclass(frozen=True)
class BudgetDecision:
    budget: int
    reason: str  # why: the response's budget_reason


def budget_history(recent: Sequence[SpentQuery], target: float) -> BudgetHistory:
    """The history of ``recent`` queries, latest first."""
    latest = [q for q in recent[:ERROR_HORIZON] if q.prequential_error is not None]
    anchors = sum(q.prequential_count for q in latest)
    error = (
        sum(float(q.prequential_error or 0.0) * q.prequential_count for q in latest) / anchors
        if anchors
        else None
    )
    credit = sum(target - q.budget / q.candidates for q in recent if q.candidates > 0)
    return BudgetHistory(error, credit)


def cold_head_share(observation_count: np.ndarray) -> float:
    """The share of the head of the candidates (most similar first) with no observation."""
    if len(observation_count) == 0:
        return 0.0
    head = observation_count[: max(1, math.ceil(HEAD_SHARE * len(observation_count)))]
    return float(np.mean(head == 0))


def adaptive_budget(
    n_candidates: int, cold_share: float, history: BudgetHistory, policy: AdaptivePolicy
) -> BudgetDecision:
    """The budget of a query after the warm-up.

    The demand is the larger of two signs that the model cannot rank this query: the share of
    the head of its candidates without history (new memories, a new topic: completion has
    nothing to go on and falls back to similarity), and the recent prequential error in excess
    of the scorer's own noise (0 at the noise, 1 at twice it). The budget wanted runs from the
    floor (no demand) to the ceiling (full demand); what it may spend is the target plus what
    the recent queries saved below it (a token bucket over EARM_BUDGET_WINDOW queries), so the
    average stays at the target while quiet queries pay for the ones after a shift. The floor
    always holds.
    """
    error = history.recent_error
    excess = 0.0 if error is None else min(1.0, max(0.0, (error - policy.noise) / policy.noise))
    demand = max(cold_share, excess)
    wanted = policy.floor + (policy.ceiling - policy.floor) * demand
    affordable = max(policy.floor, policy.target + history.credit)
    ratio = min(wanted, affordable)
    budget = min(n_candidates, int(round(ratio * n_candidates)))
    error_text = "none measured" if error is None else f"{error:.3f}"
    reason = (
        f"adaptive: {cold_share:.0%} of the head without history, recent error {error_text} "
        f"(noise {policy.noise:g}): wants {wanted:.3f} of the candidates, "
        f"{'may spend' if affordable >= wanted else 'limited to'} {affordable:.3f}"
    )
    return BudgetDecision(budget, reason)
