"""The clients of ``earm bench load-mix``: a random mix of ingests, retrieves and feedback over
the run's namespaces, each answer written down in the namespace's ledger."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import numpy as np

from service.bench.common.http import error_code
from service.bench.load_mix.config import OPERATIONS, LoadMixConfig
from service.bench.load_mix.ledger import Answer, NamespaceLedger, OperationStats

TOPICS = 8


class Driver:
    def __init__(self, base_url: str, config: LoadMixConfig, run_id: str) -> None:
        self.base_url = base_url
        self.config = config
        self.names = [f"loadmix-{run_id}-{i}" for i in range(config.namespaces)]
        self.ledgers = {name: NamespaceLedger() for name in self.names}
        self.stats = {op: OperationStats() for op in OPERATIONS}
        self.problems: list[str] = []
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        centres = np.random.default_rng(config.seed).normal(size=(TOPICS, config.dim))
        self.topics = centres / np.linalg.norm(centres, axis=1, keepdims=True)

    def _vector(self, rng: np.random.Generator) -> list[float]:
        """A vector near one of a few topic centres, so relevance has structure to learn
        (unstructured random vectors all score alike)."""
        centre = self.topics[rng.integers(len(self.topics))]
        noise = rng.normal(size=self.config.dim)
        vector = centre + 0.6 * noise / np.linalg.norm(noise)
        return vector.round(5).tolist()

    async def _call(
        self, client: httpx.AsyncClient, op: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        started = time.perf_counter()
        try:
            response = await client.post(path, json=body)
        except httpx.HTTPError as exc:
            self.stats[op].errors[type(exc).__name__] += 1
            self._problem(f"{op}: {type(exc).__name__}: {exc}")
            return None
        elapsed = (time.perf_counter() - started) * 1000
        if response.is_success:
            self.stats[op].ok += 1
            self.stats[op].latencies_ms.append(elapsed)
            return response.json()
        self.stats[op].errors[f"{response.status_code} {error_code(response)}"] += 1
        self._problem(f"{op}: {response.status_code} {response.text[:300]}")
        return None

    def _problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)

    async def seed(self, client: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(self.config.seed)
        for name in self.names:
            memories = [{"text": f"seed memory {i} of {name}", "embedding": self._vector(rng)}
                        for i in range(self.config.seed_memories)]
            body = await self._call(client, "ingest", "/memories",
                                    {"namespace": name, "memories": memories})
            if body is None:
                raise RuntimeError(f"seeding {name} failed: {self.problems[-1:]}")
            self.ledgers[name].seeded = body["created"]
            self.ledgers[name].memory_ids.extend(body["ids"])

    async def _ingest(self, client: httpx.AsyncClient, name: str, tag: str,
                      rng: np.random.Generator, number: int) -> None:
        memories = [
            {"text": f"memory {tag}-{i}", "external_id": f"c{tag}-{i}",
             "embedding": self._vector(rng), "metadata": {"client": number}}
            for i in range(self.config.batch)
        ]
        body = await self._call(client, "ingest", "/memories",
                                {"namespace": name, "memories": memories})
        if body is not None:
            self.ledgers[name].created += body["created"]
            self.ledgers[name].memory_ids.extend(body["ids"])

    async def _retrieve(self, client: httpx.AsyncClient, name: str, tag: str,
                        rng: np.random.Generator, sequence: int) -> None:
        body = await self._call(client, "retrieve", "/retrieve", {
            "namespace": name,
            "query": f"question {tag}",
            "query_embedding": self._vector(rng),
            "candidates": self.config.candidates,
            "k": self.config.k,
            "seed": sequence,
        })
        if body is not None:
            self.ledgers[name].retrieves.append(Answer(
                body["query_id"], body["query_index"], body["scorer_calls"], body["degraded"],
                [m["id"] for m in body["memories"]],
            ))

    async def _feedback(self, client: httpx.AsyncClient, name: str, pick: random.Random) -> None:
        answer = pick.choice(self.ledgers[name].retrieves)
        chosen = pick.sample(answer.memory_ids,
                             k=min(len(answer.memory_ids), pick.randint(1, 3)))
        if not chosen:
            return
        scores = [{"memory_id": m, "score": round(pick.random(), 3)} for m in chosen]
        body = await self._call(client, "feedback", "/feedback",
                                {"namespace": name, "query_id": answer.query_id, "scores": scores})
        if body is not None:
            self.ledgers[name].feedback_recorded += body["recorded"]

    async def client_loop(self, client: httpx.AsyncClient, number: int, deadline: float) -> None:
        rng = np.random.default_rng([self.config.seed, number])
        pick = random.Random(f"{self.config.seed}-{number}")
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            name = pick.choice(self.names)
            op = pick.choices(OPERATIONS, weights=self.config.mix)[0]
            if op == "feedback" and not self.ledgers[name].retrieves:
                op = "retrieve"
            tag = f"{number}-{sequence}"
            if op == "ingest":
                await self._ingest(client, name, tag, rng, number)
            elif op == "retrieve":
                await self._retrieve(client, name, tag, rng, sequence)
            else:
                await self._feedback(client, name, pick)

    async def run(self) -> float:
        limits = httpx.Limits(max_connections=self.config.clients + 1)
        async with httpx.AsyncClient(
            base_url=self.base_url,
            timeout=self.config.timeout_s,
            limits=limits,
            headers=self.headers,
        ) as client:
            await self.seed(client)
            started = time.monotonic()
            deadline = started + self.config.seconds
            await asyncio.gather(
                *(self.client_loop(client, n, deadline) for n in range(self.config.clients))
            )
            return time.monotonic() - started
