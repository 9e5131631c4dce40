"""Behaviour pin for restructurings: one recorded workload, replayed through the HTTP API, gives
the recorded responses and the recorded stored state, so a change meant to keep behaviour can
show that it did.

The workload runs sequentially against an in-process app on the clean test database: ingests in
batches (client vectors and memories the local embedder embeds, an idempotent re-ingest),
retrieves of every policy with their options (k, order, filters, budget, seed, candidates),
feedback, listing pages, a delete, /stats and a few refused requests. Refits run inside the
request that makes them due (``create_app(settings, refit_in_request=True)``) and the scorer
is a loopback chat-completions judge whose score is a pure function of the (query, memory)
pair, so every response and every stored row is reproducible. Its canonical snapshot (see
:func:`canonical` and :func:`stored_state`) is compared with
``tests/data/behaviour_snapshot.json``; a mismatch names the first differing path.

A change that only moves code must pass unchanged. Re-record only for an intended behaviour
change, and say in the commit which change it is::

    EARM_RECORD_SNAPSHOT=1 pytest tests/test_behaviour_snapshot.py

rewrites the golden file (the test then reports itself skipped, so a recording never passes
for a check).

Imports are kept to the app factory, the settings and the loopback judge helpers (``bench``):
the modules behind them may move without this file knowing.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from earm_bench.locomo.judge import NoiseModel, oracle_score
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

#: One golden file per anchor rule: the paper's one round pins the behaviour the snapshot was
#: first recorded with, the learned two rounds the default.
GOLDEN = {
    "paper": Path(__file__).parent / "data" / "behaviour_snapshot.json",
    "learned": Path(__file__).parent / "data" / "behaviour_snapshot_learned.json",
}
RECORD = os.environ.get("EARM_RECORD_SNAPSHOT") == "1"

# Floats are rounded to this many decimals (the golden file stays readable) and compared within
# FLOAT_TOLERANCE: the order of float reductions is the only tolerated source of difference
# between replays. BLAS threads, and float32 work whose kernels follow the CPU's features
# (pgvector's distances, the int8 ONNX embedder), move values in the 7th significant digit:
# 1.3e-7 at most between an AMD EPYC and the Intel Xeon a golden file was recorded on. A
# behaviour change moves them by far more.
FLOAT_DECIMALS = 9
FLOAT_TOLERANCE = {"rel_tol": 1e-5, "abs_tol": 1e-6}
# Set by the server's clock: only whether they are set is reproducible.
CLOCK_FIELDS = frozenset({
    "created_at", "last_refit_at", "retired_at", "observed_at", "replaced_at", "content_changed_at"
})
# Stored as a sketch (the raw vectors would make the golden file large); model parameters
# (factors, biases, content weights) and scores are kept as values.
SKETCHED_COLUMNS = frozenset({"embedding"})
STATE_TABLES = (
    "namespaces", "memories", "queries", "query_factors", "scores", "score_history",
    "memory_factors",
)

DIM = 384
# A sketch's projections: any change of a vector beyond float noise moves them.
SKETCH = np.random.default_rng(0).standard_normal((8, DIM))
VECTORS, TEXTS = "agent-vectors", "agent-texts"
TOPICS = ("garden", "travel", "finance", "health")
POLICIES = ("semantic", "observed", "earm", "full")
N_RETRIEVES = 32
START = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)

# Memories the local embedder embeds, (topic, text); every fourth is ingested without an
# external id (run_workload).
TEXT_MEMORIES = [
    ("garden", "The tomatoes on the balcony need watering every second evening."),
    ("garden", "Roses were pruned in March and fed with bone meal."),
    ("garden", "The compost heap behind the shed is ready to be turned."),
    ("garden", "Slugs ate most of the lettuce seedlings last spring."),
    ("travel", "The flight to Lisbon leaves at 7:40 from terminal 2."),
    ("travel", "Passport expires in November; renewal takes six weeks."),
    ("travel", "The hotel in Porto offered a late checkout at noon."),
    ("travel", "Train tickets to Madrid are cheaper when booked a month ahead."),
    ("finance", "Rent of 1,150 euros is due on the first of each month."),
    ("finance", "The savings account pays 2.1 percent interest a year."),
    ("finance", "Tax return documents are kept in the blue folder."),
    ("finance", "The electricity bill rose by twelve percent in January."),
    ("health", "The dentist appointment is on Tuesday at half past three."),
    ("health", "Allergic to penicillin; ibuprofen is fine."),
    ("health", "Runs five kilometres on Sunday mornings along the river."),
    ("health", "The physiotherapist recommended stretching the left knee daily."),
]
TEXT_QUERIES = [
    ("garden", "When should I water the tomato plants?"),
    ("travel", "What time is my flight to Lisbon?"),
    ("finance", "How much is the monthly rent?"),
    ("health", "Which medicines am I allergic to?"),
    ("garden", "What happened to the lettuce?"),
    ("travel", "How long does a passport renewal take?"),
    ("finance", "Where are the tax papers?"),
    ("health", "What exercise do I do on weekends?"),
    ("garden", "Is the compost ready?"),
    ("travel", "Where did we stay in Porto?"),
    ("finance", "What interest does the savings account pay?"),
    ("health", "When is the next dentist visit?"),
]


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


class SyntheticTopics:
    """Clustered client vectors, one cluster per topic, from a seeded RNG. Every tenth memory
    sits in the next topic's cluster while being about its own topic: relevance the judge
    reveals and semantic search cannot see."""

    def __init__(self, seed: int = 20240613) -> None:
        self.rng = np.random.default_rng(seed)
        self.centers = [unit(self.rng.normal(size=DIM)) for _ in TOPICS]

    def near(self, topic: int) -> list[float]:
        return unit(self.centers[topic] + 0.9 * unit(self.rng.normal(size=DIM))).tolist()

    def memory(self, i: int) -> dict[str, Any]:
        topic = i % len(TOPICS)
        cluster = (topic + 1) % len(TOPICS) if i % 10 == 9 else topic
        occurred = None if i % 5 == 4 else (START + timedelta(hours=7 * i)).isoformat()
        return {
            "text": f"vector note {i:02d} about {TOPICS[topic]}",
            "embedding": self.near(cluster),
            "external_id": f"v{i:02d}",
            "occurred_at": occurred,
            "metadata": {"topic": TOPICS[topic], "kind": "fact" if i % 3 == 0 else "chat"},
        }


class PairJudge:
    """The relevance LLM: finds the known query and memory texts in the prompt and answers
    bench.judge's noisy oracle score of the pair (same topic = relevant), deterministic per
    pair whatever the call order or concurrency."""

    def __init__(self) -> None:
        self.query_topics: dict[str, str] = {}
        self.memory_topics: dict[str, str] = {}
        self.noise = NoiseModel(miss=0.1, false=0.05, noise=0.1, seed=13)
        self.unidentified: list[str] = []

    def reply(self, prompt: str) -> str:
        query = max((q for q in self.query_topics if q in prompt), key=len, default=None)
        memory = max((m for m in self.memory_topics if m in prompt), key=len, default=None)
        if query is None or memory is None:
            self.unidentified.append(prompt)
            return "0"
        relevant = self.query_topics[query] == self.memory_topics[memory]
        return f"{oracle_score(relevant, f'{query}|{memory}', self.noise):.3f}"


@pytest.fixture
def judge() -> Iterator[tuple[PairJudge, str]]:
    pair_judge = PairJudge()
    with LoopbackServer(chat_completions_app(pair_judge.reply)) as server:
        yield pair_judge, server.url


def canonical(value: Any) -> Any:
    """A JSON value without what cannot repeat: ``*_ms`` timings dropped, server-clock times
    replaced by whether they are set, floats rounded to FLOAT_DECIMALS."""
    if isinstance(value, dict):
        return {
            key: (None if item is None else "<clock>") if key in CLOCK_FIELDS else canonical(item)
            for key, item in value.items()
            if not key.endswith("_ms")
        }
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    if isinstance(value, float):
        return round(value, FLOAT_DECIMALS)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):  # bytea columns (queries.family_key)
        return value.hex()
    return value


def vector_sketch(vector: list[float]) -> list[float]:
    """A vector as its length and 8 random projections: compared within FLOAT_TOLERANCE like
    every other float, where a digest of the values failed on float noise."""
    values = np.asarray(vector, dtype=np.float64)
    return [float(len(values)), *(SKETCH @ values).tolist()]


def stored_state(database_url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of the model's tables, by primary key, columns as the schema has them
    (vectors read as float arrays; `embedding` columns as sketches)."""
    engine = create_engine(database_url)
    state: dict[str, list[dict[str, Any]]] = {}
    with engine.connect() as conn:
        for table in STATE_TABLES:
            columns = conn.execute(
                text(
                    "SELECT column_name, udt_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = :table "
                    "ORDER BY ordinal_position"
                ),
                {"table": table},
            ).all()
            primary_key = conn.execute(
                text(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                    "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = CAST(:table AS regclass) AND i.indisprimary "
                    "ORDER BY array_position(i.indkey::int2[], a.attnum)"
                ),
                {"table": table},
            ).scalars().all()
            selected = ", ".join(
                f'"{name}"::real[] AS "{name}"' if udt == "vector" else f'"{name}"'
                for name, udt in columns
            )
            order = ", ".join(f'"{name}"' for name in primary_key)
            rows = conn.execute(text(f"SELECT {selected} FROM {table} ORDER BY {order}"))
            state[table] = [
                {
                    name: vector_sketch(value) if name in SKETCHED_COLUMNS else value
                    for name, value in row._mapping.items()
                }
                for row in rows
            ]
    engine.dispose()
    return canonical(state)


