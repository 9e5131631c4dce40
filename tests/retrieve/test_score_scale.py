"""One score scale: every observation records who scored it and the score as given; refits
learn each source's map to the common scale and store the scores on it; so the same stream
judged on a 0–1 scale and on a cross-encoder's compressed one is decided alike."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from sqlalchemy import text

from service.completion.scale import ScoreScale
from service.db.engine import open_database
from service.db.namespaces import erase_namespace
from service.db.scales import common_score_sql
from service.ingest.memories import NewMemory, ingest
from service.providers.factory import build_scorer
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

DIM = 384
TOPICS = 6
MEMORIES = 60
QUERIES = 48
K = 5


def _jitter(query: str, document: str) -> float:
    """A pair's own noise in [-0.05, 0.05], the same whoever asks."""
    digest = hashlib.blake2b(f"{query}\x1f{document}".encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "big") / 2**32 - 0.5) / 10


def judge(query: str, documents: list[str]) -> list[float | None]:
    """A near-binary judge: 0.9 where the memory's topic is the query's, 0.1 elsewhere."""
    topic = query.split()[1]
    return [(0.9 if d.endswith(f"topic {topic}") else 0.1) + _jitter(query, d) for d in documents]


def cross_encoder(query: str, documents: list[str]) -> list[float | None]:
    """The same judgements on a cross-encoder's scale: relevant around 0.2, the rest near 0.03."""
    return [0.01 + 0.22 * s for s in judge(query, documents) if s is not None]


ScoreFn = Callable[[str, list[str]], list[float | None]]


@dataclass(frozen=True)
class Replay:
    top: list[list[str]]  # each query's top k, by text
    anchors: list[set[str]]  # each query's scored memories, by text
    stored: list[tuple[str, float, float]]  # (scored_by, raw_score, score) of every cell
    scales: dict[str, list[float]]
    shares: list[float | None]  # each query's exploration share


