"""Completion core: bias-aware low-rank model of the memory x query relevance matrix (DESIGN §3).

Pure numpy; no I/O. The dense reference solver lives in ``service.completion.reference`` and is
for tests only.
"""

from service.completion.causal import causal_estimates
from service.completion.model import (
    BiasedALS,
    FactorModel,
    ModelFitError,
    SimilarityCalibration,
    calibrate_similarity,
    fold_in_query,
    leave_one_out_predictions,
    objective,
    predict_scores,
    solve_rows_batch,
    solve_side,
)

__all__ = [
    "BiasedALS",
    "FactorModel",
    "ModelFitError",
    "SimilarityCalibration",
    "calibrate_similarity",
    "causal_estimates",
    "fold_in_query",
    "leave_one_out_predictions",
    "objective",
    "predict_scores",
    "solve_rows_batch",
    "solve_side",
]
