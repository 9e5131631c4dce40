"""The anchor rule through the API: the default scores the head and the candidates the
namespace estimates highest (with an exploring share it learns) in one round, EARM_ANCHOR_ROUNDS=2
in two (the head, then the highest estimates with the head folded in), the paper's rule in
one; each anchor's reason is in the trace, the share and the rounds in the response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

MEMORIES = 30
CANDIDATES, BUDGET = 30, 15  # the head: ⌈2/3 · 15⌉ = 10; round two: 5


def ingest(client: TestClient) -> None:
    memories = [{"text": f"memory number {i} about topic {i % 5}"} for i in range(MEMORIES)]
    response = client.post("/memories", json={"namespace": "agent-1", "memories": memories})
    assert response.status_code == 201, response.text


def retrieve(client: TestClient, query: str, **options: Any) -> dict[str, Any]:
    body = {"namespace": "agent-1", "query": query, "candidates": CANDIDATES, "budget": BUDGET}
    response = client.post("/retrieve", json=body | options)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def trace(client: TestClient, query_id: int) -> dict[str, Any]:
    response = client.get(f"/queries/{query_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


@pytest.fixture
def reranker() -> Any:
    """A loopback reranker that scores topic 3 relevant and keeps every request's documents."""
    requests: list[list[str]] = []

    def score(query: str, documents: list[str]) -> list[float | None]:
        requests.append(documents)
        return [0.9 if d.endswith("topic 3") else 0.1 for d in documents]

    with LoopbackServer(rerank_app(score)) as server:
        server.requests = requests
        yield server


def settings_for(judge_settings: Callable[..., Settings], server: Any, **more: Any) -> Settings:
    """The service's settings over ``server`` (its apps here refit inside the request that
    makes a refit due, so each test sees the model its requests made)."""
    return judge_settings(
        server.url, scorer="rerank", scorer_base_url=f"{server.url}/v1", embedder="local",
        **more,
    )


def test_two_rounds_score_the_head_then_the_highest_estimates_in_a_second_request(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker, anchor_rounds=2)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?")
        found = trace(client, result["query_id"])
    # Two sequential rounds, one request each: the head first, then the rest of the budget.
    assert (result["scorer_calls"], result["scorer_requests"]) == (BUDGET, 2)
    first, second = reranker.requests
    assert (len(first), len(second)) == (10, 5) and not set(first) & set(second)
    by_similarity = sorted(found["candidates"], key=lambda c: -c["similarity"])
    assert {c["text"] for c in by_similarity[:10]} == set(first)
    reasons = {c["text"]: c["anchor_reason"] for c in found["candidates"]}
    assert {reasons[t] for t in first} == {"head"}
    assert {reasons[t] for t in second} <= {"estimate", "explore"}
    assert all(reasons[c["text"]] is None for c in found["candidates"] if not c["anchor"])
    share = result["exploration_share"]
    assert found["exploration_share"] == pytest.approx(share)
    assert 0.1 <= share <= 0.5
    # round(share · 5) of round two were drawn to explore, the rest chosen by estimate
    assert sum(reasons[t] == "explore" for t in second) == round(share * 5)


