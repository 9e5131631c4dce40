"""The search step of a retrieve (service.retrieve.search_step), against a real namespace: its
candidates are the top N by cosine, most similar first, among the memories its filters pass;
a namespace never written has none; a repeated query finds its family's observations; a
near-paraphrase finds what its neighbour observed."""

from __future__ import annotations

import asyncio

import numpy as np

from service.db.engine import open_database
from service.ingest.memories import NewMemory, ingest
from service.providers.factory import build_scorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.retrieve.search_step import FoundCandidates, SearchStep
from service.settings import Settings

DIM = 384
MEMORIES = 40
NAMESPACE = "search-step"


def _unit(vector: np.ndarray) -> np.ndarray:
    unit: np.ndarray = vector / np.linalg.norm(vector)
    return unit


def _vectors() -> tuple[np.ndarray, np.ndarray]:
    """The memories' vectors, and a query vector they lie at known cosines from."""
    rng = np.random.default_rng(7)
    query = _unit(rng.normal(size=DIM))
    noise = np.stack([_unit(rng.normal(size=DIM)) for _ in range(MEMORIES)])
    weights = np.linspace(0.95, 0.05, MEMORIES)[:, None]
    return np.stack([_unit(v) for v in weights * query + (1 - weights) * noise]), query


async def _scenario(settings: Settings) -> dict[str, FoundCandidates | None]:
    memories, query = _vectors()
    found: dict[str, FoundCandidates | None] = {}
    async with open_database(settings.database) as db:
        async with db.sessions() as session:
            await ingest(session, None, DIM, NAMESPACE, [
                NewMemory(text=f"memory {i}", embedding=memories[i].tolist(),
                          metadata={"parity": "even" if i % 2 == 0 else "odd"})
                for i in range(MEMORIES)])
            await session.commit()
        step = SearchStep(db.sessions, settings.search)

        async def find(
            name: str, vector: np.ndarray, namespace: str = NAMESPACE,
            query_text: str = "where is it", filters: dict[str, str] | None = None,
        ) -> None:
            asked = RetrieveRequest(
                namespace=namespace, query=query_text, query_embedding=vector.tolist(),
                candidates=10, filters=filters,
            )
            found[name] = await step.find(asked, vector.astype(np.float32), None)

        await find("top", query)
        await find("filtered", query, filters={"parity": "odd"})
        await find("unknown namespace", query, namespace="never-written")
        pipeline = RetrievalPipeline(db.sessions, None, build_scorer(settings.scoring), settings,
                                     refit_in_request=True)
        await pipeline.retrieve(RetrieveRequest(
            namespace=NAMESPACE, query="where is it", query_embedding=query.tolist(),
            candidates=10, budget=4, k=5))
        await find("repeat", query)
        paraphrase = _unit(query + 0.05 * _unit(np.random.default_rng(8).normal(size=DIM)))
        await find("paraphrase", paraphrase, query_text="where could it be")
        await pipeline.scorer.aclose()
    return found


def test_the_search_step_finds_what_each_retrieve_needs(clean_database: str) -> None:
    settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                        _env_file=None)
    found = asyncio.run(_scenario(settings))

    top = found["top"]
    assert top is not None
    assert [row["text"] for row in top.candidates.rows] == [f"memory {i}" for i in range(10)]
    assert np.all(np.diff(top.candidates.similarities) <= 0)
    assert len(top.reused) == 0 and top.neighbours is not None and not top.neighbours.weights.any()

    filtered = found["filtered"]
    assert filtered is not None
    assert [row["text"] for row in filtered.candidates.rows] == [
        f"memory {i}" for i in range(1, 20, 2)
    ]

    assert found["unknown namespace"] is None

    repeat = found["repeat"]
    assert repeat is not None and repeat.family_key == top.family_key
    assert len(repeat.reused) == 4  # the first asking's four anchors, observed once each

    paraphrase = found["paraphrase"]
    assert paraphrase is not None and paraphrase.family_key != top.family_key
    assert paraphrase.neighbours is not None
    assert np.count_nonzero(paraphrase.neighbours.weights) == 4
