"""The clients of ``earm bench load-mix``: a random mix of ingests, retrieves and feedback over
the run's namespaces (and, with the deletes fault, deletes), each answer written down in the
namespace's ledger and every request on the run's clock."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from earm_bench.common.http import error_code
from earm_bench.load_mix.config import OPERATIONS, LoadMixConfig
from earm_bench.load_mix.faults import FaultInjector
from earm_bench.load_mix.ledger import Answer, Event, NamespaceLedger, OperationStats

TOPICS = 8
#: After a 503 a client waits its Retry-After, but at most this long: the recovery from an
#: outage is then timed to within a fraction of a second.
MAX_BACKOFF_S = 1.0


@dataclass
class _Client:
    """One client's random streams and request counter."""

    number: int
    rng: np.random.Generator
    pick: random.Random
    sequence: int = 0

    @property
    def tag(self) -> str:
        return f"{self.number}-{self.sequence}"


def _backoff(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", "")), MAX_BACKOFF_S)
    except ValueError:  # absent, or an HTTP date
        return MAX_BACKOFF_S


class Driver:
    def __init__(self, base_url: str, config: LoadMixConfig, run_id: str,
                 faults: FaultInjector | None = None) -> None:
        self.base_url = base_url
        self.config = config
        self.faults = faults
        self.names = [f"loadmix-{run_id}-{i}" for i in range(config.namespaces)]
        self.ledgers = {name: NamespaceLedger() for name in self.names}
        operations = (*OPERATIONS, "delete") if config.faults.deletes else OPERATIONS
        self.stats = {op: OperationStats() for op in operations}
        self.events: list[Event] = []
        self.problems: list[str] = []
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        centres = np.random.default_rng(config.seed).normal(size=(TOPICS, config.dim))
        self.topics = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        self.started = time.monotonic()

    def clock(self) -> float:
        """Seconds since the load started (negative while seeding)."""
        return time.monotonic() - self.started

    def _vector(self, rng: np.random.Generator) -> list[float]:
        """A vector near one of a few topic centres, so relevance has structure to learn
        (unstructured random vectors all score alike)."""
        centre = self.topics[rng.integers(len(self.topics))]
        noise = rng.normal(size=self.config.dim)
        vector = centre + 0.6 * noise / np.linalg.norm(noise)
        values: list[float] = vector.round(5).tolist()  # numpy types tolist() as Any
        return values

    async def _call(self, client: httpx.AsyncClient, op: str, name: str, path: str,
                    body: dict[str, Any] | None = None, method: str = "POST") -> Any:
        """The JSON answer (``{}`` for 204), or None after writing down the failure."""
        started = self.clock()
        try:
            response = await client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            error = type(exc).__name__
            self._failed(op, name, started, error, None, f"{error}: {exc}")
            return None
        if response.is_success:
            answer = response.json() if response.content else {}
            self.stats[op].ok += 1
            self.stats[op].latencies_ms.append((self.clock() - started) * 1000)
            degraded = answer.get("degraded") if op == "retrieve" else None
            self.events.append(Event(op, name, started, self.clock(), "ok", False, degraded))
            return answer
        outcome = f"{response.status_code} {error_code(response)}"
        self._failed(op, name, started, outcome, response.status_code,
                     f"{response.status_code} {response.text[:300]}")
        if response.status_code == 503:
            await asyncio.sleep(_backoff(response))
        return None

    def _failed(self, op: str, name: str, started: float, outcome: str, status: int | None,
                detail: str) -> None:
        ended = self.clock()
        expected = (status is not None and self.faults is not None
                    and self.faults.expected(op, status, ended))
        self.events.append(Event(op, name, started, ended, outcome, expected))
        if status is None or status >= 500:  # it may have committed all the same
            self.ledgers[name].in_doubt[op] += 1
        if expected:
            self.stats[op].expected[outcome] += 1
            return
        self.stats[op].errors[outcome] += 1
        if len(self.problems) < 50:
            self.problems.append(f"{op}: {detail}")

    async def seed(self, client: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(self.config.seed)
        for name in self.names:
            memories = [{"text": f"seed memory {i} of {name}", "embedding": self._vector(rng)}
                        for i in range(self.config.seed_memories)]
            body = await self._call(client, "ingest", name, "/memories",
                                    {"namespace": name, "memories": memories})
            if body is None:
                raise RuntimeError(f"seeding {name} failed: {self.problems[-1:]}")
            self.ledgers[name].seeded = body["created"]
            self.ledgers[name].memory_ids.extend(body["ids"])

    async def _ingest(self, client: httpx.AsyncClient, state: _Client, name: str) -> None:
        memories = [
            {"text": f"memory {state.tag}-{i}", "external_id": f"c{state.tag}-{i}",
             "embedding": self._vector(state.rng), "metadata": {"client": state.number}}
            for i in range(self.config.batch)
        ]
        body = await self._call(client, "ingest", name, "/memories",
                                {"namespace": name, "memories": memories})
        if body is not None:
            self.ledgers[name].created += body["created"]
            self.ledgers[name].memory_ids.extend(body["ids"])

    async def _retrieve(self, client: httpx.AsyncClient, state: _Client, name: str) -> None:
        started = self.clock()
        body = await self._call(client, "retrieve", name, "/retrieve", {
            "namespace": name,
            "query": f"question {state.tag}",
            "query_embedding": self._vector(state.rng),
            "candidates": self.config.candidates,
            "k": self.config.k,
            "seed": state.sequence,
        })
        if body is None:
            return
        memories = body["memories"]
        self.ledgers[name].retrieves.append(Answer(
            body["query_id"], body["query_index"], body["scorer_calls"], body["degraded"],
            [m["id"] for m in memories], [m["id"] for m in memories if m["source"] == "observed"],
            started,
        ))
        if memories and self.faults is not None and self.faults.is_deleter(state.number):
            await self._delete(client, name, state.pick.choice(memories)["id"])

    async def _delete(self, client: httpx.AsyncClient, name: str, memory_id: int) -> None:
        if await self._call(client, "delete", name, f"/memories/{memory_id}",
                            method="DELETE") is not None:
            self.ledgers[name].deleted[memory_id] = self.clock()

    async def _feedback(self, client: httpx.AsyncClient, state: _Client, name: str) -> None:
        ledger, pick = self.ledgers[name], state.pick
        answer = pick.choice(ledger.retrieves)
        chosen = pick.sample(answer.memory_ids, k=min(len(answer.memory_ids), pick.randint(1, 3)))
        chosen = [m for m in chosen if m not in ledger.deleted]  # as far as this client knows
        if not chosen:
            return
        scores = [{"memory_id": m, "score": round(pick.random(), 3)} for m in chosen]
        body = await self._call(client, "feedback", name, "/feedback",
                                {"namespace": name, "query_id": answer.query_id, "scores": scores})
        if body is not None:
            # Only new cells add rows: a score that replaced an observation rewrote its row.
            ledger.feedback_recorded += body["recorded"] - body["replaced"]
            ledger.feedback_pairs.update((answer.query_id, m) for m in chosen)

    async def client_loop(self, client: httpx.AsyncClient, number: int, deadline: float) -> None:
        state = _Client(number, np.random.default_rng([self.config.seed, number]),
                        random.Random(f"{self.config.seed}-{number}"))
        while time.monotonic() < deadline:
            state.sequence += 1
            name = state.pick.choice(self.names)
            op = state.pick.choices(OPERATIONS, weights=self.config.mix)[0]
            if op == "feedback" and not self.ledgers[name].retrieves:
                op = "retrieve"
            operation = {"ingest": self._ingest, "retrieve": self._retrieve,
                         "feedback": self._feedback}[op]
            await operation(client, state, name)

    async def run(self) -> float:
        limits = httpx.Limits(max_connections=self.config.clients + 1)
        async with httpx.AsyncClient(
            base_url=self.base_url,
            timeout=self.config.timeout_s,
            limits=limits,
            headers=self.headers,
        ) as client:
            await self.seed(client)
            self.started = time.monotonic()
            deadline = self.started + self.config.seconds
            loops = [self.client_loop(client, n, deadline) for n in range(self.config.clients)]
            if self.faults is not None:
                loops.append(self.faults.inject(self.clock))
            await asyncio.gather(*loops)
            return time.monotonic() - self.started
