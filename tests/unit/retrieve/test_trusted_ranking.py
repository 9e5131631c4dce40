"""earm's final ranking under the learned anchor rule (service.retrieve.rerank): observed scores
are authoritative, and an unscored candidate outranks a scored one only when the posterior of
its score gives it the trust probability of scoring higher."""

from __future__ import annotations

import numpy as np

from service.retrieve.rerank import (
    OBSERVED,
    CandidateObservations,
    CandidateState,
    Ranking,
    Trust,
    rank_candidates,
)

MEAN_SCORE, REG = 0.3, 1.0
N = 12
#: The most similar eight are scored: relevance rises with similarity, the judge is exact.
SIMILARITIES = np.linspace(0.9, 0.2, N)
SCORED = np.arange(8)
SCORES = np.clip(1.4 * SIMILARITIES[SCORED] - 0.6, 0.0, 1.0)


def _rank(trust: Trust | None, scores: np.ndarray = SCORES) -> Ranking:
    candidates = CandidateState(
        similarities=SIMILARITIES,
        memory_bias=np.zeros(N),
        memory_factors=np.zeros((N, 1)),
        observation_count=np.zeros(N, dtype=np.int64),
        prior_offsets=np.zeros(N),
    )
    observed = CandidateObservations(SCORED, scores, np.zeros(len(SCORED), dtype=bool))
    return rank_candidates(
        "earm", candidates, observed, MEAN_SCORE, REG, trust=trust
    )


def _rank_of(ranking: Ranking, position: int) -> int:
    return int(np.flatnonzero(ranking.order == position)[0])


def test_the_posterior_goes_with_an_earm_ranking_of_observed_candidates() -> None:
    ranking = _rank(None)
    assert ranking.posterior is not None
    np.testing.assert_allclose(ranking.posterior.mean, ranking.estimates)
    assert np.all(ranking.posterior.sd > 0)


def test_at_even_odds_an_unscored_candidate_ranks_at_its_estimate() -> None:
    ranking = _rank(Trust(0.5))
    np.testing.assert_array_equal(ranking.order, np.argsort(-ranking.scores, kind="stable"))


def test_a_demanding_trust_keeps_unscored_candidates_below_scored_ones_they_might_not_beat(
) -> None:
    """The lowest scored candidate (0.0) sits below the unscored estimates; at trust 0.5 they
    outrank it, at 0.999 their posterior does not give them that probability."""
    even = _rank(Trust(0.5))
    demanding = _rank(Trust(0.999))
    lowest_scored = int(SCORED[np.argmin(SCORES)])
    unscored = np.setdiff1d(np.arange(N), SCORED)
    above = [p for p in unscored if even.scores[p] > SCORES.min()]
    assert above, "the fixture needs unscored estimates above the lowest score"
    assert all(_rank_of(even, p) < _rank_of(even, lowest_scored) for p in above)
    assert all(_rank_of(demanding, p) > _rank_of(demanding, lowest_scored) for p in above)


def test_trust_orders_but_never_changes_a_score() -> None:
    even, demanding = _rank(Trust(0.5)), _rank(Trust(0.95))
    np.testing.assert_array_equal(even.scores, demanding.scores)
    assert {even.sources[p] for p in SCORED} == {OBSERVED}


def test_scored_candidates_keep_their_order_by_score_whatever_the_trust() -> None:
    for trust in (None, Trust(0.5), Trust(0.9)):
        ranking = _rank(trust)
        scored_order = [p for p in ranking.order if p in set(SCORED.tolist())]
        assert scored_order == sorted(SCORED.tolist(), key=lambda p: (-SCORES[p], p))
