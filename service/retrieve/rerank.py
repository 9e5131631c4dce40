"""Mixed reranking: observed scores are authoritative, the rest are estimated. Pure numpy.

Runs in a worker thread (it is CPU work); knows nothing of HTTP or the database.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.api.retrieve import Policy
from service.completion import (
    QueryParameters,
    ScorePosterior,
    calibrate_similarity,
    fold_in,
    leave_one_out,
    predict,
    score_posterior,
)
from service.retrieve.reuse import NeighbourEvidence

POLICIES: tuple[Policy, ...] = ("earm", "semantic", "full", "observed")

#: Where a returned score came from (the contract's ``Source``).
OBSERVED, ESTIMATED, SEMANTIC = "observed", "estimated", "semantic"


@dataclass(frozen=True)
class CandidateState:
    """What reranking needs of the candidates, most similar first."""

    similarities: np.ndarray  # (n,)
    memory_bias: np.ndarray  # (n,)
    memory_factors: np.ndarray  # (n, rank)
    observation_count: np.ndarray  # (n,) observations before this query
    # (n,) the namespace's content prior γ·cos + w·e_m per candidate; zeros before the first
    # refit, when the namespace has no prior yet
    prior_offsets: np.ndarray
    # The weight of the factors the namespace's model was fitted with (None: unbalanced):
    # a query folded in against them must be solved with the same one.
    factor_reg: float | None = None
    # Whether the completion reads the similarities (its per-query slope): False under the
    # plain model (EARM_COMPLETION_MODEL=plain), which the refit fitted without them.
    similarity_feature: bool = True

    @property
    def model_similarities(self) -> np.ndarray:
        """The similarities as the completion model reads them (zeros under the plain model,
        which has no similarity slope)."""
        if self.similarity_feature:
            return self.similarities
        return np.zeros_like(self.similarities)


@dataclass(frozen=True)
class Ranking:
    order: np.ndarray  # candidate positions, best first
    scores: np.ndarray  # final score of each candidate position
    # What the policy's model estimates for each candidate position, observed ones included
    # (the completion with this query folded in, the calibrated similarity, or the similarity
    # itself): an unobserved candidate is ranked by it. Kept for the query's trace.
    estimates: np.ndarray
    sources: list[str]  # a Source per candidate position
    query: QueryParameters | None  # this query's solved parameters (None: nothing observed)
    # |estimate - observed| for the observed anchors that had history, each estimated as if
    # it had not been scored (leave-one-out fold-in): the completion's prequential error.
    prequential_errors: np.ndarray
    # Unobserved candidates whose estimate near-paraphrases' observations weighed on.
    paraphrased: int = 0
    # earm with something observed: each candidate's score as the fold-in's posterior predicts
    # it (mean: ``estimates``), what the trust and stop rules weigh.
    posterior: ScorePosterior | None = None


@dataclass(frozen=True)
class Trust:
    """When an unscored candidate outranks a scored one (earm's final ranking): when the
    posterior of its score says it scores higher with ``probability``."""

    probability: float


@dataclass(frozen=True)
class CandidateObservations:
    """The candidates with an observed score for this query: scored by the scorer now, or
    taken from earlier askings of the query (``reused``: no prequential error, the model
    learned them already)."""

    positions: np.ndarray  # candidate positions
    scores: np.ndarray
    reused: np.ndarray  # bool per observation

    def __len__(self) -> int:
        return len(self.positions)


def rank_candidates(
    policy: Policy,
    candidates: CandidateState,
    observed: CandidateObservations,
    mean_score: float,
    reg: float,
    neighbours: NeighbourEvidence | None = None,
    neighbour_prior: float = 1.0,
    trust: Trust | None = None,
) -> Ranking:
    """Final scores for every candidate and their order. ``neighbours`` (earm only): what
    near-paraphrases of the query observed; a candidate's estimate becomes
    (κ·model + Σ w·s) / (κ + Σ w), κ = ``neighbour_prior``. With ``trust`` (earm only) an
    unobserved candidate outranks an observed one only when its posterior gives it the trust
    probability of scoring higher (:func:`_trusted_order`); its ``score`` stays its estimate.

    - observed cells keep their score (every policy);
    - ``earm``: every unobserved memory gets the completion estimate from the model fitted on
      earlier queries with this query folded in from its anchors; for a memory without history
      that estimate is its similarity calibrated on this query's anchors (source "semantic")
      unless the namespace has learned a content prior, which then adds what the judge's
      scores of similar memories taught it (source "estimated"); for a memory with history it
      adds what the memory side learned (source "estimated");
    - ``observed`` / ``full``: unobserved memories get the calibrated similarity only;
    - ``semantic``, or nothing observed: the cosine similarity itself.
    """
    n = len(candidates.similarities)
    estimate = _Estimate(
        candidates.similarities.astype(np.float64).copy(), [SEMANTIC] * n, None, np.zeros(0),
        np.zeros(n, dtype=bool),
    )
    if len(observed):
        estimate = _estimate_unobserved(
            policy, candidates, observed, mean_score, reg, neighbours, neighbour_prior
        )
    scores, sources, paraphrased = estimate.scores, estimate.sources, estimate.paraphrased
    estimates = scores.copy()
    if len(observed):
        scores[observed.positions] = observed.scores
        paraphrased[observed.positions] = False
        for position in observed.positions:
            sources[position] = OBSERVED

    # Ties (e.g. equal observed scores) keep the semantic order: the candidates arrive most
    # similar first and the sort is stable.
    posterior = None if estimate.sd is None else ScorePosterior(estimates, estimate.sd)
    if trust is not None and posterior is not None:
        order = _trusted_order(scores, observed.positions, posterior, trust)
    else:
        order = np.argsort(-scores, kind="stable")
    return Ranking(
        order, scores, estimates, sources, estimate.query, estimate.prequential_errors,
        int(np.count_nonzero(paraphrased)), posterior,
    )


def _trusted_order(
    scores: np.ndarray, observed: np.ndarray, posterior: ScorePosterior, trust: Trust
) -> np.ndarray:
    """Observed candidates rank by their score (authoritative), an unobserved one by the score
    it beats with the trust probability (its posterior's lower bound): it outranks an observed
    candidate only when the posterior gives it that probability of scoring higher. Why not
    the estimate itself: an unscored candidate's estimate is a conditional mean, close to the
    query's mean score, while an observed score is one noisy draw; compared directly, nearly
    every unscored candidate outranked every observed one whose noise happened to be low, an
    order set by the noise (it pushed the scorer's missed relevant candidates out of the top 20
    on the LoCoMo dev stream). Ties keep the semantic order (stable sort)."""
    keys = posterior.quantile(1.0 - trust.probability)
    keys[observed] = scores[observed]
    order: np.ndarray = np.argsort(-keys, kind="stable")
    return order


@dataclass(frozen=True)
class _Estimate:
    """What a policy estimates of the candidates before the observed ones take their scores."""

    scores: np.ndarray
    sources: list[str]
    query: QueryParameters | None
    prequential_errors: np.ndarray
    paraphrased: np.ndarray  # bool: near-paraphrases' observations weighed on the estimate
    sd: np.ndarray | None = None  # earm: the posterior's predictive sd of each candidate


def _estimate_unobserved(
    policy: Policy,
    candidates: CandidateState,
    observed: CandidateObservations,
    mean_score: float,
    reg: float,
    neighbours: NeighbourEvidence | None,
    neighbour_prior: float,
) -> _Estimate:
    """Every policy that observed something solves the query's parameters, so the model learns
    from all traffic, not only from earm requests; only earm ranks by the completion."""
    n = len(candidates.similarities)
    sources = [SEMANTIC] * n
    paraphrased = np.zeros(n, dtype=bool)
    # The content prior is a known offset per cell, like the memory bias it sits beside.
    memory_offsets = candidates.memory_bias + candidates.prior_offsets
    query, prequential_errors = _fold_in_query(
        candidates, memory_offsets, observed, mean_score, reg
    )
    if policy != "earm":
        calibration = calibrate_similarity(
            candidates.similarities[observed.positions], observed.scores
        )
        scores = calibration.estimate(candidates.similarities)
        return _Estimate(scores, sources, query, prequential_errors, paraphrased)
    similarities = candidates.model_similarities
    scores = predict(mean_score, memory_offsets, candidates.memory_factors, similarities, query)
    positions = observed.positions
    posterior = score_posterior(
        mean_score,
        (memory_offsets[positions], candidates.memory_factors[positions],
         similarities[positions]),
        observed.scores,
        query,
        (memory_offsets, candidates.memory_factors, similarities),
        reg,
        candidates.factor_reg,
    )
    learned = (candidates.observation_count > 0) | (candidates.prior_offsets != 0)
    if neighbours is not None:
        paraphrased = neighbours.weights > 0
        scores = neighbours.blended(scores, neighbour_prior)
        learned |= paraphrased
    for position in np.flatnonzero(learned):
        sources[position] = ESTIMATED
    return _Estimate(scores, sources, query, prequential_errors, paraphrased, posterior.sd)


def _fold_in_query(
    candidates: CandidateState,
    memory_offsets: np.ndarray,
    observed: CandidateObservations,
    mean_score: float,
    reg: float,
) -> tuple[QueryParameters, np.ndarray]:
    """This query's parameters solved from its observed cells, and the prequential errors of
    the fresh ones (scored for this query, not reused) that had history."""
    positions = observed.positions
    anchors = (
        mean_score,
        memory_offsets[positions],
        candidates.memory_factors[positions],
        candidates.model_similarities[positions],
        observed.scores,
        reg,
    )
    query = fold_in(*anchors, factor_reg=candidates.factor_reg)
    prequential_errors = np.zeros(0)
    measured = (candidates.observation_count[positions] > 0) & ~observed.reused
    if np.any(measured):
        left_out = leave_one_out(*anchors, factor_reg=candidates.factor_reg)
        prequential_errors = np.abs(left_out - observed.scores)[measured]
    return query, prequential_errors
