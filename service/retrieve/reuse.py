"""Query families (issue #14): a query that repeats an earlier one of its namespace reuses the
observations recorded for it, so a repeated information need is not scored twice. Pure, no I/O.

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


def unobserved_anchors(n_candidates: int, reused: Reused, sampled: np.ndarray) -> np.ndarray:
    """Map anchors sampled among the candidates not covered by ``reused`` (positions into that
    shorter, still most-similar-first list) back to candidate positions."""
    remaining: np.ndarray = np.setdiff1d(
        np.arange(n_candidates, dtype=np.int64), reused.positions
    )
    anchors: np.ndarray = remaining[sampled]
    return anchors
