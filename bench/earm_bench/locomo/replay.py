"""The replay of ``earm bench locomo``: every conversation's questions through
``POST /retrieve``, one namespace per (conversation, policy)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from earm_bench.common.http import check
from earm_bench.locomo.config import TOP_B, LocomoConfig
from earm_bench.locomo.data import Conversation, Question
from earm_bench.locomo.judge import RunningJudge
from earm_bench.locomo.metrics import QueryRecord

logger = logging.getLogger(__name__)

INGEST_CHUNK = 500

#: How ``--repeat`` rephrases a question: templates that wrap its text.
REPHRASINGS = ("Remind me: {q}", "{q} Do you remember?", "Quick question: {q}")


def ingest(client: httpx.Client, namespace: str, memories: Sequence[dict[str, Any]]) -> int:
    """Store memories in ``namespace`` in chunks; returns how many the service created."""
    created = 0
    for start in range(0, len(memories), INGEST_CHUNK):
        chunk = list(memories[start : start + INGEST_CHUNK])
        body = check(client.post("/memories", json={"namespace": namespace, "memories": chunk}))
        created += int(body.get("created", 0))
    return created


def retrieve(
    client: httpx.Client,
    namespace: str,
    query: str,
    policy: str,
    k: int,
    candidates: int,
    seed: int,
) -> tuple[dict[str, Any], float]:
    """One ``POST /retrieve`` in relevance order; returns the body and the client-side ms.
    For an ``earm`` retrieve the body gains the query's ``prequential_error`` from its trace
    (``GET /queries/{id}``, outside the timed request): how well the completion predicted
    this query's anchors before it learned from them."""
    body: dict[str, Any] = {
        "namespace": namespace,
        "query": query,
        "k": k,
        "candidates": candidates,
        "policy": policy,
        "order": "relevance",
        "seed": seed,
    }
    started = time.perf_counter()
    response = client.post("/retrieve", json=body)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    reply = check(response)
    if policy == "earm" and reply.get("query_id") is not None:
        trace = check(client.get(f"/queries/{reply['query_id']}"))
        reply["prequential_error"] = trace.get("prequential_error")
    return reply, elapsed_ms


def retrieve_options(
    config: LocomoConfig, policy: str, query_index: int, memories: int
) -> tuple[str, int, int]:
    """The service's policy, k and candidates of the ``query_index``-th asking of a namespace
    holding ``memories`` memories under a policy of the bench. top-b is the service's ``full``
    over the semantic top B, B the budget the schedule gives that query for its candidates
    (never below k, so it still returns k), all B returned: the pairs it scored."""
    k = max(config.ks)
    if policy != TOP_B:
        return policy, k, config.candidates
    n_candidates = min(config.candidates, memories)
    budget = max(k, config.budget_schedule.budget_for_query(query_index, n_candidates))
    return "full", budget, budget


def to_record(asking: Asking, reply: dict[str, Any], client_ms: float) -> QueryRecord:
    """A :class:`QueryRecord` from an asking and the service's answer."""
    question = asking.question
    memories = sorted(reply.get("memories", []), key=lambda m: m.get("rank") or 1 << 30)
    timings = reply.get("timings") or {}
    return QueryRecord(
        sample_id=question.sample_id,
        qa_index=question.qa_index,
        query_index=int(reply.get("query_index", 0)),
        category=question.category,
        evidence=question.evidence,
        text=asking.text,
        ranked=tuple(str(m.get("external_id")) for m in memories),
        sources=tuple(str(m.get("source")) for m in memories),
        stage=int(reply.get("stage") or 0),
        budget=int(reply.get("budget") or 0),
        scorer_calls=int(reply.get("scorer_calls") or 0),
        reused=int(reply.get("reused") or 0),
        scorer_requests=int(reply.get("scorer_requests") or 0),
        degraded=bool(reply.get("degraded")),
        total_ms=float(timings.get("total_ms") or 0.0),
        score_ms=float(timings.get("score_ms") or 0.0),
        client_ms=client_ms,
        prequential_error=reply.get("prequential_error"),
        round=asking.round,
        kind=asking.kind,
    )


