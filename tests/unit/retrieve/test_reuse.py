"""Query families and paraphrase evidence, as pure functions (service.retrieve.reuse)."""

from __future__ import annotations

import numpy as np
import pytest

from service.retrieve.anchors import EXPLORE, HEAD, sample_anchors, unobserved_anchors
from service.retrieve.reuse import NeighbourEvidence, neighbour_evidence, reused_candidates


def test_reused_candidates_are_the_candidates_the_family_observed_with_their_scores() -> None:
    candidates = np.array([10, 11, 12, 13])
    reused = reused_candidates(candidates, np.array([13, 99, 11]), np.array([0.3, 0.9, 0.7]))
    assert reused.positions.tolist() == [1, 3]
    assert reused.scores.tolist() == [0.7, 0.3]


NOTHING = np.zeros(0, dtype=np.int64)


def test_anchors_are_sampled_among_the_candidates_the_family_has_not_observed() -> None:
    anchors, kinds = unobserved_anchors(20, np.array([0, 2, 7]), 6, rng_seed=1, steered=NOTHING)
    assert len(anchors) == 6 and not set(anchors.tolist()) & {0, 2, 7}
    # the exploiting half: the three most similar unobserved candidates
    assert anchors[:3].tolist() == [1, 3, 4]
    assert kinds.tolist() == [HEAD] * 3 + [EXPLORE] * 3


def test_steered_candidates_are_left_to_the_exploring_half_only() -> None:
    """A query judges its own head whatever its paraphrases observed; the exploring half
    leaves what they observed to their evidence."""
    steered = np.array([1, 3, 8, 9, 10, 11, 12])
    for seed in range(20):
        anchors, _ = unobserved_anchors(14, np.array([0]), 6, seed, steered)
        assert anchors[:3].tolist() == [1, 2, 3]  # the head, steered or not
        assert not set(anchors[3:].tolist()) & set(steered.tolist())
        assert len(anchors) == 6
    # nothing left to explore: fewer anchors, never a steered one
    assert unobserved_anchors(6, NOTHING, 6, 0, np.array([3, 4, 5]))[0].tolist() == [0, 1, 2]


def test_without_steering_the_anchors_are_the_plain_sample() -> None:
    for seed in range(5):
        assert unobserved_anchors(200, NOTHING, 35, seed, NOTHING)[0].tolist() == (
            sample_anchors(200, 35, seed)[0].tolist()
        )


def test_neighbour_evidence_weighs_each_observation_by_its_querys_similarity_over_the_threshold(
) -> None:
    evidence = neighbour_evidence(
        candidate_ids=np.array([1, 2, 3]),
        neighbour_ids=np.array([1, 1, 2, 7]),
        neighbour_similarities=np.array([1.0, 0.95, 0.9, 1.0]),
        neighbour_scores=np.array([1.0, 0.0, 1.0, 1.0]),
        min_similarity=0.9,
    )
    # memory 1: weights 1 and 0.5; memory 2: weight 0 at the threshold; 7 is no candidate
    assert evidence.weights == pytest.approx([1.5, 0.0, 0.0])
    assert evidence.means == pytest.approx([1 / 1.5, 0.0, 0.0])
    assert evidence.steering.tolist() == [0]  # 1.5 ≥ STEER_WEIGHT


def test_only_strong_neighbour_evidence_steers_anchors_away() -> None:
    evidence = neighbour_evidence(
        candidate_ids=np.array([1, 2]),
        neighbour_ids=np.array([1, 2]),
        neighbour_similarities=np.array([0.96, 0.99]),
        neighbour_scores=np.array([1.0, 1.0]),
        min_similarity=0.9,
    )
    assert evidence.weights == pytest.approx([0.6, 0.9])
    assert evidence.steering.tolist() == [1]


def test_neighbour_evidence_weighs_into_an_estimate_only_where_there_is_some() -> None:
    evidence = NeighbourEvidence(weights=np.array([0.0, 1.0, 3.0]),
                                 means=np.array([0.0, 0.9, 0.1]))
    blended = evidence.blended(np.array([0.4, 0.4, 0.4]), prior=1.0)
    np.testing.assert_allclose(blended, [0.4, (0.4 + 0.9) / 2, (0.4 + 3 * 0.1) / 4])
