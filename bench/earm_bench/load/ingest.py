"""The ingest phase of ``earm bench load``: the service's two ingest paths and the raw COPY
floor, each after the last one's housekeeping, so none pays for another."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from earm_bench.common.cli import progress
from earm_bench.common.http import check
from earm_bench.common.stats import percentiles
from earm_bench.load.database import analyze, settle, until_indexed
from earm_bench.load.session import LoadRun


def _row(path: str, memories: int, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    return {
        "path": path,
        "memories": memories,
        "batch": batch,
        "clients": clients,
        "seconds": round(seconds, 2),
        "memories_per_s": round(memories / seconds, 1),
    }


def _bodies(run: LoadRun, starts: list[int]) -> dict[int, bytes]:
    """The JSON bodies of the ingest batches, by first memory."""
    config, world = run.config, run.world
    return {
        start: json.dumps({
            "namespace": run.namespace,
            "memories": [
                {
                    "text": world.memory_text(i, int(world.memory_topics[i])),
                    "external_id": f"m{i}",
                    "embedding": world.memory_embeddings[i].astype(np.float64).round(6).tolist(),
                    "metadata": {"topic": int(world.memory_topics[i])},
                }
                for i in range(start, min(config.memories, start + config.ingest_batch))
            ],
        }).encode()
        for start in starts
    }


async def ingest_vectors(run: LoadRun) -> dict[str, Any]:
    """POST /memories with client vectors (and external ids), ``ingest_clients`` batches
    in flight. The bodies are encoded before the clock starts, so the bench's own JSON
    encoding does not compete with the service for the machine."""
    config = run.config
    starts = list(range(0, config.memories, config.ingest_batch))
    bodies = _bodies(run, starts)
    bar = progress(config.memories, "ingest (client vectors)", config.progress)
    latencies: list[float] = []

    async def post(start: int) -> None:
        stop = min(config.memories, start + config.ingest_batch)
        began = time.perf_counter()
        result = check(await run.client.post(
            "/memories", content=bodies.pop(start), headers={"content-type": "application/json"},
        ))
        latencies.append((time.perf_counter() - began) * 1000)
        run.memory_ids[start:stop] = result["ids"]
        bar.update(stop - start)

    async def worker() -> None:
        while starts:
            await post(starts.pop(0))

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(config.ingest_clients)))
    seconds = time.perf_counter() - began
    bar.close()
    return _row("POST /memories, client vectors", config.memories, config.ingest_batch,
                config.ingest_clients, seconds) | {"batch_ms": percentiles(latencies)}


async def ingest_copy_floor(run: LoadRun) -> dict[str, Any]:
    """The ingest floor: raw binary COPYs of rows like the service's into ``memories``
    (same table and indexes; unindexed rows, as the service writes them, so the HNSW
    insert is the background indexer's) in a namespace of its own, as many streams in
    parallel as the service ingest had batches in flight."""
    config = run.config
    n = config.copy_memories
    namespace = run.namespace + "-copy"
    rng = np.random.default_rng([config.seed, 5])
    topics = rng.integers(config.topics, size=n)
    vectors = run.world.embeddings(rng, topics)
    starts = list(range(0, n, config.ingest_batch))

    async def worker(conn: Any) -> None:
        while starts:
            start = starts.pop(0)
            async with conn.cursor() as cursor, cursor.copy(
                "COPY memories (namespace, external_id, text, embedding, embedding_model, "
                "metadata) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "text", "text", "vector", "text", "jsonb"])
                for i in range(start, min(n, start + config.ingest_batch)):
                    await copy.write_row((
                        namespace, f"c{i}", run.world.memory_text(i, int(topics[i])),
                        vectors[i], "client", {"topic": int(topics[i])},
                    ))

    async with run.connections(config.ingest_clients) as connections:
        await connections[0].execute("INSERT INTO namespaces (name) VALUES (%s)", (namespace,))
        began = time.perf_counter()
        await asyncio.gather(*(worker(conn) for conn in connections))
        seconds = time.perf_counter() - began
    return _row("floor: raw binary COPY, same table (unindexed rows)", n, config.ingest_batch,
                config.ingest_clients, seconds)


async def ingest_embedded(run: LoadRun) -> dict[str, Any]:
    """POST /memories with text only: the service's local embedder computes the vectors."""
    config = run.config
    texts = run.world.chatter(config.embed_memories)
    bar = progress(len(texts), "ingest (local embedder)", config.progress)
    began = time.perf_counter()
    for start in range(0, len(texts), config.ingest_batch):
        chunk = texts[start : start + config.ingest_batch]
        check(await run.client.post("/memories", json={
            "namespace": run.namespace + "-embed",
            "memories": [{"text": t, "external_id": f"e{start + i}"} for i, t in enumerate(chunk)],
        }))
        bar.update(len(chunk))
    seconds = time.perf_counter() - began
    bar.close()
    return _row("POST /memories, text only (local embedder)", len(texts), config.ingest_batch,
                1, seconds)


async def ingest_phase(run: LoadRun) -> list[dict[str, Any]]:
    """Every ingest path, in turn; the report's ``ingest`` rows."""
    config = run.config
    began = time.perf_counter()
    rows = [await ingest_vectors(run)]
    await until_indexed(run)
    rows.append(_row("POST /memories, client vectors, until all are in the HNSW index",
                     config.memories, config.ingest_batch, config.ingest_clients,
                     time.perf_counter() - began))
    await analyze(run)
    rows.append(await ingest_copy_floor(run))
    await settle(run)
    if config.embed_memories:
        rows.append(await ingest_embedded(run))
    return rows