def without_vectors(body: Any) -> Any:
    """A request body as the snapshot shows it: client vectors elided."""
    if isinstance(body, dict):
        return {
            key: f"<{len(item)} floats>"
            if key in ("embedding", "query_embedding")
            else without_vectors(item)
            for key, item in body.items()
        }
    if isinstance(body, list):
        return [without_vectors(item) for item in body]
    return body


class Replay:
    """Sends the workload's requests and records each exchange canonically."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.exchanges: list[dict[str, Any]] = []

    def send(self, method: str, path: str, *, json_body: Any = None, params: Any = None) -> Any:
        response = self.client.request(method, path, json=json_body, params=params)
        body = response.json() if response.content else None
        request = {
            "method": method, "path": path, "params": params, "json": without_vectors(json_body)
        }
        self.exchanges.append(
            {"request": request, "status": response.status_code, "body": canonical(body)}
        )
        return body

    def settle_indexing(self, namespace: str) -> None:
        """Wait (unrecorded) until the background indexer has indexed the namespace, so the
        stored `indexed` flags and /stats' backlog do not depend on its timing."""
        deadline = time.monotonic() + 30
        while self.client.get("/stats", params={"namespace": namespace}).json()[
            "memories_unindexed"
        ]:
            assert time.monotonic() < deadline, f"the indexer did not catch up on {namespace}"
            time.sleep(0.02)

    def ingest(self, namespace: str, memories: list[dict[str, Any]]) -> list[int]:
        body = self.send(
            "POST", "/memories", json_body={"namespace": namespace, "memories": memories}
        )
        self.settle_indexing(namespace)
        return body["ids"]

    def list_all(self, namespace: str, limit: int) -> None:
        params: dict[str, Any] = {"namespace": namespace, "limit": limit}
        while (page := self.send("GET", "/memories", params=params))["next_cursor"]:
            params = params | {"cursor": page["next_cursor"]}

    def stats(self, namespace: str | None) -> None:
        for settled in (VECTORS, TEXTS) if namespace is None else (namespace,):
            self.settle_indexing(settled)
        self.send("GET", "/stats", params=None if namespace is None else {"namespace": namespace})