def test_by_default_one_round_sends_every_anchor_before_any_is_scored(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?")
        found = trace(client, result["query_id"])
    # One request holds the whole budget: the stand-in saw every anchor before answering any.
    assert (result["scorer_calls"], result["scorer_requests"], result["scorer_rounds"]) == (
        BUDGET, 1, 1)
    (documents,) = reranker.requests
    assert len(documents) == BUDGET
    by_similarity = sorted(found["candidates"], key=lambda c: -c["similarity"])
    reasons = {c["text"]: c["anchor_reason"] for c in found["candidates"]}
    assert {reasons[c["text"]] for c in by_similarity[:10]} == {"head"}
    rest = [t for t in documents if reasons[t] != "head"]
    assert len(rest) == 5 and {reasons[t] for t in rest} <= {"estimate", "explore"}
    assert sum(reasons[t] == "explore" for t in rest) == round(result["exploration_share"] * 5)


def test_the_response_counts_the_scorer_rounds(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker, anchor_rounds=2)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        two = retrieve(client, "Which memories are about topic 3?")
        full = retrieve(client, "Which memories are about topic 3?", policy="full", budget=None)
        semantic = retrieve(client, "Which memories are about topic 3?", policy="semantic",
                            budget=None)
        traced = [trace(client, r["query_id"])["scorer_rounds"] for r in (two, full, semantic)]
    assert (two["scorer_rounds"], full["scorer_rounds"], semantic["scorer_rounds"]) == (2, 1, 0)
    assert traced == [2, 1, 0]  # the trace says what the response said


def test_the_paper_rule_scores_its_anchors_in_one_request_half_of_them_exploring(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker, anchor_policy="paper")
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?")
        found = trace(client, result["query_id"])
    assert (result["scorer_calls"], result["scorer_requests"]) == (BUDGET, 1)
    assert result["exploration_share"] == 1.0
    reasons = [c["anchor_reason"] for c in found["candidates"] if c["anchor"]]
    assert sorted(reasons) == ["explore"] * 7 + ["head"] * 8


@pytest.mark.parametrize("policy", ["full", "semantic"])
def test_without_a_choice_of_anchors_there_is_one_round_and_no_share(
    judge_settings: Callable[..., Settings], reranker: Any, policy: str
) -> None:
    settings = settings_for(judge_settings, reranker)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?", policy=policy,
                          budget=None)
        reasons = {c["anchor_reason"] for c in trace(client, result["query_id"])["candidates"]}
    assert result["exploration_share"] is None
    assert result["scorer_requests"] == (1 if policy == "full" else 0)
    assert reasons == ({"head"} if policy == "full" else {None})


@pytest.mark.parametrize("trust", [0.5, 0.999])
def test_an_unscored_candidate_outranks_a_scored_one_only_when_trusted_to_score_higher(
    judge_settings: Callable[..., Settings], reranker: Any, trust: float
) -> None:
    """At even odds an unscored candidate ranks at its estimate, so scores fall with rank; a
    near-certain trust keeps every unscored candidate (their estimates are guesses near the
    query's mean) behind the scored ones, whose scores alone order the top."""
    settings = settings_for(judge_settings, reranker, trust_probability=trust)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?", k=CANDIDATES,
                          order="relevance")
    memories = result["memories"]
    scores = [m["score"] for m in memories]
    sources = [m["source"] for m in memories]
    assert sources.count("observed") == BUDGET
    if trust == 0.5:
        assert scores == sorted(scores, reverse=True)
    else:
        assert sources[:BUDGET] == ["observed"] * BUDGET
        assert scores[:BUDGET] == sorted(scores[:BUDGET], reverse=True)


def test_the_learned_rule_replays_the_same_anchors_for_a_seed(
    judge_settings: Callable[..., Settings], reranker: Any, clean_database: str
) -> None:
    """Reproducible: the same stream into a fresh namespace scores the same anchors in the same
    rounds, the shares the same (each depends only on the queries before it)."""

    def replay() -> list[tuple[list[list[str]], float | None]]:
        settings = settings_for(judge_settings, reranker)
        with TestClient(create_app(settings, refit_in_request=True)) as client:
            client.delete("/namespaces/agent-1")
            ingest(client)
            rounds = []
            for i in range(6):
                reranker.requests.clear()
                result = retrieve(client, f"Which memories are about topic {i % 5}?", seed=3)
                rounds.append((list(reranker.requests), result["exploration_share"]))
            return rounds

    assert replay() == replay()


def test_the_stop_rule_skips_round_two_and_reports_the_calls_it_saved(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    """A threshold no posterior can fall below (more entrants than candidates) stops every
    query whose top k round one filled with scores."""
    settings = settings_for(judge_settings, reranker, stop_expected=float(CANDIDATES + 1),
                            anchor_rounds=2)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?", k=5)
    assert (result["scorer_calls"], result["scorer_requests"]) == (10, 1)
    assert result["stopped_anchors"] == BUDGET - 10
    assert len(reranker.requests) == 1


def test_the_stop_rule_never_stops_a_query_whose_top_k_is_not_full_of_scores(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker, stop_expected=float(CANDIDATES + 1),
                            anchor_rounds=2)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?", k=BUDGET)
    assert (result["scorer_calls"], result["stopped_anchors"]) == (BUDGET, 0)


def test_without_the_stop_rule_the_response_has_no_stopped_anchors(
    judge_settings: Callable[..., Settings], reranker: Any
) -> None:
    settings = settings_for(judge_settings, reranker)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest(client)
        result = retrieve(client, "Which memories are about topic 3?")
    assert "stopped_anchors" not in result
