"""What each policy ranks by (service.retrieve.rerank.rank_candidates): observed scores are kept
under every policy; semantic ranks by similarity; observed and full rank the rest by the
similarity calibrated on the query's anchors; earm by the completion, which says where an
estimate came from and weighs near-paraphrases' observations in."""

from __future__ import annotations

import numpy as np

from service.retrieve.rerank import (
    ESTIMATED,
    OBSERVED,
    POLICIES,
    SEMANTIC,
    CandidateObservations,
    CandidateState,
    Policy,
    Ranking,
    rank_candidates,
)
from service.retrieve.reuse import NeighbourEvidence

MEAN_SCORE, REG = 0.3, 1.0
N = 10
SIMILARITIES = np.linspace(0.9, 0.45, N)
SCORED = np.array([0, 2, 4])
#: The judge disagrees with similarity: the less similar of the anchors scores highest.
SCORES = np.array([0.2, 0.5, 0.9])


def _state(memory_bias: np.ndarray | None = None, observed_before: int = 0) -> CandidateState:
    count = np.zeros(N, dtype=np.int64)
    count[:observed_before] = 3
    return CandidateState(
        similarities=SIMILARITIES,
        memory_bias=np.zeros(N) if memory_bias is None else memory_bias,
        memory_factors=np.zeros((N, 1)),
        observation_count=count,
        prior_offsets=np.zeros(N),
    )


def _observed(positions: np.ndarray = SCORED, scores: np.ndarray = SCORES) -> CandidateObservations:
    return CandidateObservations(positions, scores, np.zeros(len(positions), dtype=bool))


def _rank(
    policy: Policy,
    state: CandidateState | None = None,
    observed: CandidateObservations | None = None,
    neighbours: NeighbourEvidence | None = None,
    neighbour_prior: float = 1.0,
) -> Ranking:
    return rank_candidates(
        policy,
        _state() if state is None else state,
        _observed() if observed is None else observed,
        MEAN_SCORE,
        REG,
        neighbours,
        neighbour_prior,
    )


def test_semantic_with_nothing_observed_ranks_by_similarity_and_says_so() -> None:
    ranking = _rank("semantic", observed=_observed(np.zeros(0, np.int64), np.zeros(0)))
    np.testing.assert_array_equal(ranking.order, np.arange(N))
    np.testing.assert_allclose(ranking.scores, SIMILARITIES)
    assert set(ranking.sources) == {SEMANTIC}
    assert ranking.query is None and ranking.posterior is None


def test_every_policy_keeps_the_observed_scores_and_marks_them_observed() -> None:
    for policy in POLICIES:
        ranking = _rank(policy)
        np.testing.assert_allclose(ranking.scores[SCORED], SCORES, err_msg=policy)
        assert [ranking.sources[p] for p in SCORED] == [OBSERVED] * len(SCORED), policy


def test_observed_ranks_the_unscored_by_the_similarity_calibrated_on_the_anchors() -> None:
    """The calibration's slope is floored above zero, so the unscored keep the semantic order
    among themselves, whatever their anchors said."""
    ranking = _rank("observed")
    unscored = np.setdiff1d(np.arange(N), SCORED)
    order_of_unscored = [p for p in ranking.order if p in unscored]
    assert order_of_unscored == sorted(unscored)
    assert all(ranking.sources[p] == SEMANTIC for p in unscored)
    assert ranking.posterior is None


def test_the_observed_order_puts_the_highest_score_first() -> None:
    ranking = _rank("observed")
    assert ranking.order[0] == 4  # scored 0.9, the least similar anchor


def test_earm_estimates_memories_with_history_and_calibrates_those_without() -> None:
    ranking = _rank("earm", _state(observed_before=2))
    assert ranking.sources[1] == ESTIMATED  # history, unscored
    assert ranking.sources[5] == SEMANTIC  # no history, no content prior
    assert ranking.posterior is not None and ranking.query is not None


def test_earm_ranks_a_memory_the_namespace_learned_is_relevant_above_its_neighbours() -> None:
    """A large memory bias (relevant to every query so far) lifts an unscored candidate's
    estimate above the candidates beside it in similarity."""
    bias = np.zeros(N)
    bias[7] = 0.5
    ranking = _rank("earm", _state(bias, observed_before=N))
    assert ranking.estimates[7] > max(ranking.estimates[6], ranking.estimates[8])


def test_paraphrase_evidence_moves_an_estimate_toward_what_the_paraphrase_observed() -> None:
    weights, means = np.zeros(N), np.zeros(N)
    weights[9], means[9] = 1.0, 1.0
    plain = _rank("earm")
    blended = _rank("earm", neighbours=NeighbourEvidence(weights, means), neighbour_prior=0.25)
    assert blended.estimates[9] > plain.estimates[9]
    np.testing.assert_allclose(
        blended.estimates[9], (0.25 * plain.estimates[9] + 1.0) / 1.25
    )
    assert blended.paraphrased == 1 and blended.sources[9] == ESTIMATED


def test_paraphrase_evidence_on_an_observed_candidate_does_not_count_as_paraphrased() -> None:
    weights, means = np.zeros(N), np.zeros(N)
    weights[SCORED[0]], means[SCORED[0]] = 1.0, 1.0
    ranking = _rank("earm", neighbours=NeighbourEvidence(weights, means))
    assert ranking.paraphrased == 0
    assert ranking.scores[SCORED[0]] == SCORES[0]


def test_reused_observations_have_no_prequential_error_fresh_ones_with_history_do() -> None:
    state = _state(observed_before=N)
    fresh = _rank("earm", state)
    reused = _rank(
        "earm", state,
        observed=CandidateObservations(SCORED, SCORES, np.ones(len(SCORED), dtype=bool)),
    )
    assert len(fresh.prequential_errors) == len(SCORED)
    assert len(reused.prequential_errors) == 0
