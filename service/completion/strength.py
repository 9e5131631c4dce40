"""How strongly the completion's factors are regularised, chosen per namespace from its own causal
error rather than fixed.

A memory's bias is held near the content prior by a large weight (``memory_reg``): a few noisy
observations must not move it. Penalising its factors u_m as hard, against a light weight on the
query factors v_q, acts on the product u_m·v_q like a trace norm of 2·√(memory_reg·reg) (63 at
1000 and 1): every factor fits to zero, and the model is a ridge regression on the embedding plus
a calibrated similarity, whatever interaction the scores hold. Weighting both factor sides alike
(``factor_reg``) lets interaction be learned, but how strong it is differs between namespaces and
judges, and where there is none the factors fit noise. So each refit tries a few weights on the
namespace's own history, causally: fitted on its older queries, each later query is folded in
from its observed cells and every cell is predicted from the others (leave-one-out: the
prequential error the service reports). The weight with the smallest error wins; ``None``, the
unbalanced weights (no interaction), is always a candidate, so a namespace without interaction
keeps the model it had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from service.completion.model import fit_model, leave_one_out

__all__ = ["FACTOR_REG_GRID", "FitOptions", "StrengthChoice", "choose_factor_reg"]

#: The candidates, None first (the unbalanced weights: factors shrunk to nothing), so it wins
#: ties.
FACTOR_REG_GRID: tuple[float | None, ...] = (None, 3.0, 1.0, 0.3)
#: Below this many queries a namespace keeps the unbalanced weights (too little to judge by).
MIN_QUERIES = 20
#: The share of the window's latest queries held out (at least :data:`MIN_HELD_OUT`).
HELD_OUT_SHARE = 0.2
MIN_HELD_OUT = 5
#: The trial fits read the latest queries up to this many cells: a bound on what choosing adds
#: to a refit of a large namespace.
MAX_CELLS = 100_000


@dataclass(frozen=True)
class StrengthChoice:
    """The chosen weight, and each candidate's mean absolute held-out error (empty when the
    namespace was too young to choose)."""

    factor_reg: float | None
    errors: dict[float | None, float] = field(default_factory=dict)
    held_out_cells: int = 0


@dataclass(frozen=True)
class FitOptions:
    """The refit's own settings, which the trial fits share."""

    rank: int
    reg: float
    memory_reg: float
    content_reg: float
    n_iterations: int


@dataclass(frozen=True)
class _Window:
    """The cells of the trial: the older queries' to fit, the later ones' to predict."""

    fit: NDArray[np.bool_]
    held_out: NDArray[np.bool_]


def choose_factor_reg(
    memory_idx: NDArray[np.intp],
    query_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    scores: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64] | None,
    *,
    options: FitOptions,
    grid: tuple[float | None, ...] = FACTOR_REG_GRID,
) -> StrengthChoice:
    """The factor weight of the namespace whose cells these are (``query_idx`` in the order the
    queries were asked; ``memory_embeddings`` None: a model without content prior)."""
    window = _window(query_idx)
    if window is None:
        return StrengthChoice(None)
    errors = {
        candidate: _held_out_error(
            memory_idx, query_idx, similarities, scores, memory_embeddings,
            window, options, candidate,
        )
        for candidate in grid
    }
    best = min(grid, key=lambda candidate: errors[candidate])  # min keeps the first of ties
    return StrengthChoice(best, errors, int(window.held_out.sum()))


def _window(query_idx: NDArray[np.intp]) -> _Window | None:
    n_queries = int(query_idx.max()) + 1 if query_idx.size else 0
    if n_queries < MIN_QUERIES:
        return None
    cells_per_query = np.bincount(query_idx, minlength=n_queries)
    # The latest queries whose cells fit in MAX_CELLS (at least MIN_QUERIES of them).
    from_latest = np.cumsum(cells_per_query[::-1])
    in_window = max(MIN_QUERIES, int(np.searchsorted(from_latest, MAX_CELLS, side="right")))
    first = n_queries - min(in_window, n_queries)
    held_out_from = n_queries - max(MIN_HELD_OUT, round(HELD_OUT_SHARE * (n_queries - first)))
    return _Window(
        fit=(query_idx >= first) & (query_idx < held_out_from),
        held_out=query_idx >= held_out_from,
    )


def _held_out_error(
    memory_idx: NDArray[np.intp],
    query_idx: NDArray[np.intp],
    similarities: NDArray[np.float64],
    scores: NDArray[np.float64],
    memory_embeddings: NDArray[np.float64] | None,
    window: _Window,
    options: FitOptions,
    factor_reg: float | None,
) -> float:
    """Mean |leave-one-out estimate − score| over the held-out cells, the memory side fitted on
    the older queries with ``factor_reg``."""
    fit = window.fit
    n_memories = (
        int(memory_idx.max()) + 1 if memory_embeddings is None else memory_embeddings.shape[0]
    )
    model = fit_model(
        memory_idx[fit], query_idx[fit], similarities[fit], scores[fit],
        n_memories, int(query_idx.max()) + 1,
        rank=options.rank, reg=options.reg, n_iterations=options.n_iterations,
        memory_embeddings=memory_embeddings, content_reg=options.content_reg,
        memory_reg=options.memory_reg, factor_reg=factor_reg,
    )
    content_scores = (
        memory_embeddings @ model.prior.weights
        if memory_embeddings is not None and len(model.prior.weights)
        else np.zeros(n_memories)
    )
    errors: list[NDArray[np.float64]] = []
    held = np.flatnonzero(window.held_out)
    held = held[np.argsort(query_idx[held], kind="stable")]  # each query's cells together
    for cells in np.split(held, np.flatnonzero(np.diff(query_idx[held])) + 1):
        m, sims = memory_idx[cells], similarities[cells]
        estimates = leave_one_out(
            model.mu, model.memory_bias[m] + model.prior.offsets(sims, content_scores[m]),
            model.memory_factors[m], sims, scores[cells], options.reg, factor_reg,
        )
        errors.append(np.abs(estimates - scores[cells]))
    return float(np.mean(np.concatenate(errors)))
