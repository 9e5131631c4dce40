"""``earm bench locomo --shift``: the conversations replayed one after another into ONE namespace.

Each conversation is a *segment*: its turns are ingested when its questions start, so the
experience (and the query index, hence the budget stage) learned on the earlier conversations
meets a new topic and new memories. The report splits recall and scorer calls by segment and
pools the first ``--shift-window`` queries of every segment after the first (the queries right
after a shift), where a budget that ignores the model's error pays most.

LoCoMo's turn ids (``D1:3``) repeat across conversations, so in the shared namespace every
external id and every evidence id carries its conversation: ``conv-26/D1:3``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from earm_bench.locomo import metrics
from earm_bench.locomo.config import LocomoConfig
from earm_bench.locomo.data import Conversation, Question, scoped_id
from earm_bench.locomo.judge import RunningJudge
from earm_bench.locomo.metrics import QueryRecord
from earm_bench.locomo.replay import (
    Asking,
    ingest,
    question_stream,
    retrieve,
    retrieve_options,
    to_record,
)

logger = logging.getLogger(__name__)


def shift_namespace(policy: str, run_id: str | None) -> str:
    """The one namespace of a shift replay (per policy and run against a shared service)."""
    return "locomo-shift" if run_id is None else f"locomo-shift-{policy}-{run_id}"


def segment_memories(conv: Conversation) -> list[dict[str, Any]]:
    """A conversation's turns as ``POST /memories`` items with conversation-scoped ids."""
    return [m | {"external_id": scoped_id(conv.sample_id, str(m["external_id"]))}
            for m in conv.memories()]


def segment_record(
    question: Question, reply: dict[str, Any], client_ms: float, segment: int, position: int
) -> QueryRecord:
    """The record of one question of a segment, evidence scoped like the external ids."""
    record = to_record(Asking(question, question.question), reply, client_ms)
    return replace(
        record,
        evidence=tuple(scoped_id(question.sample_id, e) for e in question.evidence),
        extra={"segment": segment, "position": position,
               "budget_reason": str(reply.get("budget_reason", ""))},
    )


def replay_shift(
    config: LocomoConfig,
    base_url: str,
    conversations: Sequence[Conversation],
    judge: RunningJudge,
    run_id: str,
    policies: Sequence[str],
    bar: Any,
) -> dict[str, list[QueryRecord]]:
    """Replay the conversations in order into one namespace per policy; records per policy."""
    records: dict[str, list[QueryRecord]] = {p: [] for p in policies}
    with httpx.Client(base_url=base_url, timeout=config.request_timeout_s) as client:
        for policy in policies:
            namespace = shift_namespace(policy, run_id if config.shared_service else None)
            stored = 0  # memories in the namespace: every segment's so far
            for segment, conv in enumerate(conversations):
                if judge.oracle is not None:
                    judge.oracle.set_active([conv.sample_id])
                created = ingest(client, namespace, segment_memories(conv))
                stored += created
                logger.info("%s: segment %d (%s) ingested %d turns", namespace, segment,
                            conv.sample_id, created)
                bar.set_postfix_str(f"shift {policy} {conv.sample_id}")
                for position, question in enumerate(question_stream(conv, config)):
                    # the namespace's query index runs on across the segments
                    service_policy, k, candidates = retrieve_options(
                        config, policy, len(records[policy]), stored
                    )
                    reply, client_ms = retrieve(
                        client, namespace, question.question, service_policy, k, candidates,
                        config.seed,
                    )
                    records[policy].append(
                        segment_record(question, reply, client_ms, segment, position)
                    )
                    bar.update(1)
    return records


def _quality_and_calls(records: Sequence[QueryRecord], ks: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = metrics.quality(records, ks)
    out["queries"] = len(records)
    out["scorer_calls"] = int(sum(r.scorer_calls for r in records))
    out["budget_mean"] = metrics.mean(r.budget for r in records)
    return out


def summarize_shift(
    records: Sequence[QueryRecord], ks: Sequence[int], window: int
) -> dict[str, Any]:
    """Per segment recall and calls; the first ``window`` queries after each shift (segments
    after the first) pooled as ``after_shift``, the rest of those segments as ``settled``."""
    segments = metrics.group(records, lambda r: int(r.extra.get("segment", 0)))
    per_segment = {
        str(number): {"sample_id": recs[0].sample_id, **_quality_and_calls(recs, ks)}
        for number, recs in segments.items()
    }
    shifted = [r for r in records if int(r.extra.get("segment", 0)) > 0]
    return {
        "window": window,
        "segments": per_segment,
        "after_shift": _quality_and_calls(
            [r for r in shifted if int(r.extra.get("position", 0)) < window], ks
        ),
        "settled": _quality_and_calls(
            [r for r in shifted if int(r.extra.get("position", 0)) >= window], ks
        ),
    }
