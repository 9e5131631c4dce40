"""The completion model: a bias-aware low-rank fit of the sparse memory x query score matrix.

    ŝ(q, m) = μ + b_m + c_q + u_m · v_q        clipped to [0, 1]

μ is the plain mean of the observed scores (not regularised); the biases and factors minimise

    Σ_observed (s − μ − b_m − c_q − u_m·v_q)²  +  reg · (Σ b_m² + Σ c_q² + Σ ‖u_m‖² + Σ ‖v_q‖²)

by alternating least squares. With one side fixed, the objective splits into independent ridge
problems, one per row of the other side, over that row's observed cells only: design matrix
[1, other_factors], target score − μ − other_bias, an (r+1)x(r+1) system. Each half-step is the
exact minimiser of its block, so the objective never increases. The same solve, with the memory
side fixed, folds in a new query from its anchors ("causal" completion, DESIGN §3).

Everything here is pure numpy: no I/O, no database, no global random state. Bad input raises
:class:`ModelFitError` (a ``ValueError``) with a message naming the offending argument.

Over 400 lines on purpose: the input checks, the model, its ridge solves and ALS are one
algorithm read top to bottom, and issue #13 keeps ``completion/`` unchanged (a leaf).
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.completion._grouped import group_rows, solve_groups

__all__ = [
    "BiasedALS",
    "FactorModel",
    "ModelFitError",
    "SimilarityCalibration",
    "calibrate_similarity",
    "fold_in_query",
    "leave_one_out_predictions",
    "objective",
    "predict_scores",
    "solve_rows_batch",
    "solve_side",
]

logger = logging.getLogger(__name__)

#: Standard deviation of the seeded initial factors. Small, so the first half-step is driven by
#: the biases, but non-zero: all-zero factors are a fixed point of ALS (the bias-only solution).
INIT_SCALE = 0.1


class ModelFitError(ValueError):
    """Input the completion core cannot use: NaN/inf, scores outside [0, 1], index out of range,
    mismatched shapes, or a non-positive regularisation weight."""

    code = "model_fit_error"


# --------------------------------------------------------------------------------------------
# validation helpers: every public function funnels its arguments through these, so a bad value
# fails loudly at the boundary instead of surfacing as NaN estimates three calls later.


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise ModelFitError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _finite_scalar(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ModelFitError(f"{name} must be a real number, got {value!r}")
    result = float(value)
    if not np.isfinite(result):
        raise ModelFitError(f"{name} must be finite, got {result}")
    return result


def _positive_reg(reg: object) -> float:
    value = _finite_scalar("reg", reg)
    # reg > 0 is what makes every (r+1)x(r+1) system positive definite, hence solvable even for
    # a row with a single observation or all-zero factors.
    if value <= 0.0:
        raise ModelFitError(f"reg must be > 0, got {value}")
    return value


def _first_bad(mask: NDArray[np.bool_]) -> int:
    return int(np.flatnonzero(mask)[0])


def _float_array(name: str, values: ArrayLike, ndim: int) -> NDArray[np.float64]:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ModelFitError(f"{name} must be numeric: {exc}") from exc
    if array.ndim != ndim:
        raise ModelFitError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0]
        where = int(bad[0]) if ndim == 1 else tuple(int(b) for b in bad)
        raise ModelFitError(f"{name} contains a non-finite value at {where}")
    return array


def _length(name: str, array: NDArray[np.generic], expected: int, other: str) -> None:
    if array.shape[0] != expected:
        raise ModelFitError(f"{name} has length {array.shape[0]} but {other} has length {expected}")


def _scores(name: str, values: ArrayLike) -> NDArray[np.float64]:
    scores = _float_array(name, values, ndim=1)
    outside = (scores < 0.0) | (scores > 1.0)
    if np.any(outside):
        i = _first_bad(outside)
        raise ModelFitError(f"{name}[{i}] = {scores[i]} is outside [0, 1]")
    return scores


def _indices(name: str, values: ArrayLike, bound: int, bound_name: str) -> NDArray[np.intp]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ModelFitError(f"{name} must be 1-D, got shape {array.shape}")
    # An empty list arrives as float64; anything non-empty must really be integers (a float index
    # usually means columns were swapped by the caller).
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ModelFitError(f"{name} must have an integer dtype, got {array.dtype}")
    array = array.astype(np.intp, copy=False)
    outside = (array < 0) | (array >= bound)
    if np.any(outside):
        i = _first_bad(outside)
        raise ModelFitError(f"{name}[{i}] = {array[i]} is out of range for {bound_name}={bound}")
    return array


def _cells(
    memory_idx: ArrayLike,
    query_idx: ArrayLike,
    scores: ArrayLike,
    n_memories: int,
    n_queries: int,
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.float64]]:
    """Validate COO triplets (memory row, query column, score)."""
    s = _scores("scores", scores)
    m = _indices("memory_idx", memory_idx, n_memories, "n_memories")
    q = _indices("query_idx", query_idx, n_queries, "n_queries")
    _length("memory_idx", m, s.shape[0], "scores")
    _length("query_idx", q, s.shape[0], "scores")
    return m, q, s


def _side(
    bias_name: str,
    bias: ArrayLike,
    factors_name: str,
    factors: ArrayLike,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate one side's (bias (n,), factors (n, r)) pair."""
    f = _float_array(factors_name, factors, ndim=2)
    b = _float_array(bias_name, bias, ndim=1)
    _length(bias_name, b, f.shape[0], factors_name)
    return b, f


