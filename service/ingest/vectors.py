"""The vectors of new or edited memories: a client's own, checked against the namespace's
dimension, or the embedder's, for all the texts of a batch in one bulk call (which never holds
up a retrieve's query: :meth:`~service.providers.embedders.Embedder.embed`); and the embedding
model recorded with each (``CLIENT_MODEL_ID`` for a client's vector)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.ingest.records import NewMemory
from service.providers.embedders import CLIENT_MODEL_ID, Embedder, check_embedding, embed_texts


def model_ids(
    embedder: Embedder | None, items: Sequence[NewMemory], pending: Sequence[int]
) -> list[str]:
    """The embedding model of each pending item's vector."""
    return [
        CLIENT_MODEL_ID
        if items[p].embedding is not None
        else (embedder.model_id if embedder else "")
        for p in pending
    ]


async def vectors_for(
    embedder: Embedder | None,
    embedding_dim: int,
    items: Sequence[NewMemory],
    positions: Sequence[int],
) -> list[np.ndarray]:
    """Client vectors checked as given; the rest embedded in one batched call."""
    vectors: list[np.ndarray | None] = [
        check_embedding(item.embedding, embedding_dim, f"memories[{position}].embedding")
        if item.embedding is not None
        else None
        for item, position in zip(items, positions, strict=True)
    ]
    to_embed = [i for i, vector in enumerate(vectors) if vector is None]
    if to_embed:
        computed = await embed_texts(embedder, [items[i].text for i in to_embed], bulk=True)
        for i, vector in zip(to_embed, computed, strict=True):
            vectors[i] = vector
    filled = [vector for vector in vectors if vector is not None]
    assert len(filled) == len(vectors), "the embedder returns a vector for every text"
    return filled


class EmbeddedAhead:
    """An embedder answering from texts embedded before a transaction began, so that no
    transaction (nor the pooled connection and the locks it holds) waits on the embedder; a
    text it was not given ahead (a row that changed in between) goes to the wrapped one."""

    def __init__(self, embedder: Embedder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dim = embedder.dim
        self.vectors = dict(zip(texts, vectors, strict=True))

    async def embed(self, texts: Sequence[str], *, bulk: bool = False) -> np.ndarray:
        missing = [text for text in dict.fromkeys(texts) if text not in self.vectors]
        if missing:
            self.vectors.update(zip(missing, await self.embedder.embed(missing, bulk=bulk),
                                    strict=True))
        return np.stack([self.vectors[text] for text in texts]).astype(np.float32, copy=False)

    async def aclose(self) -> None:
        """Nothing of its own to release: the wrapped embedder belongs to the app."""


async def embed_ahead(embedder: Embedder | None, texts: Sequence[str]) -> Embedder | None:
    """``embedder`` with ``texts`` (edits' new texts) embedded now, in one bulk call."""
    if embedder is None or not texts:
        return embedder
    unique = list(dict.fromkeys(texts))
    return EmbeddedAhead(embedder, unique, await embed_texts(embedder, unique, bulk=True))
