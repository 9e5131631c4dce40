"""The scoring budget: how many candidates of query t the relevance scorer sees, and which."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BudgetSchedule:
    """Stage-wise share of candidates to score, by per-namespace query index.

    ``stages[i] = (first_query_index, ratio)``; stage i applies from its index until the next.
    Budgets fall as experience grows because completion covers more of what is not scored.
    """

    stages: tuple[tuple[int, float], ...]

    @classmethod
    def parse(cls, text: str) -> BudgetSchedule:
        """Parse ``"0:1.0,10:0.6,30:0.4"``; raise ValueError with the offending part."""
        stages: list[tuple[int, float]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            try:
                start_text, ratio_text = part.split(":")
                start, ratio = int(start_text), float(ratio_text)
            except ValueError as exc:
                raise ValueError(
                    f"budget schedule entry {part!r} is not 'query_index:ratio'"
                ) from exc
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"budget schedule ratio {ratio} in {part!r} is not in [0, 1]")
            if stages and start <= stages[-1][0]:
                raise ValueError("budget schedule query indexes must increase strictly")
            stages.append((start, ratio))
        if not stages or stages[0][0] != 0:
            raise ValueError("budget schedule must start at query index 0, e.g. '0:1.0,10:0.5'")
        return cls(tuple(stages))

    def stage_for(self, query_index: int) -> int:
        stage = 0
        for number, (start, _) in enumerate(self.stages):
            if query_index >= start:
                stage = number
        return stage

    def budget_for_query(self, query_index: int, n_candidates: int) -> int:
        ratio = self.stages[self.stage_for(query_index)][1]
        return min(n_candidates, int(round(ratio * n_candidates)))


def anchor_seed(namespace: str, query_index: int, seed: int) -> int:
    """A stable 64-bit seed: the same (namespace, index, seed) replays the same anchors."""
    digest = hashlib.blake2b(f"{namespace}\x1f{query_index}\x1f{seed}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def sample_anchors(n_candidates: int, budget: int, rng_seed: int) -> np.ndarray:
    """Candidate positions (0 = most similar) to score, ascending.

    Half the budget (rounded up) exploits the top of the semantic ranking; the other half is
    drawn uniformly from the lower-ranked rest, which both finds relevant memories that
    similarity under-ranks and spreads observations over the matrix for completion to learn from.
    """
    budget = max(0, min(budget, n_candidates))
    n_top = (budget + 1) // 2
    top = np.arange(n_top)
    rest = np.arange(n_top, n_candidates)
    explored = np.random.default_rng(rng_seed).choice(rest, size=budget - n_top, replace=False)
    return np.sort(np.concatenate([top, explored]).astype(np.int64))
