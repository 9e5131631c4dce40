"""The plain bias-aware low-rank model and its ALS: the reference the service's model reduces to.

    ŝ(q, m) = μ + b_m + c_q + u_m · v_q        clipped to [0, 1]

μ is the plain mean of the observed scores (not regularised); the biases and factors minimise

    Σ_observed (s − μ − b_m − c_q − u_m·v_q)²  +  reg · (Σ b_m² + Σ c_q² + Σ ‖u_m‖² + Σ ‖v_q‖²)

by alternating least squares, each half-step the exact ridge minimiser of its block
(:mod:`service.completion.ridge`), so the objective never increases. The service runs
:mod:`service.completion.model`, which adds a per-query similarity slope and a content prior and
is exactly this model when every similarity is 0 and there are no embeddings. This one is kept
as a reference for tests: :class:`BiasedALS` is what the dense solver of
tests/unit/completion/reference_dense.py checks the batched ridge solves against, and
:func:`causal_estimates` states causal completion from raw observations
(docs/design.md "Causal completion and online learning").

Pure numpy, seeded, no I/O; bad input raises
:class:`~service.completion.validation.ModelFitError`.
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion._grouped import group_rows, solve_groups
from service.completion.ridge import INIT_SCALE, predict_scores, solve_side
from service.completion.validation import (
    ModelFitError,
    coo_cells,
    finite_scalar,
    index_array,
    non_negative_int,
    side_arrays,
)

__all__ = ["BiasedALS", "FactorModel", "causal_estimates", "fold_in_query", "objective"]

logger = logging.getLogger(__name__)


# eq=False: element-wise array comparison makes a generated __eq__/__hash__ raise; models compare
# by identity, and tests compare their arrays explicitly.
@dataclass(frozen=True, eq=False, repr=False)
class FactorModel:
    """Fitted completion model. Rows are memories, columns are queries, both by dense index.

    Rows/columns without observations carry bias 0 and zero factors, so their estimate is μ plus
    the other side's bias. Arrays are coerced to float64 and validated on construction (a model
    rebuilt from storage with a NaN or a wrong shape fails here, not at prediction time). Treat
    the arrays as read-only: derive a new model (e.g. :meth:`resized`) instead of mutating one.
    """

    mu: float
    memory_bias: NDArray[np.float64]
    memory_factors: NDArray[np.float64]
    query_bias: NDArray[np.float64]
    query_factors: NDArray[np.float64]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", finite_scalar("mu", self.mu))
        mb, mf = side_arrays("memory_bias", self.memory_bias, "memory_factors", self.memory_factors)
        qb, qf = side_arrays("query_bias", self.query_bias, "query_factors", self.query_factors)
        if mf.shape[1] != qf.shape[1]:
            raise ModelFitError(
                f"memory_factors has rank {mf.shape[1]} but query_factors has rank {qf.shape[1]}"
            )
        object.__setattr__(self, "memory_bias", mb)
        object.__setattr__(self, "memory_factors", mf)
        object.__setattr__(self, "query_bias", qb)
        object.__setattr__(self, "query_factors", qf)

    def __repr__(self) -> str:
        return (
            f"FactorModel(mu={self.mu:.6g}, n_memories={self.n_memories}, "
            f"n_queries={self.n_queries}, rank={self.rank})"
        )

    @property
    def rank(self) -> int:
        return int(self.memory_factors.shape[1])

    @property
    def n_memories(self) -> int:
        return int(self.memory_bias.shape[0])

    @property
    def n_queries(self) -> int:
        return int(self.query_bias.shape[0])

    def predict(self, memory_rows: ArrayLike, query_col: int) -> NDArray[np.float64]:
        """ŝ(query_col, m) for each m in ``memory_rows``, clipped to [0, 1]."""
        rows = index_array("memory_rows", memory_rows, self.n_memories, "n_memories")
        q = non_negative_int("query_col", query_col)
        if q >= self.n_queries:
            raise ModelFitError(f"query_col = {q} is out of range for n_queries={self.n_queries}")
        return predict_scores(
            self.mu,
            self.memory_bias[rows],
            self.memory_factors[rows],
            float(self.query_bias[q]),
            self.query_factors[q],
        )

    def resized(self, n_memories: int, n_queries: int) -> FactorModel:
        """The same model grown to more rows/columns; new ones have no history (bias 0, zero
        factors). Lets a caller that appended memories or queries keep using (or warm-starting
        from) an older fit. Shrinking is refused: rows are persistent ids, never dropped."""
        n_m = non_negative_int("n_memories", n_memories)
        n_q = non_negative_int("n_queries", n_queries)
        if n_m < self.n_memories or n_q < self.n_queries:
            raise ModelFitError(
                f"cannot shrink a ({self.n_memories}, {self.n_queries}) model to ({n_m}, {n_q})"
            )
        r = self.rank
        return FactorModel(
            mu=self.mu,
            memory_bias=np.concatenate([self.memory_bias, np.zeros(n_m - self.n_memories)]),
            memory_factors=np.vstack([self.memory_factors, np.zeros((n_m - self.n_memories, r))]),
            query_bias=np.concatenate([self.query_bias, np.zeros(n_q - self.n_queries)]),
            query_factors=np.vstack([self.query_factors, np.zeros((n_q - self.n_queries, r))]),
        )


def fold_in_query(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
) -> tuple[float, NDArray[np.float64]]:
    """Causal fold-in: a new query's (c_q, v_q) from its scored anchors, the memory side fixed.

    The memory side comes from a model fitted on earlier queries only, so the result depends on
    nothing but the past and this query's own anchors. Exactly :func:`solve_side`; named for the
    call site. No anchors give (0.0, zeros(r)), i.e. the estimate falls back to μ + b_m.
    """
    return solve_side(mu, anchor_memory_bias, anchor_memory_factors, anchor_scores, reg)


def objective(
    model: FactorModel,
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    scores: ArrayLike,
    reg: float,
) -> float:
    """The regularised squared loss ALS minimises (unclipped predictions; μ is not penalised).

    For tests and diagnostics: it must not increase from one ALS half-step to the next.
    """
    lam = finite_scalar("reg", reg)
    if lam < 0.0:
        raise ModelFitError(f"reg must be >= 0, got {lam}")
    m, q, s = coo_cells(memory_idx, query_idx, scores, model.n_memories, model.n_queries)
    raw = (
        model.mu
        + model.memory_bias[m]
        + model.query_bias[q]
        + np.einsum("ij,ij->i", model.memory_factors[m], model.query_factors[q])
    )
    penalty = (
        np.sum(model.memory_bias**2)
        + np.sum(model.query_bias**2)
        + np.sum(model.memory_factors**2)
        + np.sum(model.query_factors**2)
    )
    return float(np.sum((s - raw) ** 2) + lam * penalty)


def _hyperparameter_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class BiasedALS:
    """Alternating least squares for :class:`FactorModel`.

    Hyperparameters only; :meth:`fit` returns a new model and keeps no state, so one instance can
    serve concurrent fits. Each iteration re-solves every memory row (query side fixed), then every
    query column (memory side fixed). ``rank = 0`` is allowed and gives the bias-only baseline
    μ + b_m + c_q.
    """

    def __init__(
        self, rank: int = 8, reg: float = 1.0, n_iterations: int = 10, seed: int = 0
    ) -> None:
        # Bad hyperparameters are a programming/configuration error, hence plain ValueError.
        self.rank = _hyperparameter_int("rank", rank, minimum=0)
        # At least one pass: it is what zeroes the rows/columns that have no observations.
        self.n_iterations = _hyperparameter_int("n_iterations", n_iterations, minimum=1)
        self.seed = _hyperparameter_int("seed", seed, minimum=0)
        if isinstance(reg, bool) or not isinstance(reg, numbers.Real) or not 0 < reg < np.inf:
            raise ValueError(f"reg must be a finite number > 0, got {reg!r}")
        # Annotated: numbers.Real is not in float's typeshed MRO, so mypy deems this line
        # unreachable after the isinstance check and would not infer the attribute's type.
        self.reg: float = float(reg)

    def __repr__(self) -> str:
        return (
            f"BiasedALS(rank={self.rank}, reg={self.reg}, "
            f"n_iterations={self.n_iterations}, seed={self.seed})"
        )

    def initial_model(
        self,
        n_memories: int,
        n_queries: int,
        mu: float = 0.0,
        init: FactorModel | None = None,
    ) -> FactorModel:
        """The starting point of :meth:`fit` (exposed so tests and diagnostics can replay it).

        Cold start: biases 0; memory then query factors drawn as ``INIT_SCALE *
        default_rng(seed).standard_normal(...)``. Warm start from ``init`` (same rank, at most as
        many rows/columns): its biases are kept, and its factor vectors are kept where they are
        non-zero. Zero factor vectors (rows unobserved at the time, or rows beyond ``init``'s size)
        take the seeded random values instead, because zero factors are a fixed point of ALS that
        would pin those rows to the bias-only solution forever.
        """
        n_m = non_negative_int("n_memories", n_memories)
        n_q = non_negative_int("n_queries", n_queries)
        rng = np.random.default_rng(self.seed)
        memory_factors = INIT_SCALE * rng.standard_normal((n_m, self.rank))
        query_factors = INIT_SCALE * rng.standard_normal((n_q, self.rank))
        memory_bias = np.zeros(n_m)
        query_bias = np.zeros(n_q)
        if init is not None:
            if init.rank != self.rank:
                raise ModelFitError(f"init has rank {init.rank} but the model has rank {self.rank}")
            if init.n_memories > n_m or init.n_queries > n_q:
                raise ModelFitError(
                    f"init has shape ({init.n_memories}, {init.n_queries}), larger than the "
                    f"data's ({n_m}, {n_q})"
                )
            for bias, factors, old_bias, old_factors in (
                (memory_bias, memory_factors, init.memory_bias, init.memory_factors),
                (query_bias, query_factors, init.query_bias, init.query_factors),
            ):
                n_old = old_bias.shape[0]
                bias[:n_old] = old_bias
                keep = np.any(old_factors != 0.0, axis=1)
                factors[:n_old][keep] = old_factors[keep]
        return FactorModel(
            mu=finite_scalar("mu", mu),
            memory_bias=memory_bias,
            memory_factors=memory_factors,
            query_bias=query_bias,
            query_factors=query_factors,
        )

    def fit(
        self,
        memory_idx: ArrayLike,
        query_idx: ArrayLike,
        scores: ArrayLike,
        n_memories: int,
        n_queries: int,
        init: FactorModel | None = None,
    ) -> FactorModel:
        """Full refit by ALS over the observed cells, given as COO triplets.

        μ is the mean of ``scores`` (0.0 when there are none: the empty history gives the all-zero
        model). Rows/columns without observations end with bias 0 and zero factors. Repeated
        (memory, query) pairs count as separate observations. Raises :class:`ModelFitError` on
        NaN/inf, scores outside [0, 1], out-of-range indices or mismatched lengths.
        """
        n_m = non_negative_int("n_memories", n_memories)
        n_q = non_negative_int("n_queries", n_queries)
        m, q, s = coo_cells(memory_idx, query_idx, scores, n_m, n_q)
        mu = float(s.mean()) if s.size else 0.0
        start = self.initial_model(n_m, n_q, mu=mu, init=init)
        centred = s - mu
        # The cell grouping is the same for every iteration: build it once per side.
        by_memory = group_rows(m, q, centred, n_m, n_q)
        by_query = group_rows(q, m, centred, n_q, n_m)
        query_bias, query_factors = start.query_bias, start.query_factors
        memory_bias, memory_factors = start.memory_bias, start.memory_factors
        ridge = np.full(self.rank + 1, self.reg)
        for _ in range(self.n_iterations):
            memory_bias, memory_factors = solve_groups(by_memory, query_bias, query_factors, ridge)
            query_bias, query_factors = solve_groups(by_query, memory_bias, memory_factors, ridge)
        logger.debug(
            "ALS fit: %d observations, %d memories, %d queries, %r", s.size, n_m, n_q, self
        )
        return FactorModel(
            mu=mu,
            memory_bias=memory_bias,
            memory_factors=memory_factors,
            query_bias=query_bias,
            query_factors=query_factors,
        )


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
    n_m = non_negative_int("n_memories", n_memories)
    t_ = non_negative_int("t", t)
    m_all, q_all, s_all = np.asarray(memory_idx), np.asarray(query_idx), np.asarray(scores)
    # Check the shapes before filtering, so a length mismatch is reported rather than masked.
    if not (m_all.shape == q_all.shape == s_all.shape) or q_all.ndim != 1:
        raise ModelFitError(
            f"memory_idx, query_idx and scores must be 1-D of equal length, got shapes "
            f"{m_all.shape}, {q_all.shape}, {s_all.shape}"
        )
    past = q_all < t_  # the causal cut: everything from query t on is invisible from here
    model = als.fit(m_all[past], q_all[past], s_all[past], n_memories=n_m, n_queries=t_)
    rows = index_array("anchor_rows", anchor_rows, n_m, "n_memories")
    c_t, v_t = fold_in_query(
        model.mu,
        model.memory_bias[rows],
        model.memory_factors[rows],
        anchor_scores,
        als.reg,
    )
    return predict_scores(model.mu, model.memory_bias, model.memory_factors, c_t, v_t)
