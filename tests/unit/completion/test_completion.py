"""Completion core: fast ALS vs dense reference, known-truth recovery, causality, degenerate input.

Pure numpy, no database. Every random draw comes from a seeded generator, so each test is
deterministic and independent of the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from service.completion import (
    ModelFitError,
    SimilarityCalibration,
    _grouped,
    calibrate_similarity,
)
from service.completion.ridge import (
    leave_one_out_predictions,
    predict_scores,
    solve_rows_batch,
    solve_side,
)
from tests.unit.completion.reference_als import (
    BiasedALS,
    FactorModel,
    causal_estimates,
    fold_in_query,
    objective,
)
from tests.unit.completion.reference_dense import dense_als, dense_ridge

MODEL_ARRAYS = ("memory_bias", "memory_factors", "query_bias", "query_factors")


def random_cells(
    n_memories: int, n_queries: int, density: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct observed cells at ``density`` with uniform scores (no structure needed)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((n_memories, n_queries)) < density
    memory_idx, query_idx = np.nonzero(mask)
    return memory_idx, query_idx, rng.random(memory_idx.size)


@dataclass(frozen=True)
class LowRankTruth:
    """A fully known score matrix μ + b_m + c_q + u_m·v_q (+ noise), clipped to [0, 1]."""

    scores: np.ndarray  # (n_memories, n_queries), what an oracle scorer would return
    split: np.ndarray  # (n_memories, n_queries) uniform draws that decide which cells are observed


def low_rank_truth(
    n_memories: int, n_queries: int, rank: int, noise: float, seed: int
) -> LowRankTruth:
    rng = np.random.default_rng(seed)
    memory_bias = rng.normal(0.0, 0.08, n_memories)
    query_bias = rng.normal(0.0, 0.08, n_queries)
    # Entries ~N(0, 0.3²): u·v has std ≈ 0.3² · √rank ≈ 0.16 for rank 3, comparable to the biases.
    u = rng.normal(0.0, 0.3, (n_memories, rank))
    v = rng.normal(0.0, 0.3, (n_queries, rank))
    clean = 0.45 + memory_bias[:, None] + query_bias[None, :] + u @ v.T
    scores = np.clip(clean + rng.normal(0.0, noise, clean.shape), 0.0, 1.0)
    return LowRankTruth(scores=scores, split=rng.random(clean.shape))


def rmse_on(model: FactorModel, truth: np.ndarray, cells: np.ndarray) -> float:
    rows, cols = np.nonzero(cells)
    predicted = np.clip(
        model.mu
        + model.memory_bias[rows]
        + model.query_bias[cols]
        + np.einsum("ij,ij->i", model.memory_factors[rows], model.query_factors[cols]),
        0.0,
        1.0,
    )
    return float(np.sqrt(np.mean((predicted - truth[rows, cols]) ** 2)))


def assert_models_close(fast: FactorModel, ref: FactorModel, atol: float = 1e-8) -> None:
    assert fast.mu == pytest.approx(ref.mu, abs=1e-12)
    for name in MODEL_ARRAYS:
        np.testing.assert_allclose(
            getattr(fast, name), getattr(ref, name), rtol=0, atol=atol, err_msg=name
        )


# --------------------------------------------------------------------------------------------
# fast path == dense reference


@pytest.mark.parametrize(
    ("n_memories", "n_queries", "rank", "density", "reg"),
    [(12, 9, 2, 0.4, 1.0), (30, 20, 4, 0.3, 0.3), (25, 40, 6, 0.12, 0.05), (40, 15, 0, 0.3, 1.0)],
)
def test_fast_als_matches_dense_reference(
    n_memories: int, n_queries: int, rank: int, density: float, reg: float
) -> None:
    m, q, s = random_cells(n_memories, n_queries, density, seed=n_memories + rank)
    fast = BiasedALS(rank=rank, reg=reg, n_iterations=7, seed=5).fit(m, q, s, n_memories, n_queries)
    ref = dense_als(
        m, q, s, n_memories, n_queries, BiasedALS(rank=rank, reg=reg, n_iterations=7, seed=5)
    )
    assert_models_close(fast, ref)


def test_fast_als_matches_reference_when_rows_are_split_across_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tiny chunk cap forces many chunks per width and rows wider than the cap (one row a chunk).
    monkeypatch.setattr(_grouped, "CHUNK_CELLS", 5)
    m, q, s = random_cells(20, 30, 0.35, seed=11)
    fast = BiasedALS(rank=3, reg=0.5, n_iterations=5, seed=2).fit(m, q, s, 20, 30)
    ref = dense_als(m, q, s, 20, 30, BiasedALS(rank=3, reg=0.5, n_iterations=5, seed=2))
    assert_models_close(fast, ref)


def test_warm_start_matches_reference_from_the_same_start() -> None:
    m, q, s = random_cells(25, 18, 0.3, seed=21)
    als = BiasedALS(rank=3, reg=0.5, n_iterations=4, seed=9)
    old = als.fit(m[q < 12], q[q < 12], s[q < 12], n_memories=25, n_queries=12)
    start = als.initial_model(25, 18, init=old)
    # Kept: the old fit's non-zero factors. Re-seeded: new query columns 12..17.
    np.testing.assert_array_equal(start.query_factors[:12], old.query_factors)
    assert np.all(start.query_factors[12:] != 0.0)
    fast = als.fit(m, q, s, 25, 18, init=old)
    ref = dense_als(m, q, s, 25, 18, als, start=start)
    assert_models_close(fast, ref)


def test_solve_side_equals_dense_ridge_lstsq() -> None:
    rng = np.random.default_rng(3)
    for n, rank in [(0, 3), (1, 3), (2, 8), (15, 4), (40, 8)]:
        factors = rng.normal(0.0, 0.5, (n, rank))
        bias = rng.normal(0.0, 0.1, n)
        scores = rng.random(n)
        got_bias, got_factor = solve_side(0.4, bias, factors, scores, reg=0.7)
        want_bias, want_factor = dense_ridge(factors, scores - 0.4 - bias, reg=0.7)
        assert got_bias == pytest.approx(want_bias, abs=1e-12)
        np.testing.assert_allclose(got_factor, want_factor, rtol=0, atol=1e-12)


def test_solve_rows_batch_equals_solve_side_row_by_row() -> None:
    rng = np.random.default_rng(4)
    n_rows, n_other, rank = 9, 30, 4
    other_bias = rng.normal(0.0, 0.1, n_other)
    other_factors = rng.normal(0.0, 0.5, (n_other, rank))
    # Row 2 has no cells; row 5 has one; duplicates of a pair are allowed and count twice.
    rows = rng.choice([0, 1, 3, 4, 6, 7, 8], size=120)
    rows[:1] = 5
    other = rng.integers(0, n_other, rows.size)
    scores = rng.random(rows.size)
    bias, factors = solve_rows_batch(
        0.3, rows, other, scores, other_bias, other_factors, reg=0.8, n_rows=n_rows
    )
    for row in range(n_rows):
        cells = rows == row
        want_bias, want_factor = solve_side(
            0.3, other_bias[other[cells]], other_factors[other[cells]], scores[cells], reg=0.8
        )
        assert bias[row] == pytest.approx(want_bias, abs=1e-12)
        np.testing.assert_allclose(factors[row], want_factor, rtol=0, atol=1e-12)
    assert bias[2] == 0.0 and np.all(factors[2] == 0.0)


# --------------------------------------------------------------------------------------------
# the optimisation itself


def test_each_als_iteration_does_not_increase_the_objective() -> None:
    truth = low_rank_truth(60, 40, rank=3, noise=0.02, seed=1)
    m, q = np.nonzero(truth.split < 0.3)
    s = truth.scores[m, q]
    reg = 0.1
    start = BiasedALS(rank=4, reg=reg, seed=0).initial_model(60, 40, mu=float(s.mean()))
    values = [objective(start, m, q, s, reg)]
    # Fits are deterministic, so the fit with k iterations is the k-th step of the longer runs.
    for k in range(1, 9):
        model = BiasedALS(rank=4, reg=reg, n_iterations=k, seed=0).fit(m, q, s, 60, 40)
        values.append(objective(model, m, q, s, reg))
    steps = np.diff(values)
    assert np.all(steps <= 1e-12 * values[0]), values


def test_final_objective_is_below_the_bias_only_model() -> None:
    truth = low_rank_truth(60, 40, rank=3, noise=0.02, seed=2)
    m, q = np.nonzero(truth.split < 0.3)
    s = truth.scores[m, q]
    low_rank = BiasedALS(rank=3, reg=0.1, n_iterations=10).fit(m, q, s, 60, 40)
    bias_only = BiasedALS(rank=0, reg=0.1, n_iterations=50).fit(m, q, s, 60, 40)
    assert objective(low_rank, m, q, s, 0.1) < objective(bias_only, m, q, s, 0.1)


def test_fit_is_reproducible_for_a_seed() -> None:
    m, q, s = random_cells(20, 15, 0.3, seed=8)
    first = BiasedALS(rank=3, seed=4).fit(m, q, s, 20, 15)
    again = BiasedALS(rank=3, seed=4).fit(m, q, s, 20, 15)
    other_seed = BiasedALS(rank=3, seed=5).fit(m, q, s, 20, 15)
    for name in MODEL_ARRAYS:
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    assert not np.allclose(first.memory_factors, other_seed.memory_factors)


def test_unobserved_rows_and_columns_get_zero_bias_and_factors() -> None:
    m, q, s = random_cells(10, 8, 0.5, seed=6)
    keep = (m != 3) & (q != 5)
    model = BiasedALS(rank=3).fit(m[keep], q[keep], s[keep], 10, 8)
    assert model.memory_bias[3] == 0.0 and np.all(model.memory_factors[3] == 0.0)
    assert model.query_bias[5] == 0.0 and np.all(model.query_factors[5] == 0.0)


# --------------------------------------------------------------------------------------------
# known truth: synthetic rank-3 data, error on held-out cells only

SYNTH = low_rank_truth(200, 150, rank=3, noise=0.02, seed=7)
# Never observed at any share: the common held-out set for every comparison below.
HELD_OUT = SYNTH.split >= 0.6


def fit_share(share: float, rank: int) -> FactorModel:
    m, q = np.nonzero(SYNTH.split < share)
    als = BiasedALS(rank=rank, reg=0.1, n_iterations=15, seed=0)
    return als.fit(m, q, SYNTH.scores[m, q], 200, 150)


def test_held_out_error_falls_as_the_observed_share_grows() -> None:
    shares = (0.1, 0.3, 0.6)
    errors = [rmse_on(fit_share(share, rank=3), SYNTH.scores, HELD_OUT) for share in shares]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.05, errors  # near the noise level (0.02) once 60% is observed


def test_low_rank_model_beats_bias_only_on_held_out_cells() -> None:
    low_rank = rmse_on(fit_share(0.3, rank=3), SYNTH.scores, HELD_OUT)
    bias_only = rmse_on(fit_share(0.3, rank=0), SYNTH.scores, HELD_OUT)
    assert low_rank < 0.6 * bias_only, (low_rank, bias_only)


def test_fold_in_beats_memory_bias_alone_for_a_held_out_query() -> None:
    held_queries = np.arange(140, 150)
    observed = SYNTH.split < 0.4
    observed[:, held_queries] = False  # these queries are new: nothing of theirs is in the fit
    m, q = np.nonzero(observed)
    model = BiasedALS(rank=3, reg=0.1, n_iterations=15).fit(m, q, SYNTH.scores[m, q], 200, 150)
    rng = np.random.default_rng(0)
    fold_errors, bias_errors = [], []
    for query in held_queries:
        anchors = rng.choice(200, size=30, replace=False)
        rest = np.setdiff1d(np.arange(200), anchors)
        c_q, v_q = fold_in_query(
            model.mu,
            model.memory_bias[anchors],
            model.memory_factors[anchors],
            SYNTH.scores[anchors, query],
            reg=0.1,
        )
        folded = predict_scores(
            model.mu, model.memory_bias[rest], model.memory_factors[rest], c_q, v_q
        )
        memory_only = np.clip(model.mu + model.memory_bias[rest], 0.0, 1.0)
        truth = SYNTH.scores[rest, query]
        fold_errors.append(np.sqrt(np.mean((folded - truth) ** 2)))
        bias_errors.append(np.sqrt(np.mean((memory_only - truth) ** 2)))
    assert np.mean(fold_errors) < 0.6 * np.mean(bias_errors), (fold_errors, bias_errors)


# --------------------------------------------------------------------------------------------
# causality


def test_causal_estimates_ignore_observations_of_query_t_and_later_queries() -> None:
    m, q, s = random_cells(30, 12, 0.4, seed=12)
    t = 7
    anchors = np.array([0, 4, 9, 17])
    anchor_scores = np.array([0.9, 0.1, 0.5, 0.7])
    als = BiasedALS(rank=3, reg=0.5, n_iterations=6)
    past = q < t
    only_past = causal_estimates(m[past], q[past], s[past], 30, t, anchors, anchor_scores, als)
    everything = causal_estimates(m, q, s, 30, t, anchors, anchor_scores, als)
    altered_future = s.copy()
    altered_future[q >= t] = 1.0 - altered_future[q >= t]
    with_other_future = causal_estimates(m, q, altered_future, 30, t, anchors, anchor_scores, als)
    np.testing.assert_array_equal(everything, only_past)
    np.testing.assert_array_equal(with_other_future, only_past)
    # And it is exactly "fit on the past, fold t in from its anchors, predict".
    model = als.fit(m[past], q[past], s[past], 30, t)
    c_t, v_t = fold_in_query(
        model.mu, model.memory_bias[anchors], model.memory_factors[anchors], anchor_scores, 0.5
    )
    np.testing.assert_array_equal(
        only_past, predict_scores(model.mu, model.memory_bias, model.memory_factors, c_t, v_t)
    )


# --------------------------------------------------------------------------------------------
# degenerate inputs stay finite


def test_fold_in_from_a_single_anchor_is_finite() -> None:
    factors = np.array([[0.2, -0.3, 0.5]])
    c_q, v_q = fold_in_query(0.4, np.array([0.1]), factors, np.array([0.8]), reg=1.0)
    assert np.isfinite(c_q) and np.all(np.isfinite(v_q)) and v_q.shape == (3,)


def test_solve_side_with_zero_factors_is_a_shrunk_bias() -> None:
    bias, factor = solve_side(0.5, np.zeros(4), np.zeros((4, 3)), np.full(4, 0.9), reg=1.0)
    assert bias == pytest.approx(4 * 0.4 / (4 + 1.0))
    np.testing.assert_array_equal(factor, np.zeros(3))


def test_fold_in_without_anchors_falls_back_to_memory_bias() -> None:
    c_q, v_q = fold_in_query(0.4, np.zeros(0), np.zeros((0, 5)), np.zeros(0), reg=1.0)
    assert c_q == 0.0 and np.array_equal(v_q, np.zeros(5))


def test_all_equal_scores_fit_predicts_that_score() -> None:
    m, q, _ = random_cells(15, 10, 0.5, seed=13)
    model = BiasedALS(rank=4).fit(m, q, np.full(m.size, 0.7), 15, 10)
    assert model.mu == pytest.approx(0.7)
    np.testing.assert_allclose(model.predict(np.arange(15), 3), 0.7, atol=1e-9)


def test_empty_history_gives_the_all_zero_model() -> None:
    no_index = np.array([], dtype=int)
    model = BiasedALS(rank=4).fit(no_index, no_index, np.array([]), 6, 3)
    assert model.mu == 0.0
    assert model.memory_factors.shape == (6, 4) and model.query_factors.shape == (3, 4)
    for name in MODEL_ARRAYS:
        assert np.all(getattr(model, name) == 0.0)
    nothing = BiasedALS(rank=4).fit([], [], [], 0, 0)
    assert nothing.n_memories == 0 and nothing.n_queries == 0


def test_single_memory_fit_is_finite() -> None:
    model = BiasedALS(rank=3).fit(np.zeros(5, dtype=int), np.arange(5), np.linspace(0, 1, 5), 1, 5)
    for name in MODEL_ARRAYS:
        assert np.all(np.isfinite(getattr(model, name)))


def test_rank_larger_than_observations_is_finite() -> None:
    m, q, s = np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([0.2, 1.0, 0.0])
    model = BiasedALS(rank=16, reg=0.01).fit(m, q, s, 2, 2)
    for name in MODEL_ARRAYS:
        assert np.all(np.isfinite(getattr(model, name)))
    predicted = model.predict(np.array([0, 1]), 1)
    assert np.all((predicted >= 0.0) & (predicted <= 1.0))


def test_predictions_are_clipped_to_the_unit_interval() -> None:
    model = FactorModel(
        mu=0.5,
        memory_bias=np.array([2.0, -2.0, 0.1]),
        memory_factors=np.zeros((3, 2)),
        query_bias=np.array([0.0]),
        query_factors=np.zeros((1, 2)),
    )
    np.testing.assert_allclose(model.predict(np.array([0, 1, 2]), 0), [1.0, 0.0, 0.6])


def test_resized_model_adds_rows_without_history() -> None:
    m, q, s = random_cells(8, 5, 0.5, seed=14)
    model = BiasedALS(rank=2).fit(m, q, s, 8, 5)
    grown = model.resized(10, 7)
    np.testing.assert_array_equal(grown.memory_factors[:8], model.memory_factors)
    assert np.all(grown.memory_factors[8:] == 0.0) and np.all(grown.query_bias[5:] == 0.0)
    with pytest.raises(ModelFitError):
        model.resized(7, 5)


# --------------------------------------------------------------------------------------------
# similarity calibration (cold memories)


def test_calibration_recovers_a_known_linear_relation() -> None:
    rng = np.random.default_rng(15)
    sims = rng.uniform(0.1, 0.9, 2000)
    scores = np.clip(0.05 + 0.8 * sims + rng.normal(0.0, 0.03, sims.size), 0.0, 1.0)
    calibration = calibrate_similarity(sims, scores)
    assert calibration.slope == pytest.approx(0.8, abs=0.03)
    assert calibration.intercept == pytest.approx(0.05, abs=0.02)


def test_calibration_slope_is_floored_for_anticorrelated_scores() -> None:
    rng = np.random.default_rng(16)
    sims = rng.uniform(0.1, 0.9, 200)
    scores = np.clip(0.9 - 0.7 * sims + rng.normal(0.0, 0.05, sims.size), 0.0, 1.0)
    calibration = calibrate_similarity(sims, scores, min_slope=1e-3)
    assert calibration.slope == 1e-3
    estimates = calibration.estimate(np.sort(sims))
    assert np.all(np.diff(estimates) >= 0.0)  # never reverses the semantic order


def test_calibration_with_few_anchors_shrinks_toward_the_mean_score() -> None:
    calibration = calibrate_similarity(np.array([0.2, 0.8]), np.array([0.0, 1.0]), reg=1.0)
    # cov = 0.15, var = 0.09: least squares gives slope 1.67; the ridge 0.15 / (0.09 + 1/2).
    assert calibration.slope == pytest.approx(0.15 / 0.59)
    assert calibration.estimate(np.array([0.5]))[0] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("sims", "scores"),
    [([], []), ([0.4], [0.9]), ([0.3, 0.3, 0.3], [0.1, 0.5, 0.9])],
    ids=["no-anchors", "one-anchor", "constant-similarity"],
)
def test_calibration_is_finite_for_degenerate_anchors(
    sims: list[float], scores: list[float]
) -> None:
    calibration = calibrate_similarity(np.array(sims), np.array(scores))
    assert np.isfinite(calibration.intercept) and calibration.slope == 1e-3
    estimates = calibration.estimate(np.array([-0.2, 0.0, 0.5, 1.0]))
    assert np.all(np.isfinite(estimates)) and np.all(np.diff(estimates) >= 0.0)
    if scores:  # anchored: the level is the anchors' mean score
        assert calibration.estimate(np.array([np.mean(sims)]))[0] == pytest.approx(np.mean(scores))


def test_calibration_without_anchors_is_documented_zero_intercept() -> None:
    calibration = calibrate_similarity(np.array([]), np.array([]))
    assert calibration == SimilarityCalibration(intercept=0.0, slope=1e-3)


# --------------------------------------------------------------------------------------------
# bad input is refused with ModelFitError


def valid_cells() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.array([0, 1, 2]), np.array([0, 1, 1]), np.array([0.2, 0.5, 0.9])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_fit_rejects_non_finite_scores(bad: float) -> None:
    m, q, s = valid_cells()
    s[1] = bad
    with pytest.raises(ModelFitError, match=r"scores contains a non-finite value at 1"):
        BiasedALS().fit(m, q, s, 3, 2)


@pytest.mark.parametrize("bad", [-0.01, 1.5])
def test_fit_rejects_scores_outside_the_unit_interval(bad: float) -> None:
    m, q, s = valid_cells()
    s[2] = bad
    with pytest.raises(ModelFitError, match=r"scores\[2\]"):
        BiasedALS().fit(m, q, s, 3, 2)


@pytest.mark.parametrize(("memory", "query"), [(3, 0), (-1, 0), (0, 2), (0, -1)])
def test_fit_rejects_out_of_range_indices(memory: int, query: int) -> None:
    m, q, s = valid_cells()
    m[0], q[0] = memory, query
    with pytest.raises(ModelFitError, match=r"out of range"):
        BiasedALS().fit(m, q, s, 3, 2)


def test_fit_rejects_mismatched_lengths() -> None:
    m, q, s = valid_cells()
    with pytest.raises(ModelFitError, match=r"length"):
        BiasedALS().fit(m, q[:2], s, 3, 2)
    with pytest.raises(ModelFitError, match=r"length"):
        BiasedALS().fit(m, q, s[:2], 3, 2)


def test_fit_rejects_float_indices() -> None:
    m, q, s = valid_cells()
    with pytest.raises(ModelFitError, match=r"integer dtype"):
        BiasedALS().fit(m.astype(float), q, s, 3, 2)


def test_fit_rejects_warm_start_of_another_rank() -> None:
    m, q, s = valid_cells()
    init = BiasedALS(rank=2).fit(m, q, s, 3, 2)
    with pytest.raises(ModelFitError, match=r"rank"):
        BiasedALS(rank=3).fit(m, q, s, 3, 2, init=init)


def test_solve_side_rejects_mismatched_shapes_and_bad_reg() -> None:
    with pytest.raises(ModelFitError, match=r"length"):
        solve_side(0.5, np.zeros(3), np.zeros((3, 2)), np.zeros(2), reg=1.0)
    with pytest.raises(ModelFitError, match=r"length"):
        solve_side(0.5, np.zeros(2), np.zeros((3, 2)), np.zeros(3), reg=1.0)
    with pytest.raises(ModelFitError, match=r"reg"):
        solve_side(0.5, np.zeros(3), np.zeros((3, 2)), np.zeros(3), reg=0.0)
    with pytest.raises(ModelFitError, match=r"non-finite"):
        solve_side(0.5, np.zeros(3), np.array([[0.0, np.nan]] * 3), np.zeros(3), reg=1.0)


def test_predict_rejects_out_of_range_rows_and_columns() -> None:
    model = BiasedALS(rank=2).fit(*valid_cells(), 3, 2)
    with pytest.raises(ModelFitError, match=r"memory_rows"):
        model.predict(np.array([0, 3]), 0)
    with pytest.raises(ModelFitError, match=r"query_col"):
        model.predict(np.array([0]), 2)


def test_factor_model_rejects_inconsistent_arrays() -> None:
    with pytest.raises(ModelFitError, match=r"rank"):
        FactorModel(0.5, np.zeros(2), np.zeros((2, 3)), np.zeros(1), np.zeros((1, 2)))
    with pytest.raises(ModelFitError, match=r"length"):
        FactorModel(0.5, np.zeros(3), np.zeros((2, 3)), np.zeros(1), np.zeros((1, 3)))
    with pytest.raises(ModelFitError, match=r"mu"):
        FactorModel(float("nan"), np.zeros(2), np.zeros((2, 3)), np.zeros(1), np.zeros((1, 3)))


def test_calibration_rejects_mismatched_or_non_finite_input() -> None:
    with pytest.raises(ModelFitError, match=r"length"):
        calibrate_similarity(np.array([0.1, 0.2]), np.array([0.5]))
    with pytest.raises(ModelFitError, match=r"non-finite"):
        calibrate_similarity(np.array([0.1, np.nan]), np.array([0.5, 0.5]))


@pytest.mark.parametrize("n_anchors", [1, 3, 12])
def test_leave_one_out_predictions_equal_fold_ins_without_each_anchor(n_anchors: int) -> None:
    rng = np.random.default_rng(n_anchors)
    bias = rng.normal(scale=0.1, size=n_anchors)
    factors = rng.normal(scale=0.3, size=(n_anchors, 3))
    scores = rng.uniform(size=n_anchors)
    loo = leave_one_out_predictions(0.3, bias, factors, scores, 0.5)
    for i in range(n_anchors):
        keep = np.arange(n_anchors) != i
        c, v = fold_in_query(0.3, bias[keep], factors[keep], scores[keep], 0.5)
        expected = predict_scores(0.3, bias[i : i + 1], factors[i : i + 1], c, v)[0]
        assert loo[i] == pytest.approx(expected, abs=1e-10)
