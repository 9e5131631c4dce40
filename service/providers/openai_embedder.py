"""Any OpenAI-compatible ``/v1/embeddings`` endpoint as an
:class:`~service.providers.embedders.Embedder`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
from numpy.typing import NDArray

from service.providers.embedders import EmbedderError, l2_normalise
from service.providers.retry import backoff_delay, retry_after_seconds, retryable_status

logger = logging.getLogger(__name__)

#: An answer's bytes per number of its vectors, at most: float64's longest text (24 characters,
#: ``-2.2250738585072014e-308``), a separator, and room for a pretty-printer's indentation.
BYTES_PER_NUMBER = 48
#: An answer's bytes besides its numbers, at most: indices, field names, usage, an error message.
ANSWER_OVERHEAD_BYTES = 1024 * 1024


class _AnswerTooLarge(Exception):
    """The answer's body is over the embedder's ``max_answer_bytes``."""


def _error_message(response: httpx.Response, content: bytes) -> str:
    """The provider's error message, short; never the request (it holds memory text)."""
    try:
        payload = json.loads(content)
        message = payload.get("error", {}).get("message") if isinstance(payload, dict) else None
        if isinstance(message, str) and message:
            return message[:200]
    except ValueError:
        pass
    return response.reason_phrase or ""


def openai_model_id(model: str) -> str:
    """The id stored with vectors of the endpoint's ``model``."""
    return f"openai:{model}"


