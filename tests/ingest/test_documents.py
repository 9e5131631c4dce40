"""Documents as memories by their text (service.ingest.documents), against the real database:
a text is stored once, however many calls see it for the first time at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import async_sessionmaker

from service.db import memories as memory_table
from service.db.engine import create_engine
from service.db.writes import Writes
from service.ingest.documents import document_ids
from service.providers.embedders import l2_normalise

REFRESH_S = 3600.0  # how stale a document's recorded sighting may be
TEXTS = [f"A text two calls see for the first time at once, number {i}." for i in range(6)]


class StandInEmbedder:
    """An embedder provider: a vector per text from its bytes."""

    model_id = "stand-in"
    dim = 384

    async def embed(self, texts: Sequence[str], *, bulk: bool = False) -> NDArray[np.float32]:
        rows = [np.frombuffer(t.encode()[:384].ljust(384, b"x"), np.uint8) + 1.0 for t in texts]
        return l2_normalise(np.array(rows))

    async def aclose(self) -> None:
        return None


def test_a_call_that_sees_texts_another_is_storing_waits_and_takes_its_memories(
    clean_database: str,
) -> None:
    """The other call stands in the middle of its store (text lock held, rows inserted, not
    committed): this one embeds, waits for the lock, and finds those rows instead of storing
    the texts a second time."""

    async def main() -> None:
        engine = create_engine(clean_database, 4)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        embedder = StandInEmbedder()
        try:
            # The namespace exists: creating it would queue the calls behind its creator.
            await document_ids(Writes(sessions), embedder, "ns", ["an earlier text"], REFRESH_S)
            async with sessions() as storing:
                await memory_table.lock_texts(storing, "ns")
                inserted = await memory_table.insert_memories(
                    storing, "ns", [None] * 6, TEXTS, list(await embedder.embed(TEXTS)),
                    ["stand-in"] * 6, [None] * 6, [{}] * 6,
                )
                seeing = asyncio.create_task(
                    document_ids(Writes(sessions), embedder, "ns", TEXTS, REFRESH_S)
                )
                await asyncio.sleep(0.5)
                assert not seeing.done(), "it waits for the text lock"
                await storing.commit()
            found = await seeing
            assert sorted(found.ids.values()) == sorted(m for m, _ in inserted)
            assert found.stored == 0
            async with sessions() as session:
                listed = await memory_table.memories_after(session, "ns", None, 100)
            assert len(listed) == len(TEXTS) + 1
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_concurrent_first_sights_agree_on_one_memory_per_text(clean_database: str) -> None:
    async def main() -> list[dict[str, int]]:
        engine = create_engine(clean_database, 8)
        writes = Writes(async_sessionmaker(engine, expire_on_commit=False))
        try:
            found = await asyncio.gather(*(
                document_ids(writes, StandInEmbedder(), "ns", TEXTS[i:] + TEXTS[:i], REFRESH_S)
                for i in range(4)
            ))
            return [documents.ids for documents in found]
        finally:
            await engine.dispose()

    answers = asyncio.run(main())
    assert all(ids == answers[0] for ids in answers) and set(answers[0]) == set(TEXTS)
    assert len(set(answers[0].values())) == len(TEXTS)