# --------------------------------------------------------------------------------------------
# the model


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
        object.__setattr__(self, "mu", _finite_scalar("mu", self.mu))
        mb, mf = _side("memory_bias", self.memory_bias, "memory_factors", self.memory_factors)
        qb, qf = _side("query_bias", self.query_bias, "query_factors", self.query_factors)
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
        rows = _indices("memory_rows", memory_rows, self.n_memories, "n_memories")
        q = _count("query_col", query_col)
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
        n_m = _count("n_memories", n_memories)
        n_q = _count("n_queries", n_queries)
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


def predict_scores(
    mu: float,
    memory_bias: ArrayLike,
    memory_factors: ArrayLike,
    query_bias: float,
    query_factor: ArrayLike,
) -> NDArray[np.float64]:
    """ŝ = μ + b_m + c_q + u_m·v_q for many memories and one query, clipped to [0, 1].

    Clipping is part of the model (scores live in [0, 1]); the fit itself uses unclipped values.
    """
    b = np.asarray(memory_bias, dtype=np.float64)
    u = np.asarray(memory_factors, dtype=np.float64)
    v = np.asarray(query_factor, dtype=np.float64)
    if u.ndim != 2 or b.ndim != 1 or v.ndim != 1:
        raise ModelFitError(
            "expected memory_bias (n,), memory_factors (n, r), query_factor (r,); got "
            f"{b.shape}, {u.shape}, {v.shape}"
        )
    _length("memory_bias", b, u.shape[0], "memory_factors")
    if v.shape[0] != u.shape[1]:
        raise ModelFitError(
            f"query_factor has rank {v.shape[0]} but memory_factors has rank {u.shape[1]}"
        )
    raw = _finite_scalar("mu", mu) + _finite_scalar("query_bias", query_bias) + b + u @ v
    if not np.all(np.isfinite(raw)):
        position = _first_bad(~np.isfinite(raw))
        raise ModelFitError(f"non-finite prediction for memory position {position}")
    return np.clip(raw, 0.0, 1.0)


def solve_side(
    mu: float,
    other_bias: ArrayLike,
    other_factors: ArrayLike,
    scores: ArrayLike,
    reg: float,
) -> tuple[float, NDArray[np.float64]]:
    """Ridge solve of one row's (bias, factor) from its observed cells, the other side fixed.

    Minimises Σ_i (scores_i − μ − other_bias_i − [1, other_factors_i]·θ)² + reg·‖θ‖² over
    θ = (bias, factor) via the (r+1)x(r+1) normal equations. ``reg > 0`` keeps the system positive
    definite, so one observation, all-equal scores or all-zero factors still give a finite,
    unique answer; no observations give (0.0, zeros(r)). Serves both sides of the ALS and the
    fold-in of a new query.
    """
    mu_ = _finite_scalar("mu", mu)
    lam = _positive_reg(reg)
    b, f = _side("other_bias", other_bias, "other_factors", other_factors)
    s = _scores("scores", scores)
    _length("scores", s, f.shape[0], "other_factors")
    n, rank = f.shape
    if n == 0:
        return 0.0, np.zeros(rank)
    design = np.empty((n, rank + 1))
    design[:, 0] = 1.0
    design[:, 1:] = f
    target = s - mu_ - b
    theta = np.linalg.solve(design.T @ design + lam * np.eye(rank + 1), design.T @ target)
    # astype copies (not a view of theta) and states the dtype numpy's stubs lose in
    # linalg.solve (typed floating[Any]; float64 in, float64 out).
    return float(theta[0]), theta[1:].astype(np.float64)


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


