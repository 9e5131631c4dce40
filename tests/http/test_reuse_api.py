"""Reuse of observed pairs: a repeated query takes its family's observations instead
of scoring them again and spends its budget on candidates not observed yet. The scorer is a
loopback chat-completions judge that records every pair it is asked to score."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.retrieve.reuse import family_key, normalise_query
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

N_MEMORIES = 40
BUDGET = 10
MEMORY_TEXTS = [f"memory number {i:02d} about topic {i % 5}" for i in range(N_MEMORIES)]


class RecordingJudge:
    """Scores each memory by a fixed rule (topic 3 relevant) and records every memory it was
    asked to score."""

    def __init__(self) -> None:
        self.scored: list[str] = []

    def reply(self, prompt: str) -> str:
        memory = next(m for m in MEMORY_TEXTS if m in prompt)
        self.scored.append(memory)
        return str(0.9 if memory.endswith("topic 3") else 0.1)

    def memories_scored(self) -> set[str]:
        return set(self.scored)


@pytest.fixture
def judge() -> Iterator[tuple[RecordingJudge, str]]:
    recording = RecordingJudge()
    with LoopbackServer(chat_completions_app(recording.reply)) as server:
        yield recording, server.url


@pytest.fixture
def reuse_client(
    judge_settings: Callable[..., Settings], judge: tuple[RecordingJudge, str]
) -> Iterator[TestClient]:
    settings = judge_settings(judge[1], embedder="local")
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        response = client.post(
            "/memories",
            json={"namespace": "agent-1", "memories": [{"text": t} for t in MEMORY_TEXTS]},
        )
        assert response.status_code == 201, response.text
        yield client


def ask(client: TestClient, query: str, **options: Any) -> dict[str, Any]:
    body = {"namespace": "agent-1", "query": query, "candidates": N_MEMORIES, "budget": BUDGET,
            "k": N_MEMORIES, "order": "relevance"} | options
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def observed_texts(result: dict[str, Any]) -> set[str]:
    return {m["text"] for m in result["memories"] if m["source"] == "observed"}


def test_normalisation_casefolds_collapses_whitespace_and_strips() -> None:
    assert normalise_query("  What does  ANN\tlike?\n") == "what does ann like?"
    assert family_key("What does Ann like?", None) == family_key(" what does ann  LIKE? ", None)
    assert family_key("What does Ann like?", None) != family_key("What does Bob like?", None)
    vector = np.ones(4, dtype=np.float32)
    assert family_key("a", vector) == family_key("b", vector.copy())
    assert family_key("a", vector) != family_key("a", None)


def test_a_repeated_query_never_asks_the_scorer_for_a_pair_it_has_observed(
    reuse_client: TestClient, judge: tuple[RecordingJudge, str]
) -> None:
    recording = judge[0]
    first = ask(reuse_client, "Which memories are about topic 3?")
    first_pairs = recording.memories_scored()
    assert (first["scorer_calls"], first["reused"]) == (BUDGET, 0)
    recording.scored.clear()

    second = ask(reuse_client, "  which memories are ABOUT topic 3? ")
    assert (second["scorer_calls"], second["reused"]) == (BUDGET, BUDGET)
    # None of the pairs scored for the first asking was scored again.
    assert recording.memories_scored().isdisjoint(first_pairs)
    assert len(recording.scored) == BUDGET
    # They count as observed, with the scores the first asking got.
    first_scores = {m["text"]: m["score"] for m in first["memories"] if m["source"] == "observed"}
    second_scores = {m["text"]: m["score"] for m in second["memories"]}
    assert observed_texts(second) >= set(first_scores)
    assert all(second_scores[t] == pytest.approx(s, abs=1e-6) for t, s in first_scores.items())


def test_the_trace_of_a_repeat_names_the_cells_it_reused_and_those_it_scored(
    reuse_client: TestClient,
) -> None:
    first = ask(reuse_client, "Which memories are about topic 3?")
    second = ask(reuse_client, "Which memories are about topic 3?")
    trace = reuse_client.get(f"/queries/{second['query_id']}")
    assert trace.status_code == 200, trace.text
    origins = Counter(c["origin"] for c in trace.json()["candidates"])
    assert origins["reused"] == second["reused"] == first["scorer_calls"]
    assert origins["scorer"] == second["scorer_calls"]
    reused = [c for c in trace.json()["candidates"] if c["origin"] == "reused"]
    assert all(c["observed_score"] == c["score"] and not c["anchor"] for c in reused)


def test_coverage_grows_with_each_repetition_until_nothing_is_left_to_score(
    reuse_client: TestClient, judge: tuple[RecordingJudge, str]
) -> None:
    recording = judge[0]
    rounds = [ask(reuse_client, "Which memories are about topic 3?") for _ in range(5)]
    assert [r["scorer_calls"] for r in rounds] == [10, 10, 10, 10, 0]
    assert [r["reused"] for r in rounds] == [0, 10, 20, 30, 40]
    assert [len(observed_texts(r)) for r in rounds] == [10, 20, 30, 40, 40]
    # Every pair was scored exactly once over the five askings.
    assert len(recording.scored) == N_MEMORIES == len(recording.memories_scored())
    # The last asking is full reranking for free: every topic-3 memory on top.
    top = [m["text"] for m in rounds[-1]["memories"][:8]]
    assert all(t.endswith("topic 3") for t in top)

    stats = reuse_client.get("/stats", params={"namespace": "agent-1"}).json()
    # One observation per judged pair: reused cells are not stored (nor learned) twice.
    assert stats["observations"] == stats["scorer_calls"] == N_MEMORIES
    assert stats["reused_cells"] == 10 + 20 + 30 + 40
    assert stats["reuse_saved_calls"] == BUDGET  # the last asking's whole budget
    gauges = {
        sample.name: sample.value
        for family in text_string_to_metric_families(reuse_client.get("/metrics").text)
        for sample in family.samples
    }
    assert gauges["earm_reused_cells"] == 100
    assert gauges["earm_reuse_saved_calls"] == BUDGET
    assert gauges["earm_retrieve_reused_cells_total"] == 100


def test_a_different_question_and_a_semantic_retrieve_reuse_nothing(
    reuse_client: TestClient,
) -> None:
    ask(reuse_client, "Which memories are about topic 3?")
    other = ask(reuse_client, "Which memories are about topic 2?")
    assert (other["scorer_calls"], other["reused"]) == (BUDGET, 0)
    semantic = ask(reuse_client, "Which memories are about topic 3?", policy="semantic")
    assert (semantic["scorer_calls"], semantic["reused"]) == (0, 0)
    assert observed_texts(semantic) == set()


def test_a_client_vector_identical_to_a_recorded_one_is_a_repeat_whatever_its_text(
    reuse_client: TestClient,
) -> None:
    vector = np.random.default_rng(3).normal(size=384).tolist()
    first = ask(reuse_client, "first wording", query_embedding=vector)
    again = ask(reuse_client, "other wording", query_embedding=vector)
    assert (first["reused"], again["reused"]) == (0, BUDGET)
    moved = ask(reuse_client, "first wording", query_embedding=[x + 1e-3 for x in vector])
    assert moved["reused"] == 0


def test_reuse_can_be_switched_off(
    judge_settings: Callable[..., Settings], judge: tuple[RecordingJudge, str]
) -> None:
    settings = judge_settings(judge[1], embedder="local", reuse_observations=False)
    with TestClient(create_app(settings)) as client:
        client.post(
            "/memories",
            json={"namespace": "agent-1", "memories": [{"text": t} for t in MEMORY_TEXTS]},
        )
        rounds = [ask(client, "Which memories are about topic 3?", policy="full") for _ in range(2)]
    assert [(r["scorer_calls"], r["reused"]) for r in rounds] == [(40, 0), (40, 0)]


def test_with_paraphrase_transfer_a_rephrased_query_judges_its_head_and_explores_past_it(
    judge_settings: Callable[..., Settings], judge: tuple[RecordingJudge, str]
) -> None:
    """A rephrased query scores its own head again (a question that merely reads alike must
    not speak for it) and spends its exploring half on what its paraphrase did not observe;
    the paraphrase's judgements move the estimates of what it observed."""
    recording = judge[0]
    settings = judge_settings(
        judge[1], embedder="local", paraphrase_similarity=0.8,
        anchor_policy="paper",
    )
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        client.post(
            "/memories",
            json={"namespace": "agent-1", "memories": [{"text": t} for t in MEMORY_TEXTS]},
        )
        first = ask(client, "Which memories are about topic 3?")
        first_scored = recording.memories_scored()
        recording.scored.clear()
        rephrased = ask(client, "Remind me: which memories are about topic 3?")
        candidates = client.get(f"/queries/{rephrased['query_id']}").json()["candidates"]
    assert (rephrased["scorer_calls"], rephrased["reused"]) == (BUDGET, 0)
    # The response counts the candidates the paraphrase's judgements moved.
    assert first["paraphrased"] == 0 and rephrased["paraphrased"] > 0
    by_similarity = sorted(candidates, key=lambda c: -c["similarity"])
    head = {c["text"] for c in by_similarity[: (BUDGET + 1) // 2]}
    scored = recording.memories_scored()
    assert head <= scored
    assert scored - head and (scored - head).isdisjoint(first_scored)
    estimates = {m["text"]: m["score"] for m in rephrased["memories"]}
    judged = {m["text"] for m in first["memories"] if m["source"] == "observed"} - scored
    relevant = [estimates[t] for t in judged if t.endswith("topic 3")]
    irrelevant = [estimates[t] for t in judged if not t.endswith("topic 3")]
    assert relevant and irrelevant and min(relevant) > max(irrelevant)


def explored_after_a_paraphrase(
    settings: Settings, recording: RecordingJudge, asked_between: tuple[str, ...] = ()
) -> tuple[set[str], set[str], int]:
    """What a first question's retrieve scored, what the exploring half of a rephrasing's
    retrieve (budget 30: 15 of the 25 candidates below its head) scored, and how many of the
    rephrasing's candidates it reports as moved by paraphrase evidence. Under the paper's
    anchor rule, whose exploring half is a uniform draw the steering narrows (the learned
    rule's draws are steered the same way: tests/unit/retrieve/test_anchors.py)."""
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        client.post(
            "/memories",
            json={"namespace": "agent-1", "memories": [{"text": t} for t in MEMORY_TEXTS]},
        )
        ask(client, "Which memories are about topic 3?")
        first_scored = recording.memories_scored()
        for query in asked_between:
            ask(client, query)
        recording.scored.clear()
        rephrased = ask(client, "Remind me: which memories are about topic 3?", budget=30)
        candidates = client.get(f"/queries/{rephrased['query_id']}").json()["candidates"]
    head = {c["text"] for c in sorted(candidates, key=lambda c: -c["similarity"])[:15]}
    return first_scored, recording.memories_scored() - head, rephrased["paraphrased"]


def test_without_paraphrase_transfer_a_rephrased_query_explores_what_its_paraphrase_scored(
    judge_settings: Callable[..., Settings], judge: tuple[RecordingJudge, str]
) -> None:
    settings = judge_settings(
        judge[1], embedder="local", paraphrase_transfer=False,
        anchor_policy="paper",
    )
    first_scored, explored, paraphrased = explored_after_a_paraphrase(settings, judge[0])
    # Nothing steers the exploring half: it lands on cells the paraphrase scored too.
    assert explored & first_scored
    assert paraphrased == 0


def test_paraphrase_transfer_looks_only_at_the_latest_window_of_queries(
    judge_settings: Callable[..., Settings], judge: tuple[RecordingJudge, str]
) -> None:
    """EARM_PARAPHRASE_WINDOW bounds the neighbour scan: a paraphrase asked before the window's
    queries is not found, so nothing steers the rephrased query's exploring half."""
    settings = judge_settings(
        judge[1], embedder="local", paraphrase_similarity=0.8,
        paraphrase_window=1, anchor_policy="paper",
    )
    first_scored, explored, paraphrased = explored_after_a_paraphrase(
        settings, judge[0], ("What will the weather be like on Mars tomorrow?",)
    )
    assert explored & first_scored
    assert paraphrased == 0
