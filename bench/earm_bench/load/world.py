"""The synthetic data of ``earm bench load``: memories and queries of known structure."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from earm_bench.load.config import LoadConfig

_WORDS = (
    "hiking", "trip", "garden", "recipe", "concert", "project", "deadline", "birthday", "museum",
    "novel", "bicycle", "painting", "interview", "vacation", "puppy", "marathon", "guitar",
    "lecture", "market", "festival",
)
_NAMES = ("Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana")


def _normalise(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    # Annotated: numpy types linalg.norm along an axis as Any.
    unit_rows: NDArray[np.float64] = rows / np.linalg.norm(rows, axis=-1, keepdims=True)
    return unit_rows


class World:
    """Synthetic memories and queries of known structure.

    Embeddings cluster around ``topics`` centres; relevance is low rank: each memory and query
    has a ``true_rank`` latent vector (its topic's plus noise) and
    ``relevance(q, m) = clip(0.5 + 0.5 · a_q · b_m, 0, 1)``. Vectors are rounded to 6 decimals
    and stored as float32, so what the bench sends is exactly what the service stores.
    """

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        rng = np.random.default_rng([config.seed, 1])
        self.centres = _normalise(rng.normal(size=(config.topics, config.dim)))
        self.topic_latents = rng.normal(size=(config.topics, config.true_rank)) / math.sqrt(
            config.true_rank
        )
        self.memory_topics = rng.integers(config.topics, size=config.memories)
        self.memory_latents = self._latents(rng, self.memory_topics)
        self.memory_embeddings = np.zeros((config.memories, config.dim), dtype=np.float32)
        for start in range(0, config.memories, 10_000):
            stop = min(config.memories, start + 10_000)
            self.memory_embeddings[start:stop] = self.embeddings(
                np.random.default_rng([config.seed, 2, start]), self.memory_topics[start:stop]
            )
        self.by_topic = [np.flatnonzero(self.memory_topics == t) for t in range(config.topics)]
        self._queries: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    def _latents(self, rng: np.random.Generator, topics: np.ndarray) -> NDArray[np.float64]:
        noise = rng.normal(size=(len(topics), self.config.true_rank))
        # Annotated: numpy types fancy indexing (topic_latents[topics]) as Any.
        latents: NDArray[np.float64] = (
            0.8 * self.topic_latents[topics] + 0.6 * noise / math.sqrt(self.config.true_rank)
        )
        return latents

    def embeddings(self, rng: np.random.Generator, topics: np.ndarray) -> NDArray[np.float32]:
        """Fresh embeddings of the given topics (rounded, float32)."""
        noise = _normalise(rng.normal(size=(len(topics), self.config.dim)))
        vectors = _normalise(self.centres[topics] + 0.9 * noise)
        return np.round(vectors, 6).astype(np.float32)

    def query(self, number: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(topic, embedding, latent) of query ``number``; the same on every call."""
        found = self._queries.get(number)
        if found is None:
            rng = np.random.default_rng([self.config.seed, 3, number])
            topic = np.array([int(rng.integers(self.config.topics))])
            found = (int(topic[0]), self.embeddings(rng, topic)[0], self._latents(rng, topic)[0])
            self._queries[number] = found
        return found

    def queries(self, numbers: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Many queries at once (bulk observations): topics, embeddings, latents."""
        rng = np.random.default_rng([self.config.seed, 4, int(numbers[0]), len(numbers)])
        topics = rng.integers(self.config.topics, size=len(numbers))
        return topics, self.embeddings(rng, topics), self._latents(rng, topics)

    def relevance(
        self, query_latent: np.ndarray, memory_index: np.ndarray | int
    ) -> NDArray[np.float64] | np.float64:
        """The relevance to each memory of ``memory_index``; a scalar for one memory."""
        # Annotated: numpy types the product of an indexed array as Any.
        relevance: NDArray[np.float64] | np.float64 = np.clip(
            0.5 + 0.5 * (self.memory_latents[memory_index] @ query_latent), 0.0, 1.0
        )
        return relevance

    def chatter(self, n: int) -> list[str]:
        """``n`` made-up sentences for the ingest through the service's own embedder."""
        rng = np.random.default_rng([self.config.seed, 6])
        return [
            f"{_NAMES[rng.integers(len(_NAMES))]} talked about the "
            f"{_WORDS[rng.integers(len(_WORDS))]} and the {_WORDS[rng.integers(len(_WORDS))]} "
            f"on day {i}, planning the next {_WORDS[rng.integers(len(_WORDS))]} together."
            for i in range(n)
        ]

    @staticmethod
    def memory_text(index: int, topic: int) -> str:
        return f"bench memory {index} about topic {topic}"

    @staticmethod
    def query_text(number: int, topic: int) -> str:
        return f"bench query {number} about topic {topic}"
