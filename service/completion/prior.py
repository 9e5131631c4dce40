"""The content prior of the completion model, p(q, m) = γ·cos(q, m) + w·e_m: a namespace-level
term shared by every query and memory, a known per-cell offset to everything per-query or
per-memory (:mod:`service.completion.model` says why it is there). Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["ContentPrior", "content_gram", "content_offsets", "solve_content_prior"]


@dataclass(frozen=True, eq=False)
class ContentPrior:
    """The namespace-level term γ·cos(q, m) + w·e_m, a known per-cell offset to everything
    per-query or per-memory. ``weights`` is empty before the first refit (no prior)."""

    slope: float
    weights: NDArray[np.float64]  # (d,) or (0,)

    @classmethod
    def empty(cls) -> ContentPrior:
        return cls(0.0, np.zeros(0))

    def offsets(self, similarities: ArrayLike, content_scores: ArrayLike) -> NDArray[np.float64]:
        return content_offsets(self.slope, similarities, content_scores)


def content_offsets(
    slope: float, similarities: ArrayLike, content_scores: ArrayLike
) -> NDArray[np.float64]:
    """p(q, m) = γ·cos(q, m) + e_m·w per cell, from each cell's cosine and its memory's e_m·w
    (``content_scores``, computed where the embeddings are, e.g. in SQL)."""
    return slope * np.asarray(similarities, dtype=np.float64) + np.asarray(
        content_scores, dtype=np.float64
    )


def solve_content_prior(
    memory_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    residuals: NDArray[np.float64],
    inverse_factor: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64],
) -> ContentPrior:
    """Ridge solve of (γ, w) against per-cell residuals, given the inverse Cholesky factor of
    the normal matrix (:func:`content_gram`; it does not change across ALS iterations)."""
    n_m = memory_embeddings.shape[0]
    rhs = np.concatenate(
        [[similarities @ residuals], memory_embeddings.T @ np.bincount(memory_idx, residuals, n_m)]
    )
    theta = inverse_factor.T @ (inverse_factor @ rhs)
    return ContentPrior(float(theta[0]), theta[1:])


def content_gram(
    memory_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64],
    slope_reg: float,
    content_reg: float,
) -> NDArray[np.float64]:
    """The inverse of the lower Cholesky factor of the ridge normal matrix of the features
    [cos, e_m] over all cells, built per memory (Σ_cells e_m e_mᵀ = Eᵀ diag(n_m) E), never per
    cell. Inverted once per fit: each ALS iteration's solve is two matrix-vector products."""
    n_m, d = memory_embeddings.shape
    counts = np.bincount(memory_idx, minlength=n_m).astype(np.float64)
    gram = np.empty((d + 1, d + 1))
    gram[0, 0] = similarities @ similarities + slope_reg
    gram[0, 1:] = gram[1:, 0] = memory_embeddings.T @ np.bincount(memory_idx, similarities, n_m)
    gram[1:, 1:] = (memory_embeddings.T * counts) @ memory_embeddings + content_reg * np.eye(d)
    # copy=False only states the dtype numpy's stubs lose in linalg (float64 in, float64 out).
    return np.linalg.inv(np.linalg.cholesky(gram)).astype(np.float64, copy=False)
