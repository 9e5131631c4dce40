"""Query families: a query that repeats an earlier one of its namespace reuses the observations
recorded for it, so a repeated information need is not scored twice (docs/design.md "Query
families and paraphrase transfer"). Pure, no I/O.

A family is what was asked: the query text after :func:`normalise_query` (casefolded,
whitespace collapsed, stripped), or, when the client supplies the query vector, that vector
(byte-identical float32 values): the vector then defines the query for search and completion.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


def normalise_query(text: str) -> str:
    """The text two askings of one question share: casefolded, runs of whitespace made one
    space, no leading or trailing whitespace."""
    return " ".join(text.casefold().split())


def family_key(query_text: str, client_vector: np.ndarray | None) -> bytes:
    """The family digest stored on ``queries.family_key`` (16 bytes). Text and vector keys are
    domain-separated, so a text never collides with a vector."""
    digest = hashlib.blake2b(digest_size=16)
    if client_vector is None:
        digest.update(b"text\x1f" + normalise_query(query_text).encode())
    else:
        digest.update(b"vector\x1f" + np.asarray(client_vector, dtype="<f4").tobytes())
    return digest.digest()


@dataclass(frozen=True)
class Reused:
    """The candidates a family's earlier observations cover."""

    positions: np.ndarray  # candidate positions, ascending
    scores: np.ndarray  # their latest observed score

    def __len__(self) -> int:
        return len(self.positions)


NOTHING_REUSED = Reused(np.zeros(0, dtype=np.int64), np.zeros(0))


def reused_candidates(
    candidate_ids: np.ndarray, family_ids: np.ndarray, family_scores: np.ndarray
) -> Reused:
    """The candidates among the family's observed memories (``family_ids``, one score each)."""
    if len(family_ids) == 0:
        return NOTHING_REUSED
    covered = np.isin(candidate_ids, family_ids)
    positions = np.flatnonzero(covered).astype(np.int64)
    score_of = dict(zip(family_ids.tolist(), family_scores.tolist(), strict=True))
    scores = np.array([score_of[int(m)] for m in candidate_ids[positions]], dtype=np.float64)
    return Reused(positions, scores)


#: The exploring anchors avoid a candidate only when its paraphrases' summed weight reaches
#: this: near-copies of the query (one neighbour at cos ≥ τ + 0.7·(1 − τ)) or several close
#: ones. Steering every anchor away from every candidate a neighbour observed cost the plain
#: LoCoMo stream 1.9 points of recall@10, since distinct questions can be that close too; the
#: exploring half alone, above this weight, costs it nothing (docs/benchmarks.md).
STEER_WEIGHT = 0.7


@dataclass(frozen=True)
class NeighbourEvidence:
    """Per candidate, what near-paraphrases of the query observed of it: the summed kernel
    weight of their observations (0: none) and the weighted mean of their scores."""

    weights: np.ndarray  # (n,)
    means: np.ndarray  # (n,), 0 where the weight is 0

    @property
    def steering(self) -> np.ndarray:
        """Positions whose evidence is strong enough to spend no exploring anchor on them."""
        return np.flatnonzero(self.weights >= STEER_WEIGHT).astype(np.int64)

    def blended(self, estimates: np.ndarray, prior: float) -> np.ndarray:
        """``estimates`` with this evidence weighed in: (κ·estimate + Σ w·s) / (κ + Σ w) where
        there is some, κ = ``prior`` (EARM_PARAPHRASE_PRIOR); unchanged elsewhere."""
        blended = estimates.astype(np.float64).copy()
        weighed = self.weights > 0
        blended[weighed] = (
            prior * blended[weighed] + self.weights[weighed] * self.means[weighed]
        ) / (prior + self.weights[weighed])
        return blended


def neighbour_evidence(
    candidate_ids: np.ndarray,
    neighbour_ids: np.ndarray,
    neighbour_similarities: np.ndarray,
    neighbour_scores: np.ndarray,
    min_similarity: float,
) -> NeighbourEvidence:
    """Each observation weighs (cos − τ)/(1 − τ) in [0, 1]: nothing at the threshold τ, fully
    for an identical query vector."""
    weights = np.zeros(len(candidate_ids))
    sums = np.zeros(len(candidate_ids))
    kernel = np.clip((neighbour_similarities - min_similarity) / (1.0 - min_similarity), 0, 1)
    position = {int(m): p for p, m in enumerate(candidate_ids)}
    for memory, weight, score in zip(neighbour_ids, kernel, neighbour_scores, strict=True):
        p = position.get(int(memory))
        if p is not None and weight > 0:
            weights[p] += weight
            sums[p] += weight * score
    means = np.divide(sums, weights, out=np.zeros_like(sums), where=weights > 0)
    return NeighbourEvidence(weights, means)
