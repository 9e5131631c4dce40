"""``--via rerank``: the replay as a stack with a memory store of its own sees earm, in a
reranker's slot.

The client embeds each conversation's turns and questions itself, with the model earm embeds
with by default (all-MiniLM-L6-v2, in this process), and takes its own top N (``--candidates``)
turns by cosine for each asking: its first stage. Each policy then ranks those N:

- **semantic**: the client's cosine order, no reranker;
- **earm**: ``POST /v1/rerank`` on earm (``model: earm/<namespace>``), whose scorer is the
  oracle judge's ``/rerank``; earm forwards its budget of the documents and completes the rest;
- **full**: the client calls the judge's ``/v1/rerank`` directly on all N (stateless);
- **top-b**: the client calls the judge directly on its top B, B the budget the schedule gives
  that asking (never below k), as the /retrieve replay's top-b.

Upstream calls are the documents each policy had the judge score. The records are the /retrieve
replay's (:class:`~earm_bench.locomo.metrics.QueryRecord`), so the same results and report
follow; earm's rerank answer does not say which results were estimated, so its estimated
share is not reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from earm_bench.common.http import check
from earm_bench.locomo.config import TOP_B, LocomoConfig
from earm_bench.locomo.data import Conversation
from earm_bench.locomo.judge import RunningJudge
from earm_bench.locomo.metrics import QueryRecord
from earm_bench.locomo.replay import Asking, askings, namespace_for, retrieve_options
from service.providers.local_embedder import LocalEmbedder


@dataclass(frozen=True)
class FirstStage:
    """A conversation as the client holds it: its turns' ids, texts and unit vectors."""

    ids: list[str]
    texts: list[str]
    vectors: np.ndarray

    def top(self, query_vector: np.ndarray, n: int) -> list[int]:
        """The positions of the ``n`` turns most cosine-similar to the query, best first."""
        similarities = self.vectors @ query_vector
        return [int(i) for i in np.argsort(-similarities, kind="stable")[:n]]


@dataclass(frozen=True)
class Ranking:
    """What one policy answered for one asking: positions best first, and its accounting."""

    positions: list[int]
    upstream_documents: int = 0
    upstream_requests: int = 0
    budget: int = 0
    reused: int = 0
    degraded: bool = False
    total_ms: float = 0.0
    score_ms: float = 0.0


@dataclass(frozen=True)
class Clients:
    """Where the rerank requests go, and the asking's namespace on earm."""

    earm: httpx.Client
    judge: httpx.Client
    namespace: str


Ranker = Callable[[Clients, LocomoConfig, int, str, list[str]], Ranking]


def _semantic(clients: Clients, config: LocomoConfig, t: int, query: str,
              documents: list[str]) -> Ranking:
    return Ranking(list(range(len(documents))))


def _rerank(
    client: httpx.Client, model: str, query: str, documents: list[str], top_n: int | None = None
) -> Any:
    body = {"model": model, "query": query, "documents": documents, "top_n": top_n}
    return check(client.post("/v1/rerank", json=body))


def _full(clients: Clients, config: LocomoConfig, t: int, query: str,
          documents: list[str]) -> Ranking:
    answer = _rerank(clients.judge, "locomo-oracle", query, documents)
    return Ranking([r["index"] for r in answer["results"]], len(documents), 1, len(documents))


def _top_b(clients: Clients, config: LocomoConfig, t: int, query: str,
           documents: list[str]) -> Ranking:
    _, budget, _ = retrieve_options(config, TOP_B, t, len(documents))
    return _full(clients, config, t, query, documents[:budget])


def _earm(clients: Clients, config: LocomoConfig, t: int, query: str,
          documents: list[str]) -> Ranking:
    # The stack reads the top max(k) of the answer, and says so: earm's stop rule protects
    # that top.
    answer = _rerank(
        clients.earm, f"earm/{clients.namespace}", query, documents, max(config.ks)
    )
    meta = answer["meta"]["earm"]
    timings = meta.get("timings") or {}
    return Ranking(
        positions=[r["index"] for r in answer["results"]],
        upstream_documents=int(meta["scorer_calls"]),
        budget=int(meta["budget"]),
        reused=int(meta["reused"]),
        degraded=bool(meta["degraded"]),
        total_ms=float(timings.get("total_ms") or 0.0),
        score_ms=float(timings.get("score_ms") or 0.0),
    )


RANKERS: dict[str, Ranker] = {
    "semantic": _semantic, "earm": _earm, TOP_B: _top_b, "full": _full
}


def replay_via_rerank(
    config: LocomoConfig,
    base_url: str,
    conversations: Sequence[Conversation],
    judge: RunningJudge,
    run_id: str,
    policies: Sequence[str],
    bar: Any,
) -> dict[str, list[QueryRecord]]:
    """Replay every conversation's askings under the given policies (of
    :data:`VIA_RERANK_POLICIES`) as a client with its own first stage; records per policy."""
    assert judge.url is not None, "--via rerank calls the oracle judge directly"
    embedder = LocalEmbedder()
    records: dict[str, list[QueryRecord]] = {p: [] for p in policies}
    timeout = config.request_timeout_s
    with httpx.Client(base_url=base_url, timeout=timeout) as earm, httpx.Client(
        base_url=judge.url, timeout=timeout
    ) as judge_client:
        for conv in conversations:
            if judge.oracle is not None:
                judge.oracle.set_active([conv.sample_id])
            stage = FirstStage(
                [t.dia_id for t in conv.turns],
                [t.memory_text for t in conv.turns],
                embedder.embed_sync([t.memory_text for t in conv.turns]),
            )
            stream = askings(conv, config)
            query_vectors = embedder.embed_sync([asking.text for asking in stream])
            namespace = namespace_for(
                conv.sample_id, "earm", run_id if config.shared_service else None
            )
            clients = Clients(earm, judge_client, namespace)
            for policy in policies:
                bar.set_postfix_str(f"{conv.sample_id} {policy} via rerank")
                for t, (asking, query_vector) in enumerate(zip(stream, query_vectors, strict=True)):
                    top = stage.top(query_vector, config.candidates)
                    started = time.perf_counter()
                    ranking = RANKERS[policy](
                        clients, config, t, asking.text, [stage.texts[i] for i in top]
                    )
                    client_ms = (time.perf_counter() - started) * 1000.0
                    ranked = [stage.ids[top[p]] for p in ranking.positions]
                    records[policy].append(_record(asking, t, ranked, ranking, config, client_ms))
                    bar.update(1)
    return records


def _record(asking: Asking, t: int, ranked: list[str], ranking: Ranking, config: LocomoConfig,
            client_ms: float) -> QueryRecord:
    question = asking.question
    return QueryRecord(
        sample_id=question.sample_id,
        qa_index=question.qa_index,
        query_index=t,  # the namespace's query index: every asking of a fresh one is recorded
        category=question.category,
        evidence=question.evidence,
        text=asking.text,
        ranked=tuple(ranked),
        stage=config.budget_schedule.stage_for(t),
        budget=ranking.budget,
        scorer_calls=ranking.upstream_documents,
        reused=ranking.reused,
        scorer_requests=ranking.upstream_requests,
        degraded=ranking.degraded,
        # earm's own timings; a direct call's (or the cosine order's) is the client's
        total_ms=ranking.total_ms or client_ms,
        score_ms=ranking.score_ms or (client_ms if ranking.upstream_requests else 0.0),
        client_ms=client_ms,
        round=asking.round,
        kind=asking.kind,
    )