class OpenAIEmbedder:
    """Any OpenAI-compatible ``POST {base_url}/embeddings`` (OpenAI, vLLM, Ollama, TEI, …).

    ``base_url`` includes the version prefix, like OpenAI's (``https://api.openai.com/v1``).
    Texts go out in batches of ``batch_size``, one batch after another (gentle on rate limits).
    Each request has its own timeout; 429, 5xx and transport errors (timeouts included) are
    retried up to ``max_retries`` times with jittered exponential backoff, honouring
    ``Retry-After`` up to ``max_retry_after_s`` (a longer requested wait fails at once: holding a
    request for minutes is worse than an error). Responses are validated strictly (count,
    ``index`` permutation, dimension, finite numbers) because a silently wrong vector would
    corrupt the index for good. An answer is read up to :attr:`max_answer_bytes` (what a batch
    of vectors can take, :data:`BYTES_PER_NUMBER` per number plus
    :data:`ANSWER_OVERHEAD_BYTES`); a longer one fails the call at once, its connection closed.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        dim: int,
        api_key: str | None = None,
        timeout_s: float = 30,
        batch_size: int = 64,
        max_retries: int = 3,
        client: httpx.AsyncClient | None = None,
        *,
        backoff_base_s: float = 0.5,
        max_retry_after_s: float = 20.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.model_id = openai_model_id(model)
        self.dim = dim
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.max_retry_after_s = max_retry_after_s
        self.max_answer_bytes = batch_size * dim * BYTES_PER_NUMBER + ANSWER_OVERHEAD_BYTES
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=timeout_s)

    async def embed(self, texts: Sequence[str], *, bulk: bool = False) -> NDArray[np.float32]:
        """The vectors of ``texts``. ``bulk`` changes nothing here: every call sends requests
        of its own, so a query's request never queues behind an ingest's."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        parts = [
            await self._embed_batch(texts[start : start + self.batch_size])
            for start in range(0, len(texts), self.batch_size)
        ]
        return l2_normalise(np.concatenate(parts, axis=0))

    async def _embed_batch(self, batch: list[str]) -> NDArray[np.float32]:
        body = {"model": self.model, "input": batch, "encoding_format": "float"}
        attempt = 0
        while True:
            problem: str  # for the exception: may quote the provider's error message
            kind: str  # for the log: status or exception class only, never provider text
            wait: float | None = None
            try:
                response, content = await self._post(body)
            except httpx.TimeoutException:
                problem = kind = f"timed out after {self.timeout_s} s"
            except httpx.HTTPError as exc:  # connect/read/protocol errors, undecodable bodies
                problem = kind = f"transport error: {type(exc).__name__}"
            except _AnswerTooLarge:  # a faulty endpoint: asking again would not help
                raise EmbedderError(
                    f"embeddings endpoint {self.url}: its answer is over "
                    f"{self.max_answer_bytes} bytes, more than {len(batch)} vectors take"
                ) from None
            else:
                if response.status_code == 200:
                    return self._parse(content, len(batch))
                kind = f"HTTP {response.status_code}"
                problem = f"{kind}: {_error_message(response, content)}"
                if not retryable_status(response.status_code):
                    raise EmbedderError(f"embeddings endpoint {self.url} answered {problem}")
                wait = retry_after_seconds(response.headers)
                if wait is not None and wait > self.max_retry_after_s:
                    raise EmbedderError(
                        f"embeddings endpoint {self.url} answered {problem} and asks to retry "
                        f"after {wait:.0f} s (more than {self.max_retry_after_s:.0f} s)"
                    )
            if attempt >= self.max_retries:
                raise EmbedderError(
                    f"embeddings endpoint {self.url} failed after {attempt + 1} attempt(s): "
                    f"{problem}"
                )
            delay = wait if wait is not None else backoff_delay(attempt, self.backoff_base_s)
            logger.warning(
                "embeddings request failed (%s); retry %d/%d in %.2f s",
                kind, attempt + 1, self.max_retries, delay,
            )
            await asyncio.sleep(delay)
            attempt += 1

    async def _post(self, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
        """The response to ``body`` and its body (decoded), read up to the cap: a longer one
        raises :class:`_AnswerTooLarge` and closes its connection."""
        async with self._client.stream(
            "POST", self.url, json=body, headers=self._headers, timeout=self.timeout_s
        ) as response:
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_answer_bytes:
                raise _AnswerTooLarge
            pieces: list[bytes] = []
            size = 0
            async for piece in response.aiter_bytes():
                size += len(piece)
                if size > self.max_answer_bytes:
                    raise _AnswerTooLarge
                pieces.append(piece)
        return response, b"".join(pieces)

    def _parse(self, content: bytes, expected: int) -> NDArray[np.float32]:
        """Validated ``(expected, dim)`` float32 rows in request order (sorted by ``index``)."""
        def bad(why: str) -> EmbedderError:
            return EmbedderError(f"invalid embeddings response from {self.url}: {why}")

        try:
            payload: Any = json.loads(content)
        except ValueError:
            raise bad("body is not JSON") from None
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise bad("no 'data' list")
        if len(data) != expected:
            raise bad(f"{len(data)} embeddings for {expected} inputs")
        rows: list[Any] = [None] * expected
        for position, item in enumerate(data):
            if not isinstance(item, dict):
                raise bad(f"data[{position}] is not an object")
            index = item.get("index", position)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < expected:
                raise bad(f"data[{position}].index is {index!r}, expected 0..{expected - 1}")
            if rows[index] is not None:
                raise bad(f"index {index} appears twice")
            vector = item.get("embedding")
            if not isinstance(vector, list):
                raise bad(f"embedding {index} is not a list of floats (base64 is not supported)")
            if len(vector) != self.dim:
                raise bad(
                    f"embedding {index} has dimension {len(vector)}, expected {self.dim} "
                    "(the deployment's embedding_dim must match the model)"
                )
            rows[index] = vector
        try:
            matrix = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError):
            raise bad("embeddings contain non-numeric values") from None
        if not np.isfinite(matrix).all():
            raise bad("embeddings contain NaN or infinite values")
        zero = np.flatnonzero(np.linalg.norm(matrix, axis=1) == 0)
        if zero.size:
            raise bad(f"embedding {int(zero[0])} is all zeros (cannot be normalised)")
        return matrix.astype(np.float32)

    async def aclose(self) -> None:
        """Close the HTTP client if this embedder created it."""
        if self._owns_client:
            await self._client.aclose()

    def __repr__(self) -> str:  # no api key, ever
        return f"OpenAIEmbedder(url={self.url!r}, model={self.model!r}, dim={self.dim})"
