"""The anchors: which candidates of query t the relevance scorer sees, and how many (the budget
schedule, ``EARM_BUDGET_SCHEDULE``, is :class:`service.settings.BudgetSchedule`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


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


@dataclass(frozen=True)
class BudgetDecision:
    budget: int
    reason: str  # why: the response's budget_reason
