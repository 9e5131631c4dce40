"""The RESULTS of ``earm bench locomo`` from the replay's records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from earm_bench.locomo import metrics
from earm_bench.locomo.config import ADVERSARIAL, TOP_B, LocomoConfig
from earm_bench.locomo.data import CATEGORY_NAMES, DEFAULT_CATEGORIES, Conversation
from earm_bench.locomo.metrics import QueryRecord
from earm_bench.locomo.replay import question_stream
from earm_bench.locomo.shift import summarize_shift


def dataset_summary(conversations: Sequence[Conversation], config: LocomoConfig) -> dict[str, Any]:
    """The ``dataset`` block: conversations, questions per category, skipped questions."""
    per_category: dict[str, int] = {}
    skipped: dict[str, int] = {}
    per_conv: dict[str, Any] = {}
    for conv in conversations:
        stream = question_stream(conv, config)
        per_conv[conv.sample_id] = {
            "turns": len(conv.turns),
            "questions": len(stream),
            "skipped_no_evidence": sum(1 for q in stream if not q.has_evidence),
        }
        for q in stream:
            per_category[str(q.category)] = per_category.get(str(q.category), 0) + 1
            if not q.has_evidence:
                skipped[str(q.category)] = skipped.get(str(q.category), 0) + 1
    main = sum(v for c, v in per_category.items() if int(c) in DEFAULT_CATEGORIES)
    return {
        "conversations": [c.sample_id for c in conversations],
        "per_conversation": per_conv,
        "turns": sum(len(c.turns) for c in conversations),
        "questions": main,
        "questions_per_category": dict(sorted(per_category.items())),
        "category_names": {str(c): n for c, n in CATEGORY_NAMES.items()},
        "skipped_no_evidence": sum(v for c, v in skipped.items() if int(c) in DEFAULT_CATEGORIES),
        "skipped_per_category": dict(sorted(skipped.items())),
    }


def build_results(
    config: LocomoConfig,
    records: dict[str, list[QueryRecord]],
    conversations: Sequence[Conversation],
) -> dict[str, Any]:
    """The RESULTS dict (without settings) from the replay records. The policy tables cover
    the plain stream; ``repeat`` the rounds of ``--repeat``."""
    plain = plain_stream(records)
    policies: dict[str, Any] = {}
    for policy, recs in plain.items():
        policies[policy] = metrics.summarize_policy(recs, config.ks, DEFAULT_CATEGORIES)
    full_calls = policies["full"]["scorer_calls"] if "full" in policies else None
    for entry in policies.values():
        entry["calls_vs_full"] = (
            entry["scorer_calls"] / full_calls if full_calls else None
        )
    out: dict[str, Any] = {
        "dataset": dataset_summary(conversations, config),
        "policies": policies,
        "derived": metrics.derived(policies, config.ks),
    }
    if config.shift:
        out["shift"] = {
            policy: summarize_shift(recs, config.ks, config.shift_window)
            for policy, recs in records.items()
        }
    if config.include_adversarial:
        out["adversarial"] = {
            policy: metrics.quality([r for r in recs if r.category == ADVERSARIAL], config.ks)
            for policy, recs in plain.items()
        }
    if config.repeat:
        out["repeat"] = repeat_results(with_score_cache(records), config.ks)
        out["repeat_derived"] = repeat_derived(out["repeat"], config.ks)
    if config.per_query:
        out["per_query"] = {
            policy: [per_query_row(r, config.ks) for r in recs] for policy, recs in records.items()
        }
    return out


def per_query_row(record: QueryRecord, ks: Sequence[int]) -> dict[str, Any]:
    """One query of ``--per-query``: ids and numbers only (no texts)."""
    return {
        "sample_id": record.sample_id,
        "qa_index": record.qa_index,
        "t": record.query_index,
        "round": record.round,
        "kind": record.kind,
        "category": record.category,
        "stage": record.stage,
        "budget": record.budget,
        "scorer_calls": record.scorer_calls,
        "reused": record.reused,
        "scorer_requests": record.scorer_requests,
        **record.extra,  # --shift: segment and position in it
        **{f"recall@{k}": metrics.recall_at_k(record.ranked, record.evidence, k) for k in ks},
        f"estimated@{max(ks)}": record.sources[: max(ks)].count("estimated"),
    }


def plain_stream(records: dict[str, list[QueryRecord]]) -> dict[str, list[QueryRecord]]:
    """Each policy's records of the plain stream, without the --repeat rounds."""
    return {policy: [r for r in recs if r.round == 0] for policy, recs in records.items()}


#: top-b behind an exact-match score cache of (query text, memory) pairs, derived from top-b's
#: run: the nearest thing a peer ships for a recurring need.
TOP_B_CACHE = f"{TOP_B}+cache"

#: The repeat stream's derived rows: (name, minuend policy, subtrahend policy).
REPEAT_DERIVED_ROWS: tuple[tuple[str, str, str], ...] = (
    (f"earm_minus_{TOP_B}", "earm", TOP_B),
    (f"earm_minus_{TOP_B_CACHE}", "earm", TOP_B_CACHE),
)


def with_score_cache(records: dict[str, list[QueryRecord]]) -> dict[str, list[QueryRecord]]:
    """The records with top-b+cache's (next to top-b's) when top-b was run."""
    out: dict[str, list[QueryRecord]] = {}
    for policy, recs in records.items():
        out[policy] = recs
        if policy == TOP_B:
            out[TOP_B_CACHE] = metrics.behind_exact_cache(recs)
    return out


def repeat_derived(repeat: dict[str, Any], ks: Sequence[int]) -> dict[str, Any]:
    """The repeat stream's derived rows for which both policies were run."""
    return {
        name: metrics.repeat_differences(repeat[a]["rounds"], repeat[b]["rounds"], ks)
        for name, a, b in REPEAT_DERIVED_ROWS
        if a in repeat and b in repeat
    }


def repeat_results(records: dict[str, list[QueryRecord]], ks: Sequence[int]) -> dict[str, Any]:
    """The ``repeat`` block: per policy, quality/calls/reuse per round and kind (categories
    1–4), the whole stream's calls, and each round's recall as a share of ``full``'s on the
    same askings."""
    policies: dict[str, Any] = {}
    for policy, recs in records.items():
        main = [r for r in recs if r.category in DEFAULT_CATEGORIES]
        policies[policy] = {
            "rounds": metrics.repeat_rounds(main, ks),
            "scorer_calls": int(sum(r.scorer_calls for r in recs)),
            "reused": int(sum(r.reused for r in recs)),
            "prequential_error": metrics.prequential_error(recs),
        }
    full = policies.get("full")
    for entry in policies.values():
        entry["calls_vs_full"] = (
            entry["scorer_calls"] / full["scorer_calls"] if full and full["scorer_calls"] else None
        )
        entry["recall_vs_full"] = (
            {
                round_: {
                    kind: {
                        f"recall@{k}": _share(q.get(f"recall@{k}"),
                                              full["rounds"][round_][kind].get(f"recall@{k}"))
                        for k in ks
                    }
                    for kind, q in kinds.items()
                }
                for round_, kinds in entry["rounds"].items()
            }
            if full
            else None
        )
    return policies


def _share(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None
