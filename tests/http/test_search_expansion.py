"""Search expansion (`expand` on POST /retrieve, EARM_EXPAND): memories outside the semantic
candidates that the namespace's content prior ranks highest join the pool, found by the HNSW
index along the prior's direction. Real database, a loopback chat-completions judge that rates
every "fact" memory relevant and every "chat" memory not."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from pgvector.psycopg import register_vector

from service.db.search import _candidate_sql
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

DIM = 384
NAMESPACE = "agent-1"
SEMANTIC = 10  # candidates N
EXPAND = 5


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def judge_reply(prompt: str) -> str:
    return "1.0" if "fact " in prompt else "0.0"


@pytest.fixture
def judge_url() -> Iterator[str]:
    with LoopbackServer(chat_completions_app(judge_reply)) as server:
        yield server.url


class Learned:
    """A namespace of 15 factual memories and 25 small-talk ones, queried from nearer the
    small talk, after 10 `full` queries (two refits) taught the content prior that facts are
    what the judge rates relevant: the semantic top 10 are small talk, the prior's best facts."""

    def __init__(self, client: TestClient, queries: int = 10) -> None:
        self.client = client
        self.rng = np.random.default_rng(3)
        self.facts_direction = unit(self.rng.normal(size=DIM))
        self.chat_direction = unit(self.rng.normal(size=DIM))
        self.facts = self.ingest("fact", self.near(self.facts_direction, 15))
        self.chat = self.ingest("chat", self.near(self.chat_direction, 25))
        for i in range(queries):
            retrieve(client, query=f"question {i}", query_embedding=self.query_vector(),
                     candidates=40, policy="full")

    def near(self, direction: np.ndarray, n: int) -> list[np.ndarray]:
        return [unit(direction + 0.25 * unit(self.rng.normal(size=DIM))) for _ in range(n)]

    def query_vector(self) -> list[float]:
        noise = 0.3 * unit(self.rng.normal(size=DIM))
        return unit(0.55 * self.facts_direction + 0.8 * self.chat_direction + noise).tolist()

    def ingest(self, prefix: str, vectors: list[np.ndarray]) -> set[int]:
        response = self.client.post(
            "/memories",
            json={
                "namespace": NAMESPACE,
                "memories": [
                    {"text": f"{prefix} {i}", "embedding": vector.tolist()}
                    for i, vector in enumerate(vectors)
                ],
            },
        )
        assert response.status_code == 201, response.text
        return set(response.json()["ids"])


def retrieve(client: TestClient, **body: Any) -> dict[str, Any]:
    body.setdefault("namespace", NAMESPACE)
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.fixture
def make_settings(
    judge_settings: Callable[..., Settings], judge_url: str
) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        options: dict[str, Any] = {
            "embedder": "local",
            "scorer_timeout_s": 2.0,
            "budget_schedule": "0:1.0,4:0.2",
            "refit_every": 5,
            "rank": 4,
            "refit_in_background": False,
            # The namespace's earlier questions read alike: their evidence would steer the
            # exploring anchors, which is not what these tests are about.
            "paraphrase_transfer": False,
        }
        return judge_settings(judge_url, **(options | overrides))

    return make


def ids_by_source(result: dict[str, Any]) -> dict[str, set[int]]:
    sources: dict[str, set[int]] = {}
    for memory in result["memories"]:
        sources.setdefault(memory["source"], set()).add(memory["id"])
    return sources


def test_expand_adds_prior_ranked_memories_outside_the_semantic_candidates_at_equal_calls(
    make_settings: Callable[..., Settings],
) -> None:
    with TestClient(create_app(make_settings())) as client:
        namespace = Learned(client)
        common = {"query": "question 0", "candidates": SEMANTIC, "k": SEMANTIC + EXPAND,
                  "order": "relevance"}
        vector = namespace.query_vector()
        plain = retrieve(client, query_embedding=vector, **common)
        expanded = retrieve(client, query_embedding=vector, expand=EXPAND, **common)
        trace = client.get(f"/queries/{expanded['query_id']}").json()

    semantic_ids = {m["id"] for m in plain["memories"]}
    assert plain["expanded"] == 0 and "expanded" not in ids_by_source(plain)
    assert semantic_ids <= namespace.chat  # the query looks like small talk
    new = ids_by_source(expanded)["expanded"]
    assert expanded["expanded"] == EXPAND and len(new) == EXPAND
    assert new <= namespace.facts and not new & semantic_ids
    assert {m["id"] for m in expanded["memories"]} == semantic_ids | new
    # The judge rates facts relevant: expansion puts them at the top, the model ranking them.
    assert {m["id"] for m in expanded["memories"][:EXPAND]} == new
    assert not {m["id"] for m in plain["memories"][:EXPAND]} & namespace.facts
    # The budget is a share of the semantic candidates (0.2 of 10, not of 15): equal calls.
    assert expanded["scorer_calls"] == plain["scorer_calls"] == expanded["budget"] == 2
    assert trace["candidate_count"] == SEMANTIC
    assert len(trace["candidates"]) == SEMANTIC + EXPAND
    assert {c["memory_id"] for c in trace["candidates"] if c["source"] == "expanded"} == new
    assert not any(c["anchor"] for c in trace["candidates"] if c["memory_id"] in new)


