"""The common score scale: each source's typical irrelevant and relevant score, learned from
its own scores, and the map that puts them at 0.1 and 0.9."""

from __future__ import annotations

import numpy as np
import pytest

from service.completion.scale import (
    COMMON_IRRELEVANT,
    COMMON_RELEVANT,
    IDENTITY,
    ScoreScale,
    fit_scale,
    histogram,
    refit_scales,
)


def _judge_scores(
    rng: np.random.Generator, n: int = 600, relevant_share: float = 0.15
) -> np.ndarray:
    """A near-binary judge's scores of anchors: mostly irrelevant pairs near 0, some relevant
    ones near 0.85, with noise, in [0, 1]."""
    relevant = rng.random(n) < relevant_share
    scores = np.where(relevant, rng.normal(0.85, 0.08, n), rng.normal(0.05, 0.04, n))
    return np.clip(scores, 0.0, 1.0)


def _fit(scores: np.ndarray) -> ScoreScale | None:
    return fit_scale(*histogram(scores))


def _cross_encoder(scores: np.ndarray) -> np.ndarray:
    """The same judgements on a cross-encoder's compressed scale (relevant around 0.2)."""
    return 0.01 + 0.22 * scores


def test_the_identity_scale_leaves_scores_exactly_as_they_are() -> None:
    # exactly: a live answer's score and the same score read back later must be equal
    raw = np.append(np.linspace(0.0, 1.0, 101), [0.45, 0.35, 0.15])
    assert IDENTITY.common(raw).tolist() == raw.tolist()


def test_a_near_binary_judge_gets_its_two_clusters_as_its_typical_scores() -> None:
    scores = _judge_scores(np.random.default_rng(0))
    scale = _fit(scores)
    assert scale is not None
    assert scale.irrelevant == pytest.approx(0.05, abs=0.02)
    assert scale.relevant == pytest.approx(0.85, abs=0.03)
    assert scale.scores == len(scores)


def test_a_compressed_judge_maps_to_the_same_common_scores() -> None:
    scores = _judge_scores(np.random.default_rng(1))
    compressed = _cross_encoder(scores)
    as_judge, as_cross_encoder = _fit(scores), _fit(compressed)
    assert as_judge is not None and as_cross_encoder is not None
    common_judge = as_judge.common(scores)
    common_cross_encoder = as_cross_encoder.common(compressed)
    # Between the typical scores the maps agree up to the histogram's resolution; below and
    # above them each map runs to its source's 0 and 1, which the compression moved.
    between = (scores >= as_judge.irrelevant) & (scores <= as_judge.relevant)
    np.testing.assert_allclose(common_cross_encoder[between], common_judge[between], atol=0.03)
    np.testing.assert_allclose(common_cross_encoder, common_judge, atol=0.1)
    # Unmapped, a 0.5 threshold would find nothing relevant on the compressed scale.
    assert np.mean(compressed >= 0.5) == 0.0
    relevant_share = np.mean(as_cross_encoder.common(compressed) >= 0.5)
    assert relevant_share == pytest.approx(np.mean(scores >= 0.5), abs=0.01)


def test_the_map_keeps_a_sources_order_and_the_unit_interval() -> None:
    scale = ScoreScale(0.02, 0.2, 100)
    raw = np.sort(np.random.default_rng(2).random(500))
    mapped = scale.common(raw)
    assert np.all(np.diff(mapped) > 0)
    assert mapped.min() >= 0.0 and mapped.max() <= 1.0
    assert scale.common(np.array([0.02, 0.11, 0.2])) == pytest.approx(
        [COMMON_IRRELEVANT, 0.5, COMMON_RELEVANT]
    )


@pytest.mark.parametrize(
    "scores",
    [
        np.full(30, 0.9),  # too few
        np.full(500, 0.3),  # one value
        np.clip(np.random.default_rng(3).normal(0.3, 0.004, 500), 0, 1),  # one cluster's noise
    ],
    ids=["too-few", "constant", "one-cluster"],
)
def test_scores_without_two_clusters_fit_no_scale(scores: np.ndarray) -> None:
    assert _fit(scores) is None


def test_one_outlier_does_not_make_a_cluster() -> None:
    scores = np.concatenate([np.full(400, 0.05), [0.95]])
    assert _fit(scores) is None


def test_a_refit_keeps_a_scale_that_barely_moved_and_replaces_one_that_moved() -> None:
    rng = np.random.default_rng(4)
    scores = _judge_scores(rng)
    fitted = _fit(scores)
    assert fitted is not None
    current = {"judge": fitted, "reranker": ScoreScale(0.3, 0.6, 50)}
    histograms = {
        "judge": histogram(scores),
        "reranker": histogram(_cross_encoder(_judge_scores(rng))),
        "new": histogram(np.full(10, 0.5)),  # too few to fit: stays unmapped
    }
    scales = refit_scales(current, histograms)
    assert scales["judge"] is current["judge"]
    assert scales["reranker"] is not current["reranker"]
    assert scales["reranker"].relevant == pytest.approx(0.01 + 0.22 * 0.85, abs=0.02)
    assert "new" not in scales
