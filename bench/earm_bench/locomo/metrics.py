"""Pure metric functions of the LoCoMo replay (no I/O, no service).

A replayed question becomes a :class:`QueryRecord`: its evidence turns, the external ids the
service returned in relevance-rank order with the source of each score, and the accounting the
service reported (stage, budget, scorer calls, timings). Everything else here aggregates records.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from earm_bench.common.stats import percentile

#: Score sources the service reports per returned memory.
SOURCES = ("observed", "estimated", "semantic")


@dataclass(frozen=True)
class QueryRecord:
    """One replayed question and what ``POST /retrieve`` answered."""

    sample_id: str
    qa_index: int
    query_index: int  # per-namespace index t reported by the service
    category: int
    evidence: tuple[str, ...]
    ranked: tuple[str, ...]  # external ids, rank 1 first (top-b: all its B candidates)
    sources: tuple[str, ...] = ()  # score source per ranked item
    text: str = ""  # the query text sent (on --repeat, a rephrasing of the question's)
    stage: int = 0
    budget: int = 0
    scorer_calls: int = 0
    reused: int = 0  # cells taken from earlier askings of the same question
    scorer_requests: int = 0
    degraded: bool = False
    total_ms: float = 0.0
    score_ms: float = 0.0
    client_ms: float = 0.0
    # mean |estimate - observed| of this query's anchors with history, predicted before it
    # learned from them (the trace's value; earm only, None where the query has none)
    prequential_error: float | None = None
    # --repeat: 0 is the plain stream; rounds 1..R re-ask the questions "verbatim" or
    # "rephrased" (the plain stream's kind is "plain")
    round: int = 0
    kind: str = "plain"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def has_evidence(self) -> bool:
        """Whether recall is defined for this question."""
        return bool(self.evidence)


def recall_at_k(ranked: Sequence[str], evidence: Collection[str], k: int) -> float | None:
    """Share of the evidence turns found in the top ``k``; None if there is no evidence."""
    wanted = set(evidence)
    if not wanted:
        return None
    top = set(ranked[:k])
    return len(wanted & top) / len(wanted)


def hit_at_k(ranked: Sequence[str], evidence: Collection[str], k: int) -> float | None:
    """1.0 if any evidence turn is in the top ``k``, else 0.0; None if there is no evidence."""
    wanted = set(evidence)
    if not wanted:
        return None
    return 1.0 if wanted & set(ranked[:k]) else 0.0


def estimated_share_at_k(records: Iterable[QueryRecord], k: int) -> float | None:
    """Share of all top-``k`` items (pooled over records) whose score was estimated by the
    completion model."""
    total = 0
    estimated = 0
    for rec in records:
        top = rec.sources[:k]
        total += len(top)
        estimated += top.count("estimated")
    return estimated / total if total else None


def source_shares_at_k(records: Iterable[QueryRecord], k: int) -> dict[str, float]:
    """Share of each score source among the pooled top-``k`` items."""
    counts = {s: 0 for s in SOURCES}
    total = 0
    for rec in records:
        for s in rec.sources[:k]:
            counts[s] = counts.get(s, 0) + 1
            total += 1
    return {s: (c / total if total else 0.0) for s, c in counts.items()}


def mean(values: Iterable[float]) -> float | None:
    """Arithmetic mean, or None for no values."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing rolling mean; the first points average over what is available."""
    if window < 1:
        raise ValueError("window must be >= 1")
    out: list[float] = []
    acc = 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def quality(records: Sequence[QueryRecord], ks: Sequence[int]) -> dict[str, Any]:
    """recall@K and hit@K (means over records with evidence) for each K, plus ``n``/``skipped``."""
    scored = [r for r in records if r.has_evidence]
    out: dict[str, Any] = {}
    for k in ks:
        out[f"recall@{k}"] = mean(_defined(recall_at_k(r.ranked, r.evidence, k) for r in scored))
        out[f"hit@{k}"] = mean(_defined(hit_at_k(r.ranked, r.evidence, k) for r in scored))
    out["n"] = len(scored)
    out["skipped"] = len(records) - len(scored)
    return out


