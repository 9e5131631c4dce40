"""Cross-encoder rerankers as :class:`~service.providers.scorers.RelevanceScorer`: a batch of
memories per ``POST {base_url}/rerank`` request.

Two wire protocols:

* ``rerank`` (Cohere v2, Jina, vLLM, llama.cpp server, Infinity): ``{"model", "query",
  "documents", "top_n"}`` answered by ``{"results": [{"index", "relevance_score"}, …]}``;
* ``tei`` (Hugging Face text-embeddings-inference): ``{"query", "texts", "raw_scores": false}``
  answered by ``[{"index", "score"}, …]``.

Results are mapped back by ``index`` (servers sort them by relevance); a document a server
leaves out, or whose score is not a finite number, stays unobserved. Scores go through the
configured transform so every observation lies in [0, 1]: ``clip`` for backends that already
return probabilities (Cohere, Jina, TEI with ``raw_scores: false``, vLLM with a classification
cross-encoder), ``sigmoid`` for backends returning logits (llama.cpp server).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from service.providers.breaker import Breaker
from service.providers.http_client import MAX_ANSWER_BYTES, Answer, PoolLimits
from service.providers.http_scorer import HTTPScorer, RequestFailed, ScoringRequest
from service.providers.scorers import ScorerObserver

__all__ = ["RerankProtocol", "RerankScorer", "ScoreTransform", "transform_score"]

RerankProtocol = Literal["rerank", "tei"]
ScoreTransform = Literal["clip", "sigmoid"]

#: Where each protocol puts the results list and each result's score.
_SCORE_FIELD: dict[RerankProtocol, str] = {"rerank": "relevance_score", "tei": "score"}


def transform_score(raw: Any, transform: ScoreTransform) -> float | None:
    """A backend's raw score as a relevance in [0, 1]; ``None`` if it is not a finite number."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    if transform == "sigmoid":
        # 1 / (1 + e^-x) written to stay finite for large |x|.
        if raw >= 0:
            return 1.0 / (1.0 + math.exp(-raw))
        exp = math.exp(raw)
        return exp / (1.0 + exp)
    return min(1.0, max(0.0, float(raw)))


class RerankScorer(HTTPScorer):
    """A ``/rerank`` endpoint scoring memories in batches of ``batch_size`` documents per
    request, the batches of one retrieve issued concurrently (bounded by ``concurrency``).

    One :meth:`score` call has ``timeout_s`` in total; a batch whose request fails for good
    (after retries) loses only its own pairs, which stay unobserved.
    """

    operation = "rerank"

    def __init__(
        self,
        base_url: str,
        model: str,
        protocol: RerankProtocol = "rerank",
        api_key: str | None = None,
        concurrency: int = 256,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        *,
        batch_size: int = 64,
        transform: ScoreTransform = "clip",
        backoff_base_s: float = 0.25,
        observer: ScorerObserver | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        pool: PoolLimits | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        super().__init__(
            base_url.rstrip("/") + "/rerank",
            api_key,
            concurrency,
            timeout_s,
            max_retries,
            backoff_base_s=backoff_base_s,
            observer=observer,
            max_answer_bytes=max_answer_bytes,
            pool=pool,
            breaker=breaker,
        )
        self.name = protocol
        self.protocol: RerankProtocol = protocol
        self.model = model
        self.batch_size = batch_size
        self.transform: ScoreTransform = transform

    def plan(self, query_text: str, memory_texts: Sequence[str]) -> list[ScoringRequest]:
        return [
            ScoringRequest(
                list(range(start, min(start + self.batch_size, len(memory_texts)))),
                self._body(query_text, list(memory_texts[start : start + self.batch_size])),
            )
            for start in range(0, len(memory_texts), self.batch_size)
        ]

    def _body(self, query_text: str, documents: list[str]) -> dict[str, Any]:
        if self.protocol == "tei":
            return {"query": query_text, "texts": documents, "raw_scores": False}
        return {
            "model": self.model,
            "query": query_text,
            "documents": documents,
            "top_n": len(documents),
        }

    def parse(self, response: Answer, request: ScoringRequest) -> list[float | None]:
        try:
            payload: Any = response.json()
        except ValueError:
            raise RequestFailed("unparseable") from None
        results = payload if self.protocol == "tei" else _get(payload, "results")
        if not isinstance(results, list):
            raise RequestFailed("unparseable")
        field = _SCORE_FIELD[self.protocol]
        values: list[float | None] = [None] * len(request.positions)
        for result in results:
            index = _get(result, "index")
            # An index outside the batch (or not an integer) belongs to no pair we asked about.
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(values):
                values[index] = transform_score(_get(result, field), self.transform)
        return values

    def __repr__(self) -> str:  # no api key, ever
        return (
            f"RerankScorer(url={self.url!r}, protocol={self.protocol!r}, model={self.model!r}, "
            f"batch_size={self.batch_size}, concurrency={self.concurrency})"
        )


def _get(payload: Any, key: str) -> Any:
    """``payload[key]`` for a JSON object, else ``None``."""
    return payload.get(key) if isinstance(payload, dict) else None