def retrieve_request(i: int, topics: SyntheticTopics) -> tuple[str, dict[str, Any]]:
    """The i-th retrieve of the workload (its topic, its body): policies in turn, every third
    on the embedder's namespace, the options varied with periods that do not divide the
    policies' so that each meets every policy."""
    policy = POLICIES[i % len(POLICIES)]
    body: dict[str, Any] = {"policy": policy, "k": (5, 8, 10)[i % 3], "seed": i % 3}
    body["order"] = ("chronological", "relevance")[i // len(POLICIES) % 2]
    if i % 5 == 3:
        body["filters"] = {"kind": "fact"}
    if policy in ("earm", "observed") and i % 5 == 1:
        body["budget"] = 3
    if i % 3 == 2:
        topic, query = TEXT_QUERIES[i // 3]
        return topic, body | {"namespace": TEXTS, "query": query}
    topic_index = i % len(TOPICS)
    if i % 9 == 4:
        body["candidates"] = 20  # below the namespace's size: the HNSW path
    return TOPICS[topic_index], body | {
        "namespace": VECTORS,
        "query": f"question {i:02d} on {TOPICS[topic_index]}",
        "query_embedding": topics.near(topic_index),
    }


class Retrieved(NamedTuple):
    topic: str
    request: dict[str, Any]
    response: dict[str, Any]


def run_workload(client: TestClient, judge: PairJudge) -> list[dict[str, Any]]:
    replay = Replay(client)
    topics = SyntheticTopics()
    vector_memories = [topics.memory(i) for i in range(40)]
    judge.memory_topics |= {m["text"]: m["metadata"]["topic"] for m in vector_memories}
    text_memories = [
        {"text": memory, "metadata": {"topic": topic, "kind": "fact" if i % 2 else "chat"}}
        | ({} if i % 4 == 3 else {"external_id": f"t{i:02d}"})
        for i, (topic, memory) in enumerate(TEXT_MEMORIES)
    ]
    judge.memory_topics |= {memory: topic for topic, memory in TEXT_MEMORIES}

    replay.send("GET", "/readyz")
    replay.ingest(VECTORS, vector_memories[:20])
    replay.ingest(TEXTS, text_memories)
    replay.ingest(TEXTS, [m for m in text_memories if "external_id" in m])  # idempotent: all exist

    results: list[Retrieved] = []
    for i in range(N_RETRIEVES):
        topic, request = retrieve_request(i, topics)
        judge.query_topics[request["query"]] = topic
        response = replay.send("POST", "/retrieve", json_body=request)
        results.append(Retrieved(topic, request, response))
        if i == 9:
            replay.ingest(VECTORS, vector_memories[:4] + vector_memories[20:32])  # 4 exist already
        if i == 13:
            give_feedback(replay, results[-2])
            give_feedback(replay, results[-2])  # the same cells again: already observed
        if i == 17:
            replay.list_all(VECTORS, limit=25)
            replay.list_all(TEXTS, limit=7)
            delete_scored_memory(replay, results)
        if i == 23:
            replay.ingest(VECTORS, vector_memories[32:])  # cold memories: the content prior
            replay.stats(VECTORS)
    give_feedback(replay, next(r for r in reversed(results) if r.request["policy"] == "semantic"))
    refused_requests(replay, results)
    replay.list_all(VECTORS, limit=100)
    for namespace in (VECTORS, TEXTS, None):
        replay.stats(namespace)
    return replay.exchanges


def give_feedback(replay: Replay, retrieved: Retrieved) -> None:
    """The client's verdict on the first three memories returned: 1 on topic, else 0.2."""
    scores = [
        {"memory_id": m["id"], "score": 1.0 if m["metadata"]["topic"] == retrieved.topic else 0.2}
        for m in retrieved.response["memories"][:3]
    ]
    namespace, query_id = retrieved.request["namespace"], retrieved.response["query_id"]
    replay.send(
        "POST",
        "/feedback",
        json_body={"namespace": namespace, "query_id": query_id, "scores": scores},
    )


def delete_scored_memory(replay: Replay, results: list[Retrieved]) -> None:
    """Delete the top memory of the latest full rerank (it has scores and, after the refits,
    factors), then ask for it again."""
    full = next(
        r
        for r in reversed(results)
        if r.request["policy"] == "full" and r.request["namespace"] == VECTORS
    )
    memory_id = full.response["memories"][0]["id"]
    replay.send("DELETE", f"/memories/{memory_id}")
    replay.send("GET", f"/memories/{memory_id}")
    replay.send("DELETE", f"/memories/{memory_id}")


def refused_requests(replay: Replay, results: list[Retrieved]) -> None:
    """Errors are behaviour too: their status, stable code and message."""
    query = {"namespace": VECTORS, "query": "q"}
    replay.send("POST", "/retrieve", json_body=query | {"policy": "best"})
    replay.send("POST", "/retrieve", json_body=query | {"query_embedding": [1.0, 0.0]})
    other_namespace_query = next(r for r in results if r.request["namespace"] == TEXTS)
    feedback = {"memory_id": 1, "score": 0.5}
    replay.send(
        "POST",
        "/feedback",
        json_body={
            "namespace": VECTORS,
            "query_id": other_namespace_query.response["query_id"],
            "scores": [feedback],
        },
    )
    replay.send("GET", "/memories", params={"namespace": VECTORS, "cursor": "not-a-cursor"})


def first_difference(expected: Any, actual: Any, path: str = "$") -> str | None:
    """Where two JSON values first differ (depth first, in the recorded order), or None."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in list(expected) + [k for k in actual if k not in expected]:
            if key not in actual:
                return f"{path}.{key}: missing (recorded {expected[key]!r:.200})"
            if key not in expected:
                return f"{path}.{key}: not recorded (replayed {actual[key]!r:.200})"
            if found := first_difference(expected[key], actual[key], f"{path}.{key}"):
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for index, (recorded, replayed) in enumerate(zip(expected, actual, strict=False)):
            if found := first_difference(recorded, replayed, f"{path}[{index}]"):
                return found
        if len(expected) != len(actual):
            return f"{path}: {len(actual)} items replayed, {len(expected)} recorded"
        return None
    if isinstance(expected, float) and isinstance(actual, float):
        same = math.isclose(expected, actual, **FLOAT_TOLERANCE)
    else:
        same = type(expected) is type(actual) and expected == actual
    return None if same else f"{path}: recorded {expected!r:.200}, replayed {actual!r:.200}"


@pytest.mark.parametrize("anchor_policy", sorted(GOLDEN))
def test_recorded_workload_replays_to_the_recorded_responses_and_stored_state(
    judge_settings: Callable[..., Settings],
    judge: tuple[PairJudge, str],
    clean_database: str,
    anchor_policy: str,
) -> None:
    pair_judge, judge_url = judge
    golden = GOLDEN[anchor_policy]
    settings = judge_settings(
        judge_url,
        anchor_policy=anchor_policy,
        embedder="local",
        embedding_dim=DIM,
        rank=4,
        # A memory's own history counts after a few observations (memory factors, not only
        # the content prior, shape the estimates of this short workload).
        memory_reg=5.0,
        refit_every=5,
        budget_schedule="0:1.0,3:0.6,8:0.3,16:0.15",
        # A timed-out judge call would degrade a response: only a slow machine, not a change.
        scorer_timeout_s=60.0,
    )
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        exchanges = run_workload(client, pair_judge)
    assert not pair_judge.unidentified, f"prompts not placed: {pair_judge.unidentified[:2]}"
    # Through JSON and back, as the golden file is read: tuples become lists.
    snapshot = json.loads(
        json.dumps({"exchanges": exchanges, "state": stored_state(clean_database)})
    )
    if RECORD:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(snapshot, indent=1, ensure_ascii=False) + "\n")
        pytest.skip(f"recorded {golden.name}; commit it saying which behaviour change it records")
    assert golden.exists(), f"no {golden}: record it with EARM_RECORD_SNAPSHOT=1"
    recorded = json.loads(golden.read_text())
    difference = first_difference(recorded, snapshot)
    assert difference is None, explain(difference, recorded, golden)


def explain(difference: str, recorded: dict[str, Any], golden: Path) -> str:
    """The first difference, the request whose response it is in, and what to do."""
    message = f"the replay differs from {golden.name} at {difference}"
    if match := re.match(r"\$\.exchanges\[(\d+)\]", difference):
        request = recorded["exchanges"][int(match.group(1))]["request"]
        message += f"\n  in the response to {json.dumps(request)[:400]}"
    return (
        message + "\nIf (and only if) this is an intended behaviour change, re-record with "
        "EARM_RECORD_SNAPSHOT=1 and name the change in the commit message."
    )