def test_the_setting_is_the_default_a_request_overrides_and_only_earm_expands(
    make_settings: Callable[..., Settings],
) -> None:
    with TestClient(create_app(make_settings(expand=EXPAND))) as client:
        namespace = Learned(client)
        common = {"query": "question 1", "query_embedding": namespace.query_vector(),
                  "candidates": SEMANTIC, "k": SEMANTIC + EXPAND}
        by_setting = retrieve(client, **common)
        switched_off = retrieve(client, expand=0, **common)
        other_policies = [retrieve(client, policy=p, **common) for p in ("semantic", "observed")]
    assert by_setting["expanded"] == EXPAND
    assert len(ids_by_source(by_setting)["expanded"]) == EXPAND
    for result in (switched_off, *other_policies):
        assert result["expanded"] == 0 and len(result["memories"]) == SEMANTIC


def test_no_expansion_before_the_first_refit(make_settings: Callable[..., Settings]) -> None:
    """Before a refit the namespace has no content prior, hence no direction to search."""
    with TestClient(create_app(make_settings())) as client:
        namespace = Learned(client, queries=0)
        result = retrieve(client, query="question 2", query_embedding=namespace.query_vector(),
                          candidates=SEMANTIC, expand=EXPAND)
    assert result["expanded"] == 0 and len(result["memories"]) == SEMANTIC


@pytest.mark.parametrize(
    ("expand", "status", "code", "says"),
    [
        (-1, 422, "validation_error", "greater than or equal to 0"),
        (201, 413, "limit_exceeded", "expand=201 is outside 0..200"),
        ("many", 422, "validation_error", "valid integer"),
    ],
)
def test_an_invalid_expand_is_a_precise_4xx(
    client: TestClient, expand: Any, status: int, code: str, says: str
) -> None:
    response = client.post(
        "/retrieve", json={"namespace": NAMESPACE, "query": "q", "expand": expand}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and "expand" in error["message"] and says in error["message"]


def test_the_expansion_is_an_hnsw_index_scan_along_the_prior_direction(
    client: TestClient,
    clean_database: str,
    plan_nodes: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    """The plan of the search statement with expansion: the HNSW index answers both the
    semantic top-N and the expansion (ordered by the distance to the prior's direction), with
    no sequential scan of memories."""
    rng = np.random.default_rng(0)
    response = client.post(
        "/memories", json={"namespace": NAMESPACE, "memories": [{"text": "a"}, {"text": "b"}]}
    )
    assert response.status_code == 201, response.text
    url = clean_database.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        register_vector(conn)
        conn.execute("UPDATE memories SET indexed = true")  # what the indexer does
        conn.execute(
            "UPDATE namespaces SET content_slope = 0.5, content_weights = %s::vector",
            [json.dumps(rng.normal(size=DIM).tolist())],
        )
        # Few rows: discourage scanning and sorting so the plan shows what the SQL *can* use
        # (a statement whose order the index cannot answer would still scan and sort).
        for plan_kind in ("seqscan", "bitmapscan", "sort"):
            conn.execute(f"SET enable_{plan_kind} = off")
        params = {"namespace": NAMESPACE, "query": np.ones(DIM, dtype=np.float32),
                  "limit": 1, "expand": 1}
        sql = _candidate_sql(exact=False, filtered=False, expand=True)
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]
        rows = conn.execute(sql, params).fetchall()
    on_memories = [n for n in plan_nodes(plan) if n.get("Relation Name") == "memories"]
    hnsw = [n for n in on_memories if n.get("Index Name") == "ix_memories_embedding_hnsw"]
    assert len(hnsw) == 2, json.dumps(plan, indent=1)  # the semantic search, the expansion
    assert all("Order By" in n for n in hnsw)
    assert not [n for n in on_memories if n["Node Type"] == "Seq Scan"]
    assert len(rows) == 2 and [r[11] for r in rows] == [False, True]  # one semantic, one expanded
