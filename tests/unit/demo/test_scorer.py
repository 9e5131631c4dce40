"""The demo's simulated scorer answers each pair from its label, with noise fixed per pair, and
says in its model name what it is."""

from __future__ import annotations

import httpx
import pytest

from service.demo.scorer import (
    NOISE,
    SIMULATED_MODEL,
    LabelScorer,
    scored_by_stand_in,
    simulated_scorer_app,
)
from service.demo.workload import load
from service.settings import Settings
from service.testing import LoopbackServer


def test_scores_are_the_labels_within_the_noise_and_the_same_when_asked_again() -> None:
    workload = load()
    scorer = LabelScorer(workload)
    question = workload.questions[0]
    texts = [memory.text for memory in workload.memories]
    scores = scorer(question.text, texts)
    assert scores == scorer(question.text, texts)
    for memory, score in zip(workload.memories, scores, strict=True):
        assert score is not None
        assert abs(score - workload.relevance(question, memory)) <= NOISE
    assert len(set(scores)) > len(workload.memories) // 2  # noisy, not a few fixed values


def test_a_text_the_workload_does_not_know_scores_zero() -> None:
    workload = load()
    scorer = LabelScorer(workload)
    assert scorer("What is the capital of France?", [workload.memories[0].text]) == [0.0]
    assert scorer(workload.questions[0].text, ["Paris is the capital of France."]) == [0.0]


def test_it_speaks_the_rerank_protocol_and_names_itself_simulated() -> None:
    workload = load()
    question = workload.questions[0]
    answer = next(m for m in workload.memories if m.external_id == question.answer)
    with LoopbackServer(simulated_scorer_app(workload)) as server:
        body = {"query": question.text, "documents": ["unknown", answer.text]}
        reply = httpx.post(f"{server.url}/rerank", json=body, timeout=10).json()
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
    assert reply["results"][0]["index"] == 1  # sorted by score: the answer first
    assert reply["results"][0]["relevance_score"] == pytest.approx(1.0, abs=NOISE)
    assert "simulated" in SIMULATED_MODEL
    assert [model["id"] for model in models["data"]] == [SIMULATED_MODEL]


def test_the_service_settings_change_only_the_scorer() -> None:
    settings = Settings(_env_file=None, budget_schedule="0:1.0,5:0.5", trust_probability=0.9)
    scored = scored_by_stand_in(settings, "http://127.0.0.1:9")
    assert (scored.scorer, scored.scorer_base_url, scored.scorer_model) == (
        "rerank", "http://127.0.0.1:9", SIMULATED_MODEL,
    )
    unchanged = {"scorer", "scorer_base_url", "scorer_model"}
    assert {k: v for k, v in scored if k not in unchanged} == {
        k: v for k, v in settings if k not in unchanged
    }
