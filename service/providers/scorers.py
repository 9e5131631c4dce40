"""Relevance scorers: one score in [0, 1] per (query, memory) pair.

The scorer is the expensive oracle earm learns to call less often: a retrieve scores only its
anchors with it (docs/design.md, "Budget and anchors"). The counting rule of the paper holds
here: one scorer call per directly scored pair, whatever number of HTTP requests a backend
needs for them (reported separately, :class:`Scores`).

``OpenAIChatScorer`` talks to any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM,
Ollama, llama.cpp server, …); ``RerankScorer`` to a ``/rerank`` endpoint (Cohere, Jina, vLLM,
llama.cpp, Infinity, TEI), a batch of memories per request. ``LocalScorer`` is the offline
default: a calibrated mapping of the embedding cosine, which carries little information beyond
semantic search itself; real gains need an LLM scorer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "LOCAL_CENTER",
    "LOCAL_TEMPERATURE",
    "LocalScorer",
    "Outcome",
    "PartScored",
    "RelevanceScorer",
    "ScorerObserver",
    "Scores",
    "ScoresInParts",
    "cosine_to_score",
    "notify",
    "observe_all",
]

#: Centre and temperature of the cosine -> relevance sigmoid (MODELS.md: fitted on 20 hand-made
#: pairs; relevant mean cos 0.69, word-sharing irrelevant 0.40, off-topic 0.06).
LOCAL_CENTER = 0.35
LOCAL_TEMPERATURE = 0.08

#: How one pair's call ended; "error" is an unexpected exception (a bug), logged with traceback.
Outcome = Literal[
    "ok", "http_error", "timeout", "unparseable", "too_large", "transport_error", "unavailable",
    "error",
]


def cosine_to_score(cosine: np.ndarray | float) -> np.ndarray:
    """Offline relevance from cosine similarity: ``sigmoid((cos - 0.35) / 0.08)``.

    Also the "calibrated semantic score" the rerank gives cold memories, which have no history
    to estimate from (docs/design.md, "The retrieve pipeline"), so semantic and LLM scores live
    on a comparable [0, 1] scale.
    """
    z = (np.asarray(cosine, dtype=np.float64) - LOCAL_CENTER) / LOCAL_TEMPERATURE
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))


class ScorerObserver(Protocol):
    """Told about every scored pair: which scorer, how the call ended, how long it took (for
    Prometheus, see ``service.metrics``). Scorers stay free of metrics libraries. ``calls``
    pairs that ended alike in one request come as one notification (a rerank request scores
    dozens of pairs: telling each apart cost the score phase a metrics lookup per pair)."""

    def __call__(
        self, scorer: str, outcome: Outcome, duration_s: float, calls: int = 1
    ) -> None: ...


def notify(
    observer: ScorerObserver | None,
    scorer: str,
    outcome: Outcome,
    duration_s: float,
    calls: int = 1,
) -> None:
    """Call the observer; its failure must never fail scoring."""
    if observer is None:
        return
    try:
        observer(scorer, outcome, duration_s, calls)
    except Exception:  # pragma: no cover - an observer bug is logged, not propagated
        logger.exception("relevance scorer: observer failed")


def observe_all(*observers: ScorerObserver) -> ScorerObserver:
    """One observer that tells each of ``observers``, a failing one never stopping the rest."""

    def observe(scorer: str, outcome: Outcome, duration_s: float, calls: int = 1) -> None:
        for observer in observers:
            notify(observer, scorer, outcome, duration_s, calls)

    return observe


@dataclass(frozen=True)
class Scores:
    """What one :meth:`RelevanceScorer.score` call produced: one score in [0, 1] per memory
    (``None`` where that pair failed) and the HTTP requests it took, retries included. The
    paper's cost unit stays the pair (``len(values)``); ``requests`` is what a provider bills
    or rate-limits, which differs once a backend scores many pairs per request."""

    values: list[float | None]
    requests: int


@runtime_checkable
class RelevanceScorer(Protocol):
    """What the retrieve pipeline needs from a scorer."""

    name: str
    # Whether score() looks at memory_embeddings: if not, the pipeline skips fetching them and
    # passes a zero-width array.
    reads_embeddings: bool

    async def score(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
    ) -> Scores:
        """One score in [0, 1] per memory, ``None`` where that pair's call failed; never raises
        for provider trouble. Counting rule: one call per (query, memory) pair."""
        ...

    async def aclose(self) -> None: ...


#: Told the scores of one part of a :meth:`ScoresInParts.score_in_parts` call as soon as that
#: part is answered: value (``None``: failed) by position in the call's memory list.
PartScored = Callable[[Mapping[int, float | None]], None]


@runtime_checkable
class ScoresInParts(Protocol):
    """A scorer whose call answers in parts (an HTTP scorer: one per request), so a caller with
    an answer deadline can take the pairs answered by then and leave the rest to finish."""

    async def score_in_parts(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
        scored: PartScored,
    ) -> Scores:
        """:meth:`RelevanceScorer.score`, telling ``scored`` each part as it is answered."""
        ...


class LocalScorer:
    """Offline default: the embedding cosine through :func:`cosine_to_score`. No network, no
    failures (a zero vector just has cosine 0)."""

    name = "local"
    reads_embeddings = True

    def __init__(self, observer: ScorerObserver | None = None) -> None:
        self.observer = observer

    async def score(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
    ) -> Scores:
        memories = np.asarray(memory_embeddings, dtype=np.float64)
        if len(memory_texts) == 0 and memories.size == 0:
            return Scores([], requests=0)
        query = np.asarray(query_embedding, dtype=np.float64).reshape(-1)
        if memories.ndim != 2 or memories.shape[0] != len(memory_texts):
            raise ValueError(
                f"memory_embeddings has shape {memories.shape}, expected ({len(memory_texts)}, d)"
            )
        if memories.shape[1] != query.shape[0]:
            raise ValueError(
                f"query embedding has dimension {query.shape[0]}, memories {memories.shape[1]}"
            )
        memories = memories / np.maximum(np.linalg.norm(memories, axis=1, keepdims=True), 1e-12)
        query = query / max(float(np.linalg.norm(query)), 1e-12)
        started = time.perf_counter()
        cosines = np.clip(memories @ query, -1.0, 1.0)
        scores: list[float | None] = [float(s) for s in cosine_to_score(cosines)]
        if scores:
            per_pair = (time.perf_counter() - started) / len(scores)
            notify(self.observer, self.name, "ok", per_pair, len(scores))
        return Scores(scores, requests=0)

    async def aclose(self) -> None:
        """Nothing to release."""