def leave_one_out_predictions(
    mu: float,
    anchor_memory_bias: ArrayLike,
    anchor_memory_factors: ArrayLike,
    anchor_scores: ArrayLike,
    reg: float,
) -> NDArray[np.float64]:
    """For each anchor, ŝ predicted by a fold-in from the *other* anchors, clipped to [0, 1].

    This is the prequential check of the completion model: each observed score is compared with
    what the model would have estimated had that cell not been scored. Closed form for ridge:
    with hat matrix H = X (XᵀX + λI)⁻¹ Xᵀ, the left-out residual is eᵢ / (1 − Hᵢᵢ), so all n
    predictions cost one (r+1)x(r+1) solve instead of n.
    """
    mu_ = _finite_scalar("mu", mu)
    lam = _positive_reg(reg)
    b, f = _side("anchor_memory_bias", anchor_memory_bias, "anchor_memory_factors", anchor_memory_factors)
    s = _scores("anchor_scores", anchor_scores)
    _length("anchor_scores", s, f.shape[0], "anchor_memory_factors")
    n, rank = f.shape
    if n == 0:
        return np.zeros(0)
    design = np.empty((n, rank + 1))
    design[:, 0] = 1.0
    design[:, 1:] = f
    target = s - mu_ - b
    gram_inverse = np.linalg.inv(design.T @ design + lam * np.eye(rank + 1))
    leverage: NDArray[np.float64] = np.einsum("ij,jk,ik->i", design, gram_inverse, design)
    residual = target - design @ (gram_inverse @ (design.T @ target))
    # λ > 0 keeps every leverage strictly below 1.
    left_out_residual = residual / (1.0 - leverage)
    return np.clip(s - left_out_residual, 0.0, 1.0)


