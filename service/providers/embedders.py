"""Text embedders: what every embedder provides (the offline default model is
``service.providers.local_embedder``, an OpenAI-compatible ``/v1/embeddings`` endpoint
``service.providers.openai_embedder``).

Every vector earm stores or searches with comes from one of these (or from the client, when the
deployment runs with ``embedder="none"``). Both return float32 rows that are L2-normalised, so
cosine similarity is a plain dot product everywhere downstream, and both carry a ``model_id``
that is stored with each memory: vectors from different models live in different spaces and
must never be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from service.errors import (
    DimensionMismatch,
    EmbedderUnavailable,
    EmbeddingRequired,
    InvalidInput,
)

__all__ = [
    "CLIENT_MODEL_ID", "Embedder", "EmbedderError", "check_embedding", "embed_texts",
    "float32_vector", "l2_normalise",
]

#: The model id stored with a vector the client sent (whose model earm does not know).
CLIENT_MODEL_ID = "client"



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

    async def embed(self, texts: Sequence[str], *, bulk: bool = False) -> NDArray[np.float32]:
        """float32 array of shape ``(len(texts), dim)``, rows L2-normalised, in input order.

        ``bulk``: the texts are memories being stored (an ingest, an edit). A bulk call may
        wait for other work; a query's embedding (``bulk=False``) never waits behind one."""
        ...

    async def aclose(self) -> None:
        """Release connections/sessions; called once from the app's lifespan."""
        ...


def l2_normalise(vectors: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    # Annotated: numpy types ufunc results (np.maximum) as Any.
    unit_rows: NDArray[np.float32] = (vectors / np.maximum(norms, 1e-12)).astype(
        np.float32, copy=False
    )
    return unit_rows


def float32_vector(vector: Sequence[float], dim: int, what: str) -> NDArray[np.float32]:
    """A vector as the float32 values pgvector stores, or a precise error: ``dim`` of them,
    all finite (1e39 is finite as a JSON number but infinite as a 32-bit float)."""
    with np.errstate(over="ignore", under="ignore"):
        array = np.asarray(vector, dtype=np.float32)
    if array.ndim != 1 or array.shape[0] != dim:
        raise DimensionMismatch(
            f"{what} has {array.shape[0] if array.ndim == 1 else array.shape} dimensions; "
            f"this deployment uses {dim}"
        )
    if not np.all(np.isfinite(array)):
        raise InvalidInput(
            f"{what} has NaN, infinite or out-of-range values: vectors are stored as 32-bit "
            "floats, whose magnitude ends at 3.4e38"
        )
    return array


def check_embedding(vector: Sequence[float], dim: int, what: str) -> NDArray[np.float32]:
    """A client-supplied vector (a memory's or a query's) as float32, or a precise error.

    The checks look at the float32 values pgvector stores, not at the JSON numbers: 1e-50 is
    not zero but becomes 0, 1e39 is finite but becomes infinite. pgvector's cosine distance
    also sums the squares in float32, so the squared length must be positive and finite there
    too (384 x 1e-30 or 384 x 1e38 have none); a vector without one would make every
    similarity to it NaN, and the content prior divide by its zero norm."""
    array = float32_vector(vector, dim, what)
    with np.errstate(over="ignore", under="ignore"):
        squared_length = np.sum(np.square(array), dtype=np.float32)
    if not np.any(array):
        raise InvalidInput(
            f"{what} is all zeros as 32-bit floats (magnitudes below 1.4e-45 round to 0), "
            "which has no cosine similarity"
        )
    if not 0 < squared_length < np.inf:
        raise InvalidInput(
            f"{what} has no length in 32-bit floats (its squared length "
            f"{'overflows' if squared_length else 'rounds to 0'}): scale it, e.g. to unit length"
        )
    return array


async def embed_texts(
    embedder: Embedder | None, texts: Sequence[str], *, bulk: bool = False
) -> NDArray[np.float32]:
    """Embed texts with the configured embedder, translating its failures to a domain error;
    ``bulk`` as for :meth:`Embedder.embed`."""
    if embedder is None:
        raise EmbeddingRequired(
            "no embedder is configured (EARM_EMBEDDER=none): send embeddings with the request"
        )
    try:
        return await embedder.embed(list(texts), bulk=bulk)
    except EmbedderError as exc:
        raise EmbedderUnavailable(f"the embedder failed: {exc}") from exc