def replay(
    config: LocomoConfig,
    base_url: str,
    conversations: Sequence[Conversation],
    judge: RunningJudge,
    run_id: str,
    policies: Sequence[str],
    bar: Any,
) -> dict[str, list[QueryRecord]]:
    """Replay every conversation under the given policies; records per policy."""
    streams = {c.sample_id: askings(c, config) for c in conversations}
    records: dict[str, list[QueryRecord]] = {p: [] for p in policies}
    with httpx.Client(base_url=base_url, timeout=config.request_timeout_s) as client:
        for conv in conversations:
            if judge.oracle is not None:
                judge.oracle.set_active([conv.sample_id])
            memories = conv.memories()
            for policy in policies:
                namespace = namespace_for(
                    conv.sample_id, policy, run_id if config.shared_service else None
                )
                bar.set_postfix_str(f"{conv.sample_id} {policy} ingest")
                started = time.perf_counter()
                created = ingest(client, namespace, memories)
                logger.info("%s: ingested %d turns (%d new) in %.1f s", namespace, len(memories),
                            created, time.perf_counter() - started)
                bar.set_postfix_str(f"{conv.sample_id} {policy}")
                for query_index, asking in enumerate(streams[conv.sample_id]):
                    service_policy, k, candidates = retrieve_options(
                        config, policy, query_index, created
                    )
                    reply, client_ms = retrieve(
                        client, namespace, asking.text, service_policy, k, candidates, config.seed
                    )
                    records[policy].append(to_record(asking, reply, client_ms))
                    bar.update(1)
    return records


def namespace_for(sample_id: str, policy: str, run_id: str | None = None) -> str:
    """The namespace of one (conversation, policy) replay.

    In-process, every policy gets its own service and empty database, so the name is the same
    for all policies and carries no run id: the service derives anchors from (namespace, query
    index, seed), so ``observed`` and ``earm`` score the very same anchors and differ only in
    how they rank the rest (a paired comparison), and a run is reproducible. Against a shared
    service or database (``--url``, ``--database-url``) policy and run id keep every replay in
    a fresh namespace; the policies then sample different anchors.
    """
    if run_id is None:
        return f"locomo-{sample_id}"
    return f"locomo-{sample_id}-{policy}-{run_id}"


def question_stream(conv: Conversation, config: LocomoConfig) -> list[Question]:
    """The questions the replay asks of a conversation, in file order."""
    questions = conv.replay_questions(config.categories)
    if config.max_questions is not None:
        questions = questions[: config.max_questions]
    return questions


@dataclass(frozen=True)
class Asking:
    """One ``POST /retrieve`` of the replay: a question, the text sent for it, and its round."""

    question: Question
    text: str
    round: int = 0  # 0: the plain stream; 1..R: the --repeat rounds
    kind: str = "plain"  # "plain" | "verbatim" | "rephrased"


def askings(conv: Conversation, config: LocomoConfig) -> list[Asking]:
    """The conversation's questions in file order, then ``config.repeat`` rounds re-asking
    them, each round in its own shuffled order. Which half of the questions is re-asked
    verbatim and which rephrased is drawn once per conversation; a rephrased question takes
    the next template (:data:`REPHRASINGS`) each round, so no two of its rephrasings repeat
    the same text. Seeded by (seed, conversation): every policy asks the same stream."""
    questions = question_stream(conv, config)
    stream = [Asking(q, q.question) for q in questions]
    if config.repeat == 0:
        return stream
    rng = random.Random(f"{config.seed}|{conv.sample_id}")
    positions = list(range(len(questions)))
    rng.shuffle(positions)
    rephrased = set(positions[len(positions) // 2 :])
    for round_ in range(1, config.repeat + 1):
        rng.shuffle(positions)
        for i in positions:
            question = questions[i]
            if i in rephrased:
                template = REPHRASINGS[(i + round_ - 1) % len(REPHRASINGS)]
                stream.append(Asking(question, template.format(q=question.question), round_,
                                     "rephrased"))
            else:
                stream.append(Asking(question, question.question, round_, "verbatim"))
    return stream
