"""The paper's plain model (EARM_COMPLETION_MODEL=plain, set by EARM_PROFILE=paper): the
completion learns nothing from similarity, so a query's slope stays 0 and memories without
history share one estimate, however similar; the paper profile presets it, and explicit
settings still win."""

from __future__ import annotations

import numpy as np

from service.retrieve.rerank import CandidateObservations, CandidateState, rank_candidates
from service.settings import Settings

N = 10
SIMILARITIES = np.linspace(0.9, 0.1, N)
SCORED = np.arange(4)
#: Scores that follow similarity exactly: the full model learns a slope from them.
SCORES = SIMILARITIES[SCORED]


def _estimates(similarity_feature: bool) -> tuple[float, np.ndarray]:
    candidates = CandidateState(
        similarities=SIMILARITIES, memory_bias=np.zeros(N), memory_factors=np.zeros((N, 2)),
        observation_count=np.zeros(N, dtype=np.int64), prior_offsets=np.zeros(N),
        similarity_feature=similarity_feature,
    )
    observed = CandidateObservations(SCORED, SCORES, np.zeros(len(SCORED), dtype=bool))
    ranking = rank_candidates("earm", candidates, observed, 0.3, 1.0)
    assert ranking.query is not None
    return ranking.query.slope, ranking.estimates


def test_the_full_model_learns_a_similarity_slope_from_the_anchors() -> None:
    slope, estimates = _estimates(similarity_feature=True)
    assert slope > 0.1
    assert np.all(np.diff(estimates[len(SCORED):]) < 0)  # less similar, lower estimate


def test_the_plain_model_has_no_slope_and_one_estimate_for_memories_without_history() -> None:
    slope, estimates = _estimates(similarity_feature=False)
    assert slope == 0.0
    unscored = estimates[len(SCORED):]
    np.testing.assert_allclose(unscored, unscored[0])


def test_the_paper_profile_presets_the_papers_settings() -> None:
    paper = Settings(profile="paper", _env_file=None)
    assert (paper.anchor_policy, paper.completion_model) == ("paper", "plain")
    assert (paper.memory_reg, paper.factor_reg, paper.paraphrase_transfer) == (1.0, 1.0, False)
    default = Settings(_env_file=None)
    assert (default.anchor_policy, default.completion_model) == ("learned", "earm")
    assert (default.memory_reg, default.factor_reg) == (1000.0, "off")


def test_an_explicit_setting_overrides_the_profile(monkeypatch) -> None:
    monkeypatch.setenv("EARM_PROFILE", "paper")
    monkeypatch.setenv("EARM_MEMORY_REG", "30")
    settings = Settings(_env_file=None, factor_reg="off")
    assert settings.memory_reg == 30.0 and settings.factor_reg == "off"
    assert settings.completion_model == "plain"