def solve_rows_batch(
    mu: float,
    row_idx: ArrayLike,
    other_idx: ArrayLike,
    scores: ArrayLike,
    other_bias: ArrayLike,
    other_factors: ArrayLike,
    reg: float,
    n_rows: int | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """:func:`solve_side` for many rows at once, vectorised (the ALS half-step).

    Cells are COO pairs (row_idx[i], other_idx[i]) with score scores[i]; ``other_idx`` indexes
    ``other_bias``/``other_factors``. Returns (bias (n_rows,), factors (n_rows, r)); rows with
    no cells get (0, zeros). ``n_rows`` defaults to max(row_idx) + 1. For an online update of the
    rows a query touched, pass those rows' full observation history with compact row ids
    (``np.unique(rows, return_inverse=True)``) and copy the results back.
    Repeated (row, other) pairs are separate observations (each adds its own squared error).
    """
    mu_ = _finite_scalar("mu", mu)
    lam = _positive_reg(reg)
    b, f = _side("other_bias", other_bias, "other_factors", other_factors)
    s = _scores("scores", scores)
    rows_raw = np.asarray(row_idx)
    if n_rows is None:
        n = int(rows_raw.max()) + 1 if rows_raw.size else 0
    else:
        n = _count("n_rows", n_rows)
    rows = _indices("row_idx", rows_raw, max(n, 0), "n_rows")
    other = _indices("other_idx", other_idx, f.shape[0], "len(other_factors)")
    _length("row_idx", rows, s.shape[0], "scores")
    _length("other_idx", other, s.shape[0], "scores")
    groups = group_rows(rows, other, s - mu_, n, f.shape[0])
    return solve_groups(groups, b, f, lam)


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
    lam = _finite_scalar("reg", reg)
    if lam < 0.0:
        raise ModelFitError(f"reg must be >= 0, got {lam}")
    m, q, s = _cells(memory_idx, query_idx, scores, model.n_memories, model.n_queries)
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
        n_m = _count("n_memories", n_memories)
        n_q = _count("n_queries", n_queries)
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
            mu=_finite_scalar("mu", mu),
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
        n_m = _count("n_memories", n_memories)
        n_q = _count("n_queries", n_queries)
        m, q, s = _cells(memory_idx, query_idx, scores, n_m, n_q)
        mu = float(s.mean()) if s.size else 0.0
        start = self.initial_model(n_m, n_q, mu=mu, init=init)
        centred = s - mu
        # The cell grouping is the same for every iteration: build it once per side.
        by_memory = group_rows(m, q, centred, n_m, n_q)
        by_query = group_rows(q, m, centred, n_q, n_m)
        query_bias, query_factors = start.query_bias, start.query_factors
        memory_bias, memory_factors = start.memory_bias, start.memory_factors
        for _ in range(self.n_iterations):
            memory_bias, memory_factors = solve_groups(
                by_memory, query_bias, query_factors, self.reg
            )
            query_bias, query_factors = solve_groups(
                by_query, memory_bias, memory_factors, self.reg
            )
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


# --------------------------------------------------------------------------------------------
# cold start: memories with no history


@dataclass(frozen=True)
class SimilarityCalibration:
    """score ≈ intercept + slope · similarity, fitted per query on its anchors.

    Gives memories without history (cold rows) an estimate on the same scale as observed and
    completed scores. ``slope`` is never below the ``min_slope`` it was fitted with (> 0 by
    default), so the estimate preserves the semantic order, except for ties where it is clipped.
    """

    intercept: float
    slope: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "intercept", _finite_scalar("intercept", self.intercept))
        object.__setattr__(self, "slope", _finite_scalar("slope", self.slope))

    def estimate(self, similarities: ArrayLike) -> NDArray[np.float64]:
        """Calibrated scores for ``similarities``, clipped to [0, 1]."""
        sims = _float_array("similarities", similarities, ndim=1)
        return np.clip(self.intercept + self.slope * sims, 0.0, 1.0)


def calibrate_similarity(
    similarities: ArrayLike,
    scores: ArrayLike,
    reg: float = 1.0,
    min_slope: float = 1e-3,
) -> SimilarityCalibration:
    """Ridge fit of score ≈ intercept + slope · similarity over one query's anchors.

    Only the slope is penalised: minimising Σ(s − a − β·x)² + reg·β² gives
    β = cov(x, s) / (var(x) + reg / n) and a = mean(s) − β·mean(x), so with few anchors the slope
    shrinks toward 0 (the estimate toward the anchors' mean score) and with many it is the plain
    least-squares slope. β is then floored at ``min_slope``: a negative slope (noise, or a query
    whose relevant memories happen to be less similar) would rank cold memories in reverse
    semantic order, which is never a better bet than the embedding's own order.

    Degenerate inputs, all finite: one anchor or constant similarities give slope ``min_slope``
    through the anchors' mean; no anchors give intercept 0 and slope ``min_slope``, i.e.
    estimates ≈ 0 that only keep the semantic order (no evidence for any level).
    """
    sims = _float_array("similarities", similarities, ndim=1)
    s = _scores("scores", scores)
    _length("similarities", sims, s.shape[0], "scores")
    lam = _finite_scalar("reg", reg)
    floor = _finite_scalar("min_slope", min_slope)
    if lam < 0.0:
        raise ModelFitError(f"reg must be >= 0, got {lam}")
    if floor < 0.0:
        raise ModelFitError(f"min_slope must be >= 0, got {floor}")
    n = sims.shape[0]
    if n == 0:
        return SimilarityCalibration(intercept=0.0, slope=floor)
    sim_mean = float(sims.mean())
    score_mean = float(s.mean())
    centred = sims - sim_mean
    var = float(np.mean(centred**2))
    cov = float(np.mean(centred * (s - score_mean)))
    denom = var + lam / n
    slope = cov / denom if denom > 0.0 else 0.0  # reg = 0 with constant similarities: no slope info
    slope = max(slope, floor)
    return SimilarityCalibration(intercept=score_mean - slope * sim_mean, slope=slope)