async def _replay(database_url: str, namespace: str, *phases: ScoreFn) -> Replay:
    """``QUERIES`` retrieves of a namespace of ``MEMORIES`` memories, scored by each of
    ``phases`` in turn (an equal share of the queries each, as ``rerank:phase-<i>``)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(TOPICS, DIM))
    top: list[list[str]] = []
    shares: list[float | None] = []
    for phase, scores in enumerate(phases):
        with LoopbackServer(rerank_app(scores)) as server:
            settings = Settings(database_url=database_url, embedder="none", scorer="rerank",
                                scorer_base_url=server.url, scorer_model=f"phase-{phase}",
                                background_work=True, _env_file=None)
            scorer = build_scorer(settings.scoring)
            async with open_database(settings.database) as db:
                if phase == 0:
                    async with db.sessions() as session:
                        await ingest(session, None, DIM, namespace, [
                            NewMemory(text=f"memory {i} about topic {i % TOPICS}",
                                      embedding=(centres[i % TOPICS]
                                                 + 2 * rng.normal(size=DIM)).tolist())
                            for i in range(MEMORIES)])
                        await session.commit()
                pipeline = RetrievalPipeline(db.sessions, None, scorer, settings,
                                             refit_in_request=True)
                for _ in range(QUERIES // len(phases)):
                    topic = len(top) % TOPICS
                    result = await pipeline.retrieve(RetrieveRequest(
                        namespace=namespace, query=f"topic {topic}", k=K, candidates=30,
                        budget=8, order="relevance",
                        query_embedding=(centres[topic] + 2 * rng.normal(size=DIM)).tolist()))
                    top.append([m.text for m in result.memories])
                    shares.append(result.exploration_share)
            await scorer.aclose()
    async with open_database(settings.database) as db:
        async with db.engine.connect() as conn:
            anchors = (await conn.execute(text(
                "SELECT q.query_index, array_agg(m.text) FROM scores s "
                "JOIN queries q ON q.id = s.query_id JOIN memories m ON m.id = s.memory_id "
                "WHERE s.namespace = :ns GROUP BY q.query_index ORDER BY q.query_index"),
                {"ns": namespace})).all()
            stored = (await conn.execute(text(
                "SELECT scored_by, raw_score, score FROM scores WHERE namespace = :ns"),
                {"ns": namespace})).all()
            scales = (await conn.execute(text(
                "SELECT score_scales FROM namespaces WHERE name = :ns"),
                {"ns": namespace})).scalar_one()
        async with db.sessions() as session:
            # Erased, so the next replay can use the same name (which seeds its draws).
            await erase_namespace(session, namespace)
            await session.commit()
    return Replay(
        top, [set(a) for _, a in anchors], [tuple(r) for r in stored], scales, shares
    )


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def test_a_cross_encoders_scale_is_learned_and_its_scores_stored_on_the_common_one(
    clean_database: str,
) -> None:
    replay = asyncio.run(_replay(clean_database, "ns", cross_encoder))
    (source, (irrelevant, relevant, counted)), = replay.scales.items()
    assert source == "rerank:phase-0:clip"  # the scorer's backend, model and transform
    assert abs(irrelevant - (0.01 + 0.22 * 0.1)) < 0.01
    assert abs(relevant - (0.01 + 0.22 * 0.9)) < 0.01
    assert counted > 0
    scored_by, raw, common = (np.array(column) for column in zip(*replay.stored, strict=True))
    assert set(scored_by) == {source}
    assert raw.max() < 0.25  # kept as the scorer gave it
    # On the common scale the relevant cells are near 0.9 and the others near 0.1.
    relevant_cells = raw > 0.1
    assert np.all(common[relevant_cells] > 0.75) and np.all(common[~relevant_cells] < 0.25)


def test_the_same_stream_on_a_compressed_scale_is_decided_alike(clean_database: str) -> None:
    on_judge = asyncio.run(_replay(clean_database, "ns", judge))
    on_cross_encoder = asyncio.run(_replay(clean_database, "ns", cross_encoder))
    anchors = [_jaccard(a, b) for a, b in zip(on_judge.anchors, on_cross_encoder.anchors,
                                              strict=True)]
    tops = [_jaccard(set(a), set(b)) for a, b in zip(on_judge.top, on_cross_encoder.top,
                                                     strict=True)]
    # Within noise: the first queries run before any scale is fitted (the cross-encoder's
    # scores taken as they are), so a few decisions differ, and the data after them with.
    assert np.mean(anchors) >= 0.85, anchors
    assert np.mean(tops) >= 0.85, tops
    # The share the anchor rule explores is learned from what the anchors found (a score of
    # 0.5 or more on the common scale): taken as they are, the cross-encoder's scores never
    # find anything, and its share would stay where the first queries left it.
    np.testing.assert_allclose(on_cross_encoder.shares[8:], on_judge.shares[8:], atol=0.01)


async def _mapped_in_sql(database_url: str, raw: list[float], scale: ScoreScale) -> list[float]:
    settings = Settings(database_url=database_url, embedder="none", _env_file=None)
    expression = common_score_sql("r", "CAST(:scale AS jsonb)")
    async with open_database(settings.database) as db, db.engine.connect() as conn:
        rows = await conn.execute(
            text(f"SELECT {expression} FROM unnest(CAST(:raw AS float8[])) AS t(r)"),
            {"raw": raw, "scale": json.dumps(scale.as_json())},
        )
        return [float(r[0]) for r in rows]


@pytest.mark.parametrize(
    "scale", [ScoreScale(0.03, 0.21, 50), ScoreScale(0.0, 0.8, 50), ScoreScale(0.1, 1.0, 50)],
    ids=["inside", "irrelevant-at-0", "relevant-at-1"],
)
def test_the_records_sql_maps_scores_as_the_ranking_does(
    clean_database: str, scale: ScoreScale
) -> None:
    raw = [0.0, 1e-31, 0.01, 0.03, 0.1, 0.21, 0.5, 0.8, 0.99, 1.0]
    np.testing.assert_allclose(
        asyncio.run(_mapped_in_sql(clean_database, raw, scale)),
        scale.common(np.array(raw)), atol=1e-12,
    )


def test_a_namespace_whose_scorer_changes_learns_the_new_ones_scale_apart(
    clean_database: str,
) -> None:
    replay = asyncio.run(_replay(clean_database, "ns", judge, cross_encoder))
    judged, cross_encoded = (replay.scales[f"rerank:phase-{i}:clip"] for i in (0, 1))
    assert abs(judged[1] - 0.9) < 0.02 and abs(cross_encoded[1] - (0.01 + 0.22 * 0.9)) < 0.02
    scored_by, raw, common = (np.array(column) for column in zip(*replay.stored, strict=True))
    # Each source's relevant cells are found relevant on the common scale (0.5 or more),
    # whatever it answered, and the rest are not. (The new scorer scores a namespace that
    # already knows its relevant memories: its anchors are nearly all relevant, whose noise
    # its two clusters then split, so its relevant cells spread wider than 0.9 ± 0.05.)
    for source, relevant_raw in (("rerank:phase-0:clip", 0.5), ("rerank:phase-1:clip", 0.1)):
        cells = scored_by == source
        relevant = cells & (raw > relevant_raw)
        assert relevant.any() and np.all(common[relevant] >= 0.5)
        assert np.all(common[cells & ~relevant] < 0.25)
