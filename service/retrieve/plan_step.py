"""The plan step of a retrieve: its budget and every anchor decision, round one before any score
and round two from round one's, or both before any score with ``EARM_ANCHOR_ROUNDS=1``
(docs/design.md "Budget and anchors"). The rules themselves are
``service.retrieve.anchors``; this step applies them to what the search found. Pure decisions,
no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.budget import BudgetSchedule
from service.db.search import AnchorWindow
from service.retrieve.anchors import (
    EXPLORE,
    MARGINAL,
    AnchorHistory,
    AnchorPlan,
    AnchorRule,
    OneRound,
    SecondRound,
    acquisition_values,
    anchor_seed,
    expected_entrants,
    learned_plan,
    paper_plan,
    second_round,
)
from service.retrieve.request import RetrieveRequest
from service.retrieve.rerank import OBSERVED, Ranking
from service.retrieve.search_step import FoundCandidates
from service.settings_groups import AnchorSettings

_RULE = AnchorRule()
#: What the learned rule reads of recent anchors: the two arms it compares, and every find
#: (a find of any kind can be a discovery that later finds are credited to).
_ANCHOR_WINDOW = AnchorWindow(_RULE.window, (MARGINAL, EXPLORE), _RULE.relevant)


@dataclass(frozen=True)
class BudgetDecision:
    budget: int
    reason: str  # why: the response's budget_reason


@dataclass(frozen=True)
class RetrievePlan:
    """What one retrieve spends and scores: its stage of the schedule, its budget, and its
    anchors (round one, then round two's size, share and seed)."""

    stage: int
    budget: BudgetDecision
    anchors: AnchorPlan


class Planner:
    """The budget and the anchors of each retrieve, by the schedule and ``EARM_ANCHOR_POLICY``."""

    def __init__(self, settings: AnchorSettings, schedule: BudgetSchedule) -> None:
        self.settings = settings
        self.schedule = schedule

    def anchor_window(self, request: RetrieveRequest) -> AnchorWindow | None:
        """What the search must read of the namespace's recent anchors for this retrieve's
        plan (None: its anchors do not follow the learned rule)."""
        return _ANCHOR_WINDOW if self._learns_anchors(request) else None

    def first_round(self, request: RetrieveRequest, found: FoundCandidates) -> RetrievePlan:
        """The budget and round one's anchors among the candidates the query's family has not
        observed (the budget goes to those, so coverage grows with each asking). Stage, budget
        and anchors follow the index this query expects; under concurrent requests the
        recorded index can be a few higher, never lower."""
        query_index = found.state.next_query_index
        budget = self._budget(request, query_index, len(found.candidates))
        return RetrievePlan(
            self.schedule.stage_for(query_index), budget, self._anchors(request, found, budget)
        )

    def second_round(
        self, plan: RetrievePlan, found: FoundCandidates, round_one: Ranking, k: int
    ) -> SecondRound:
        """Round two among the candidates neither scored in round one nor observed by the
        query's family, by the completion's posterior with round one folded in; none when
        the stop rule says it cannot plausibly change the top ``k``."""
        anchors = plan.anchors
        unscored = np.setdiff1d(
            np.arange(len(found.candidates)),
            np.concatenate([anchors.first, found.reused.positions]),
        )
        if self._stops(round_one, unscored, k):
            return SecondRound.stop(min(anchors.second_size, len(unscored)))
        return second_round(
            acquisition_values(
                round_one.estimates, round_one.posterior, self.settings.acquisition_quantile
            ),
            unscored, anchors.second_size, anchors.share or 0.0, anchors.seed, found.steered,
        )

    def _stops(self, round_one: Ranking, unscored: np.ndarray, k: int) -> bool:
        """Whether the unscored candidates are expected (by round one's posterior) to put
        fewer than ``EARM_STOP_EXPECTED`` of them into the top ``k``."""
        posterior = round_one.posterior
        if self.settings.stop_expected <= 0 or posterior is None or len(unscored) == 0:
            return False
        observed = np.array(round_one.sources) == OBSERVED
        expected = expected_entrants(posterior, round_one.scores[observed], unscored, k)
        return expected is not None and expected < self.settings.stop_expected

    def _learns_anchors(self, request: RetrieveRequest) -> bool:
        return self.settings.policy == "learned" and request.policy in ("earm", "observed")

    def _one_round(self, found: FoundCandidates) -> OneRound | None:
        """With ``EARM_ANCHOR_ROUNDS=1``, what the picks after the head are chosen by: the
        model's estimate for a query it has no anchors of yet, μ + b_m + γ·cos + w·e_m, with
        what near-paraphrases observed weighed in as the ranking weighs it. None: two rounds."""
        if self.settings.rounds == 2:
            return None
        state = found.candidate_state(self.settings.content_prior)
        estimates = found.state.mean_score + state.memory_bias + state.prior_offsets
        if found.neighbours is not None:
            estimates = found.neighbours.blended(estimates, self.settings.paraphrase_prior)
        return OneRound(estimates, found.steered)

    def _budget(
        self, request: RetrieveRequest, query_index: int, n_candidates: int
    ) -> BudgetDecision:
        if request.policy == "semantic":
            return BudgetDecision(0, "policy semantic: no scorer calls")
        if request.policy == "full":
            return BudgetDecision(n_candidates, "policy full: every candidate")
        if request.budget is not None:
            return BudgetDecision(min(request.budget, n_candidates), "set by the request")
        stage = self.schedule.stage_for(query_index)
        return BudgetDecision(
            self.schedule.budget_for_query(query_index, n_candidates),
            f"schedule: stage {stage} of the schedule, ratio {self.schedule.stages[stage][1]:g}",
        )

    def _anchors(
        self, request: RetrieveRequest, found: FoundCandidates, budget: BudgetDecision
    ) -> AnchorPlan:
        seed = anchor_seed(request.namespace, found.state.next_query_index, request.seed)
        n_candidates, observed = len(found.candidates), found.reused.positions
        if self._learns_anchors(request):
            recent = found.recent_anchors
            history = AnchorHistory(
                recent.query_index, recent.kind, recent.memory_ids, recent.scores
            )
            return learned_plan(
                n_candidates, observed, budget.budget, history, seed, self._one_round(found)
            )
        return paper_plan(n_candidates, observed, budget.budget, seed, found.steered)