def _defined(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def group(
    records: Iterable[QueryRecord], key: Callable[[QueryRecord], Any]
) -> dict[Any, list[QueryRecord]]:
    """Records grouped by ``key``, groups in first-seen order."""
    out: dict[Any, list[QueryRecord]] = {}
    for rec in records:
        out.setdefault(key(rec), []).append(rec)
    return out


def latency(records: Sequence[QueryRecord]) -> dict[str, float | None]:
    """p50/p95 of the service's total time, of total minus scorer time, and of client time."""
    total = [r.total_ms for r in records]
    excl = [max(0.0, r.total_ms - r.score_ms) for r in records]
    client = [r.client_ms for r in records]
    return {
        "p50": percentile(total, 50),
        "p95": percentile(total, 95),
        "p50_excl_scorer": percentile(excl, 50),
        "p95_excl_scorer": percentile(excl, 95),
        "p50_client": percentile(client, 50),
        "p95_client": percentile(client, 95),
    }


def summarize_policy(
    records: Sequence[QueryRecord], ks: Sequence[int], categories: Sequence[int] = (1, 2, 3, 4)
) -> dict[str, Any]:
    """The RESULTS.json entry of one policy (without ``calls_vs_full``) from its records.

    Quality metrics cover records of ``categories``; scorer calls, budgets, latency and the
    degraded count cover every record given.
    """
    main = [r for r in records if r.category in categories]
    out: dict[str, Any] = quality(main, ks)
    out["queries"] = len(records)
    out["scorer_calls"] = int(sum(r.scorer_calls for r in records))
    out["scorer_requests"] = int(sum(r.scorer_requests for r in records))
    out["budget_total"] = int(sum(r.budget for r in records))
    for k in ks:
        out[f"estimated_share@{k}"] = estimated_share_at_k(main, k)
    out[f"sources@{max(ks)}"] = source_shares_at_k(main, max(ks))
    out["by_category"] = {
        str(cat): quality(recs, ks)
        for cat, recs in sorted(group(main, lambda r: r.category).items())
    }
    by_stage: dict[str, Any] = {}
    for stage, recs in sorted(group(main, lambda r: r.stage).items()):
        entry = quality(recs, ks)
        entry["budget_mean"] = mean(r.budget for r in recs)
        entry["scorer_calls"] = int(sum(r.scorer_calls for r in recs))
        entry["first_query_index"] = min(r.query_index for r in recs)
        by_stage[str(stage)] = entry
    out["by_stage"] = by_stage
    out["latency_ms"] = latency(records)
    out["degraded"] = sum(1 for r in records if r.degraded)
    out["prequential_error"] = prequential_error(records)
    return out


def prequential_error(records: Iterable[QueryRecord]) -> float | None:
    """The mean of the queries' prequential errors (None: no query has one)."""
    return mean(r.prequential_error for r in records if r.prequential_error is not None)


def repeat_rounds(records: Sequence[QueryRecord], ks: Sequence[int]) -> dict[str, Any]:
    """Per round of a ``--repeat`` replay, and per kind of asking within it: quality, scorer
    calls and reused cells (categories as given: the caller filters)."""
    out: dict[str, Any] = {}
    for round_, in_round in sorted(group(records, lambda r: r.round).items()):
        out[str(round_)] = {
            kind: quality(recs, ks)
            | {
                "scorer_calls": int(sum(r.scorer_calls for r in recs)),
                "reused": int(sum(r.reused for r in recs)),
            }
            for kind, recs in sorted(group(in_round, lambda r: r.kind).items())
        }
    return out


def behind_exact_cache(records: Sequence[QueryRecord]) -> list[QueryRecord]:
    """The records of a stateless reranker behind an exact-match score cache of (query text,
    memory) pairs, one cache per conversation (its namespace): the judge scores a pair the same
    every time, so rankings and recall stay as they are, and an asking pays only for the pairs
    no earlier asking of the same text scored (those taken from the cache count as reused).
    ``ranked`` must hold every candidate an asking scored (top-b's records do)."""
    scored: dict[str, set[tuple[str, str]]] = {}
    out: list[QueryRecord] = []
    for rec in records:
        cache = scored.setdefault(rec.sample_id, set())
        pairs = {(rec.text, memory) for memory in rec.ranked}
        hits = len(pairs & cache)
        cache |= pairs
        out.append(replace(rec, scorer_calls=rec.scorer_calls - hits, reused=hits))
    return out


def _diff(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) - float(b)
    return None


def difference(
    minuend: Mapping[str, Any], subtrahend: Mapping[str, Any], ks: Sequence[int]
) -> dict[str, Any]:
    """``minuend − subtrahend`` on recall@K/hit@K, overall and per category, and on scorer
    calls."""
    names = [f"{m}@{k}" for k in ks for m in ("recall", "hit")]
    out: dict[str, Any] = {n: _diff(minuend.get(n), subtrahend.get(n)) for n in names}
    out["scorer_calls"] = _calls_diff(minuend, subtrahend)
    cats_a = minuend.get("by_category", {})
    cats_b = subtrahend.get("by_category", {})
    out["by_category"] = {
        cat: {n: _diff(cats_a[cat].get(n), cats_b[cat].get(n)) for n in names}
        for cat in cats_a
        if cat in cats_b
    }
    return out


def _calls_diff(minuend: Mapping[str, Any], subtrahend: Mapping[str, Any]) -> int | None:
    a, b = minuend.get("scorer_calls"), subtrahend.get("scorer_calls")
    return int(a) - int(b) if isinstance(a, int) and isinstance(b, int) else None


#: Derived rows as in the paper, and earm against what a user would run instead (top-b):
#: (name, minuend policy, subtrahend policy).
DERIVED_ROWS: tuple[tuple[str, str, str], ...] = (
    ("observed_minus_semantic", "observed", "semantic"),
    ("earm_minus_observed", "earm", "observed"),
    ("earm_minus_semantic", "earm", "semantic"),
    ("earm_minus_top-b", "earm", "top-b"),
    ("full_minus_earm", "full", "earm"),
)


def derived(policies: Mapping[str, Mapping[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """The derived difference rows for which both policies were run."""
    return {
        name: difference(policies[a], policies[b], ks)
        for name, a, b in DERIVED_ROWS
        if a in policies and b in policies
    }


def repeat_differences(
    rounds_a: Mapping[str, Any], rounds_b: Mapping[str, Any], ks: Sequence[int]
) -> dict[str, Any]:
    """``a − b`` on recall@K and scorer calls, per round and kind of two :func:`repeat_rounds`
    tables."""
    out: dict[str, Any] = {}
    for round_, kinds in rounds_a.items():
        for kind, a in kinds.items():
            b = rounds_b.get(round_, {}).get(kind)
            if b is not None:
                out.setdefault(round_, {})[kind] = {
                    f"recall@{k}": _diff(a.get(f"recall@{k}"), b.get(f"recall@{k}")) for k in ks
                } | {"scorer_calls": _calls_diff(a, b)}
    return out


def per_query_recall_series(
    records: Sequence[QueryRecord], k: int
) -> dict[int, float]:
    """Mean recall@k over conversations at each query index (records with evidence only)."""
    acc: dict[int, list[float]] = {}
    for rec in records:
        value = recall_at_k(rec.ranked, rec.evidence, k)
        if value is not None:
            acc.setdefault(rec.query_index, []).append(value)
    return {t: sum(v) / len(v) for t, v in sorted(acc.items())}
