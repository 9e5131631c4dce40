"""One score scale for observations from different sources (docs/design.md "One score scale").
Pure numpy, no I/O.

Every source answers in [0, 1], each on its own scale: an LLM judge near 0 or 1, a logprob
P(yes), a cross-encoder whose relevant pairs score 0.1–0.3. The model, its thresholds (an
anchor's find) and its running mean need one scale, and a namespace whose scorer changes must
not learn the new scorer's numbers as if they were the old one's. So each source's scale is
learned from its own scores in the namespace: they are split in two clusters at the cut that
maximises the between-cluster variance (Otsu's rule; the anchors are mostly irrelevant pairs
and some relevant ones), and the clusters' means are the source's typical irrelevant and
relevant scores. The map to the common scale is piecewise linear and increasing through
(0, 0), (typical irrelevant, 0.1), (typical relevant, 0.9) and (1, 1): every source's typical
irrelevant score lands at 0.1, its typical relevant one at 0.9, their midpoint at 0.5, which
is what the thresholds compare with. The order of one source's scores is kept, and scaling a
source (the same judge, compressed) moves none of its mapped scores between the two typical
ones. Client feedback is on the common scale by definition (1: needed, 0: irrelevant).

Why by hand: the maps that need labels (isotonic, Platt) have none here, and a two-cluster
split of a histogram is twenty lines of numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Where a source's typical irrelevant and relevant scores land on the common scale.
COMMON_IRRELEVANT = 0.1
COMMON_RELEVANT = 0.9
#: The histogram a source's scale is fitted from: this many equal bins over [0, 1].
HISTOGRAM_BINS = 200
#: Fewer scores than this leave a source on the identity scale (a query or two of anchors).
MIN_SCORES = 40
#: Each cluster holds at least this share of the scores (and 3 of them), so one outlier does
#: not make a cluster.
MIN_CLUSTER_SHARE = 0.02
#: Typical relevant and irrelevant closer than this are one cluster's noise, not two.
MIN_SPREAD = 0.02
#: A refit rewrites a source's stored scores only when a typical score moved by more than
#: this share of their distance (stored scores are rewritten, so not for every wobble).
MOVE_TOLERANCE = 0.02


@dataclass(frozen=True)
class ScoreScale:
    """A source's typical irrelevant and relevant score, and how many scores say so."""

    irrelevant: float
    relevant: float
    scores: int = 0

    def common(self, raw: NDArray[np.float64]) -> NDArray[np.float64]:
        """``raw`` scores of the source on the common scale."""
        if (self.irrelevant, self.relevant) == (COMMON_IRRELEVANT, COMMON_RELEVANT):
            # Exactly as given: interpolating would move a score by a rounding error, so a
            # live answer would differ in its last digit from the same score read back.
            return np.array(raw, dtype=np.float64)
        knots = [(self.irrelevant, COMMON_IRRELEVANT), (self.relevant, COMMON_RELEVANT)]
        if self.irrelevant > 0.0:
            knots.insert(0, (0.0, 0.0))
        if self.relevant < 1.0:
            knots.append((1.0, 1.0))
        xs, ys = zip(*knots, strict=True)
        mapped: NDArray[np.float64] = np.interp(np.asarray(raw, dtype=np.float64), xs, ys)
        return mapped

    def moved_from(self, earlier: ScoreScale | None) -> bool:
        """Whether this scale differs from ``earlier`` by more than :data:`MOVE_TOLERANCE`."""
        if earlier is None:
            return True
        tolerance = MOVE_TOLERANCE * (self.relevant - self.irrelevant)
        return (
            abs(self.irrelevant - earlier.irrelevant) > tolerance
            or abs(self.relevant - earlier.relevant) > tolerance
        )

    def as_json(self) -> list[float | int]:
        return [self.irrelevant, self.relevant, self.scores]

    @classmethod
    def from_json(cls, value: list[float | int]) -> ScoreScale:
        irrelevant, relevant, scores = value
        return cls(float(irrelevant), float(relevant), int(scores))


#: The scale of a source not fitted yet: its scores taken as they are.
IDENTITY = ScoreScale(COMMON_IRRELEVANT, COMMON_RELEVANT)


def score_bins(raw: NDArray[np.float64]) -> NDArray[np.int64]:
    """The histogram bin of each score (0 … HISTOGRAM_BINS - 1), as SQL ``width_bucket`` over
    [0, 1] numbers them from 1 (a score of 1 goes to the last bin)."""
    index = np.floor(np.asarray(raw, dtype=np.float64) * HISTOGRAM_BINS).astype(np.int64)
    bins: NDArray[np.int64] = np.clip(index, 0, HISTOGRAM_BINS - 1)
    return bins


def fit_scale(counts: NDArray[np.int64], sums: NDArray[np.float64]) -> ScoreScale | None:
    """A source's scale from the histogram of its scores (``counts`` and ``sums`` of the
    scores per bin, bins ascending); None when the scores do not show two clusters: too few,
    a cluster too small, or the two typical scores too close."""
    counts = np.asarray(counts, dtype=np.float64)
    sums = np.asarray(sums, dtype=np.float64)
    total = counts.sum()
    if total < MIN_SCORES:
        return None
    # The cut after bin i: everything up to it is the irrelevant cluster.
    below_n, below_sum = np.cumsum(counts)[:-1], np.cumsum(sums)[:-1]
    above_n, above_sum = total - below_n, sums.sum() - below_sum
    least = max(3.0, MIN_CLUSTER_SHARE * total)
    valid = (below_n >= least) & (above_n >= least) & (counts[:-1] > 0)
    if not np.any(valid):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        below_mean = below_sum / below_n
        above_mean = above_sum / above_n
        between = below_n * above_n * (above_mean - below_mean) ** 2
    cut = int(np.argmax(np.where(valid, between, -np.inf)))
    irrelevant, relevant = float(below_mean[cut]), float(above_mean[cut])
    if relevant - irrelevant < MIN_SPREAD:
        return None
    return ScoreScale(irrelevant, relevant, int(total))


def histogram(raw: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The (counts, sums) per bin of ``raw`` scores, as the refit's query computes them."""
    bins = score_bins(raw)
    counts = np.bincount(bins, minlength=HISTOGRAM_BINS).astype(np.int64)
    sums: NDArray[np.float64] = np.bincount(
        bins, weights=np.asarray(raw, dtype=np.float64), minlength=HISTOGRAM_BINS
    ).astype(np.float64)
    return counts, sums


def refit_scales(
    current: dict[str, ScoreScale],
    histograms: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]],
) -> dict[str, ScoreScale]:
    """The scales after a refit: each source's fitted from its ``histograms`` where they show
    two clusters and moved, else the ``current`` one kept."""
    scales = dict(current)
    for source, (counts, sums) in histograms.items():
        fitted = fit_scale(counts, sums)
        if fitted is not None and fitted.moved_from(current.get(source)):
            scales[source] = fitted
    return scales
