"""Completion core: the bias-aware low-rank model of the memory x query relevance matrix
(docs/design.md "The completion model"). Pure numpy; no I/O.

- ``model``: the model the service runs (fit, fold-in, prediction, leave-one-out).
- ``posterior``: what a query's fold-in leaves unknown, each candidate's predictive spread.
- ``prior``: its content prior, the namespace-level term every query and memory shares.
- ``strength``: how strongly the factors are regularised, chosen per namespace by causal error.
- ``statistics``: per-memory sufficient statistics, what the online row update re-solves from.
- ``calibration``: similarity calibrated on a query's anchors (the non-completion policies).
- ``ridge``: the per-row ridge solves both the model and the references are built from.
- ``validation``: the input checks every public function runs its arguments through.

The plain model's ALS and a slow dense solver, the references the tests check this package
against, are tests/unit/completion/reference_als.py and reference_dense.py.
"""

from service.completion.calibration import SimilarityCalibration, calibrate_similarity
from service.completion.model import (
    CompletionModel,
    ContentPrior,
    QueryParameters,
    content_offsets,
    fit_model,
    fold_in,
    leave_one_out,
    predict,
)
from service.completion.posterior import ScorePosterior, score_posterior
from service.completion.validation import ModelFitError

__all__ = [
    "CompletionModel",
    "ContentPrior",
    "ModelFitError",
    "QueryParameters",
    "ScorePosterior",
    "SimilarityCalibration",
    "calibrate_similarity",
    "content_offsets",
    "fit_model",
    "fold_in",
    "leave_one_out",
    "predict",
    "score_posterior",
]
