"""Causal completion of one query from a batch of history: the definition the online path matches.

DESIGN §3: estimates for query t use only observations of queries < t plus the anchors of t. The
service reaches the same thing incrementally (a stored model plus a fold-in); this function states
it in one place, from raw observations, for replays, benchmarks and tests.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion.model import (
    BiasedALS,
    ModelFitError,
    _count,
    _indices,
    fold_in_query,
    predict_scores,
)

__all__ = ["causal_estimates"]


def causal_estimates(
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    scores: ArrayLike,
    n_memories: int,
    t: int,
    anchor_rows: ArrayLike,
    anchor_scores: ArrayLike,
    als: BiasedALS,
) -> NDArray[np.float64]:
    """ŝ(t, m) for every memory m, using only the past and query t's own anchors.

    The history (COO triplets over all queries) is filtered to queries < t *here*, so observations
    of query t itself or of later queries can be present in the arrays without leaking into the
    estimates. The model over queries 0..t-1 is fitted with ``als``; query t's (c_t, v_t) is then
    folded in from ``anchor_rows``/``anchor_scores`` with the memory side fixed.
    Returns an array of shape (n_memories,), clipped to [0, 1].
    """
    n_m = _count("n_memories", n_memories)
    t_ = _count("t", t)
    m_all, q_all, s_all = np.asarray(memory_idx), np.asarray(query_idx), np.asarray(scores)
    # Check the shapes before filtering, so a length mismatch is reported rather than masked.
    if not (m_all.shape == q_all.shape == s_all.shape) or q_all.ndim != 1:
        raise ModelFitError(
            f"memory_idx, query_idx and scores must be 1-D of equal length, got shapes "
            f"{m_all.shape}, {q_all.shape}, {s_all.shape}"
        )
    past = q_all < t_  # the causal cut: everything from query t on is invisible from here
    model = als.fit(m_all[past], q_all[past], s_all[past], n_memories=n_m, n_queries=t_)
    rows = _indices("anchor_rows", anchor_rows, n_m, "n_memories")
    c_t, v_t = fold_in_query(
        model.mu,
        model.memory_bias[rows],
        model.memory_factors[rows],
        anchor_scores,
        als.reg,
    )
    return predict_scores(model.mu, model.memory_bias, model.memory_factors, c_t, v_t)
