"""The budget schedule (``EARM_BUDGET_SCHEDULE``): the share of a query's candidates the scorer
scores, by the namespace's query index. A leaf module: the settings validate a schedule, and
the pipeline, ``/stats`` and ``/metrics`` read it, without importing one another."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BUDGET_SCHEDULE = "0:1.0,5:0.5,15:0.3,30:0.175"


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
