"""The rerank protocol against a live earm over loopback HTTP whose upstream reranker is a
loopback stand-in: the Cohere/Jina/vLLM and TEI shapes, which namespace learns, documents as
memories by their text, what a call forwards upstream, and bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from service.http.app import create_app
from service.settings import Settings
from service.testing import HTTPFault, LoopbackServer, embeddings_app, rerank_app

DOCUMENTS = [
    "Alice moved to Porto in 2021.",
    "Alice runs a half marathon every spring.",
    "Alice is allergic to peanuts and carries an EpiPen.",
    "Alice loves the sushi bar by the river.",
    "Alice prefers meetings before noon.",
]
QUERY = "Is Alice allergic to peanuts?"
COHERE_PATHS = ["/v1/rerank", "/v2/rerank", "/rerank"]


class Upstream:
    """The real reranker behind earm: a score per document from its words, and every batch of
    documents it was sent."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.failing = False

    def rerank(self, query: str, documents: list[str]) -> list[float | None]:
        if self.failing:
            raise HTTPFault(500, "upstream down")
        self.batches.append(list(documents))
        words = set(re.findall(r"\w+", query.lower()))
        return [
            min(1.0, 0.05 + 0.3 * len(words & set(re.findall(r"\w+", d.lower()))))
            + 0.001 * (len(d) % 7)
            for d in documents
        ]

    @property
    def documents_sent(self) -> int:
        return sum(len(batch) for batch in self.batches)


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, str]]:
    judge = Upstream()
    with LoopbackServer(rerank_app(judge.rerank)) as server:
        yield judge, server.url


Earm = Callable[..., httpx.Client]


@pytest.fixture
def earm(clean_database: str, upstream: tuple[Upstream, str]) -> Iterator[Earm]:
    """Factory of clients of a live earm (settings overridable) whose scorer is the upstream."""
    servers: list[LoopbackServer] = []
    clients: list[httpx.Client] = []

    def start(**overrides: Any) -> httpx.Client:
        options: dict[str, Any] = {
            "database_url": clean_database,
            "embedder": "local",
            "scorer": "rerank",
            "scorer_base_url": upstream[1],
            "scorer_max_retries": 0,
        }
        server = LoopbackServer(create_app(Settings(**(options | overrides), _env_file=None),
                                            refit_in_request=True))
        servers.append(server.start())
        clients.append(httpx.Client(base_url=server.url, timeout=60))
        return clients[-1]

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def cohere_body(**fields: Any) -> dict[str, Any]:
    return {"model": "earm/tour", "query": QUERY, "documents": DOCUMENTS} | fields


def earm_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    header = json.loads(response.headers["X-Earm"])
    if isinstance(response.json(), dict):
        assert response.json()["meta"]["earm"] == header
    return header


def assert_sorted_unit_relevances(scores: list[float]) -> None:
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)


# ------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("path", COHERE_PATHS)
def test_cohere_shape_answers_every_document_best_first_with_earm_meta(
    earm: Earm, path: str
) -> None:
    response = earm().post(path, json=cohere_body())
    body = response.json()
    assert set(body) == {"id", "model", "results", "meta"}
    assert sorted(r["index"] for r in body["results"]) == list(range(len(DOCUMENTS)))
    assert_sorted_unit_relevances([r["relevance_score"] for r in body["results"]])
    assert body["results"][0]["index"] == 2  # the peanut allergy
    assert all("document" not in r for r in body["results"])
    meta = earm_of(response)
    assert meta["namespace"] == "tour" and meta["query_id"] == 1
    assert meta["budget"] == 5 and meta["scorer_calls"] == 5 and meta["reused"] == 0
    assert meta["degraded"] is False and meta["estimated"] == 0
    assert len(meta["memory_ids"]) == len(DOCUMENTS)
    assert {"documents_ms", "embed_ms", "score_ms", "total_ms"} <= set(meta["timings"])


def test_top_n_and_return_documents_shape_the_results(earm: Earm) -> None:
    response = earm().post(
        "/v1/rerank",
        json=cohere_body(documents=[{"text": d} for d in DOCUMENTS], top_n=2,
                         return_documents=True),
    )
    results = response.json()["results"]
    assert len(results) == 2 and len(earm_of(response)["memory_ids"]) == 2
    assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]


def test_tei_shape_at_rerank_answers_a_list_and_the_earm_header(earm: Earm) -> None:
    client = earm(rerank_namespace="tei-ns")
    body = {"query": QUERY, "texts": DOCUMENTS, "return_text": True}
    plain = client.post("/rerank", json=body)
    ranks = plain.json()
    assert sorted(r["index"] for r in ranks) == list(range(len(DOCUMENTS)))
    assert_sorted_unit_relevances([r["score"] for r in ranks])
    assert [r["text"] for r in ranks] == [DOCUMENTS[r["index"]] for r in ranks]
    assert earm_of(plain)["namespace"] == "tei-ns"
    # raw_scores: earm's relevance has no logit behind it, so the scores are the same.
    raw = client.post("/rerank", json=body | {"raw_scores": True, "return_text": False})
    assert [(r["index"], r["score"]) for r in raw.json()] == [
        (r["index"], r["score"]) for r in ranks
    ]
    assert all("text" not in r for r in raw.json())


# ----------------------------------------------------------------------------- namespaces


def test_the_namespace_comes_from_the_model_the_header_or_the_setting(earm: Earm) -> None:
    client = earm(rerank_namespace="fallback")
    by_model = client.post("/v1/rerank", json=cohere_body(model="earm/by-model"))
    by_header = client.post(
        "/v1/rerank", json=cohere_body(model="rerank-v3.5"),
        headers={"X-Earm-Namespace": "by-header"},
    )
    by_setting = client.post("/v1/rerank", json=cohere_body(model="rerank-v3.5"))
    assert [earm_of(r)["namespace"] for r in (by_model, by_header, by_setting)] == [
        "by-model", "by-header", "fallback"
    ]
    stats = client.get("/stats").json()["namespaces"]
    assert sorted(s["namespace"] for s in stats) == ["by-header", "by-model", "fallback"]


def test_a_model_naming_no_namespace_is_refused_naming_the_accepted_forms(earm: Earm) -> None:
    client = earm()
    refused = client.post("/v1/rerank", json=cohere_body(model="rerank-v3.5"))
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    assert "earm/<namespace>" in message and "X-Earm-Namespace" in message
    assert "EARM_RERANK_NAMESPACE" in message
    conflicting = client.post(
        "/v1/rerank", json=cohere_body(), headers={"X-Earm-Namespace": "other"}
    )
    assert conflicting.status_code == 422
    malformed = client.post("/v1/rerank", json=cohere_body(model="earm/not a namespace"))
    assert malformed.status_code == 422
    assert client.get("/memories", params={"namespace": "tour"}).json()["memories"] == []


def test_a_key_reranks_only_in_the_namespaces_of_its_patterns(earm: Earm) -> None:
    key = "earm_rerank-scoped-key-0123456789abcdefghijkl"
    client = earm(api_keys=f"{key}=team-*")
    auth = {"Authorization": f"Bearer {key}"}
    allowed = client.post("/v1/rerank", json=cohere_body(model="earm/team-a"), headers=auth)
    assert allowed.status_code == 200, allowed.text
    forbidden = client.post("/v1/rerank", json=cohere_body(), headers=auth)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert client.post("/v1/rerank", json=cohere_body(model="earm/team-a")).status_code == 401


# ----------------------------------------------------------------------- document identity


def test_a_document_is_the_memory_of_its_text_across_calls_and_ingests(earm: Earm) -> None:
    client = earm()
    ingested = client.post(
        "/memories", json={"namespace": "tour", "memories": [{"text": DOCUMENTS[3]}]}
    ).json()["ids"][0]
    first = earm_of(client.post("/v1/rerank", json=cohere_body(top_n=None)))
    by_index = dict(zip(
        [r["index"] for r in client.post("/v1/rerank", json=cohere_body()).json()["results"]],
        first["memory_ids"], strict=True,
    ))
    assert by_index[3] == ingested
    later = client.post(
        "/v1/rerank", json=cohere_body(query="Where does Alice live?", documents=DOCUMENTS[::-1])
    )
    later_ids = {
        r["index"]: m
        for r, m in zip(later.json()["results"], earm_of(later)["memory_ids"], strict=True)
    }
    assert {len(DOCUMENTS) - 1 - i: m for i, m in later_ids.items()} == by_index
    listed = client.get("/memories", params={"namespace": "tour"}).json()["memories"]
    assert len(listed) == len(DOCUMENTS)
    # The same text in another namespace is another memory.
    other = earm_of(client.post("/v1/rerank", json=cohere_body(model="earm/elsewhere")))
    assert not set(other["memory_ids"]) & set(by_index.values())


def test_duplicate_documents_are_one_memory_with_one_score(earm: Earm) -> None:
    upstream_documents = [DOCUMENTS[0], DOCUMENTS[2], DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[2]]
    response = earm().post("/v1/rerank", json=cohere_body(documents=upstream_documents))
    results = response.json()["results"]
    ids = dict(zip([r["index"] for r in results], earm_of(response)["memory_ids"], strict=True))
    scores = {r["index"]: r["relevance_score"] for r in results}
    assert ids[0] == ids[2] and ids[1] == ids[4] and len(set(ids.values())) == 3
    assert scores[0] == scores[2] and scores[1] == scores[4]
    assert earm_of(response)["scorer_calls"] == 3


def test_rerank_memories_take_feedback_by_memory_id_and_have_a_trace(earm: Earm) -> None:
    client = earm()
    response = client.post("/v1/rerank", json=cohere_body())
    meta = earm_of(response)
    best = meta["memory_ids"][0]
    feedback = client.post(
        "/feedback",
        json={"namespace": "tour", "query_id": meta["query_id"],
              "scores": [{"memory_id": best, "score": 1.0}]},
    )
    assert feedback.json() == {"recorded": 1, "replaced": 1}
    trace = client.get(f"/queries/{meta['query_id']}").json()
    assert trace["text"] == QUERY and trace["candidate_count"] == len(DOCUMENTS)
    assert trace["candidates"][0]["memory_id"] == best
    assert trace["candidates"][0]["origin"] == "feedback"


def test_a_full_indexing_backlog_never_fails_a_rerank(earm: Earm) -> None:
    client = earm(max_unindexed=1, background_work=False)
    assert earm_of(client.post("/v1/rerank", json=cohere_body()))["scorer_calls"] == 5
    more = client.post(
        "/v1/rerank", json=cohere_body(documents=[f"new memory {i}" for i in range(4)])
    )
    assert earm_of(more)["scorer_calls"] == 4


# -------------------------------------------------------------------------- upstream costs


def test_a_repeated_call_sends_nothing_upstream_and_answers_the_same_order(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    client = earm()
    first = client.post("/v1/rerank", json=cohere_body())
    sent = judge.documents_sent
    again = client.post("/v1/rerank", json=cohere_body())
    assert judge.documents_sent == sent == len(DOCUMENTS)
    assert earm_of(again)["scorer_calls"] == 0 and earm_of(again)["reused"] == len(DOCUMENTS)
    assert [r["index"] for r in again.json()["results"]] == [
        r["index"] for r in first.json()["results"]
    ]


def _warm(client: httpx.Client, documents: list[str]) -> None:
    """Two queries that score every document (the warm-up of the schedule 0:1.0,2:0.175)."""
    for query in ("What does Alice eat?", "Where does Alice run?"):
        client.post("/v1/rerank", json=cohere_body(query=query, documents=documents))


NOTES = [f"Alice's note {i}: {word}" for i, word in enumerate(
    ["peanuts", "sushi", "Porto", "marathon", "meetings", "river"] * 10)]  # 60: a budget of 10


def test_an_identical_call_within_the_window_is_answered_again_with_nothing_upstream(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    client = earm(budget_schedule="0:1.0,2:0.175")
    _warm(client, NOTES)
    body = cohere_body(query="Which city is Alice in?", documents=NOTES, top_n=5)
    first = client.post("/v1/rerank", json=body)
    sent = judge.documents_sent
    assert earm_of(first)["scorer_calls"] == 10
    again = client.post("/v1/rerank", json=body)
    assert judge.documents_sent == sent
    meta = earm_of(again)
    assert (meta["scorer_calls"], meta["budget"], meta["reused"]) == (0, 0, 10)
    assert meta["query_id"] == earm_of(first)["query_id"]
    assert again.json()["results"] == first.json()["results"]
    # Another top_n, or the documents in another order, is another call: it explores.
    other = client.post("/v1/rerank", json=body | {"top_n": 6})
    assert earm_of(other)["scorer_calls"] == judge.documents_sent - sent > 0


def test_without_a_window_an_identical_call_explores_as_a_re_ask(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    client = earm(budget_schedule="0:1.0,2:0.175", rerank_repeat_window_s=0)
    _warm(client, NOTES)
    body = cohere_body(query="Which city is Alice in?", documents=NOTES)
    client.post("/v1/rerank", json=body)
    sent = judge.documents_sent
    again = earm_of(client.post("/v1/rerank", json=body))
    assert again["scorer_calls"] == judge.documents_sent - sent == 10
    assert again["reused"] == 10


def test_an_erased_namespace_answers_an_identical_call_anew(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    client = earm()
    client.post("/v1/rerank", json=cohere_body())
    assert client.delete("/namespaces/tour").status_code == 200
    sent = judge.documents_sent
    again = earm_of(client.post("/v1/rerank", json=cohere_body()))
    assert again["scorer_calls"] == judge.documents_sent - sent == len(DOCUMENTS)


def test_after_the_warm_up_a_call_forwards_the_schedules_budget_less_what_reuse_covers(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    # Warm-up: the first two queries score every document; from the third, 17.5%.
    client = earm(budget_schedule="0:1.0,2:0.175")
    documents = [f"Alice's note {i}: {word}" for i, word in enumerate(
        ["peanuts", "sushi", "Porto", "marathon", "meetings", "river"] * 7
    )]  # 42 documents: a budget of round(0.175 * 42) = 7
    for query in ("What does Alice eat?", "Where does Alice run?"):
        assert earm_of(client.post("/v1/rerank", json=cohere_body(query=query,
                                                                  documents=documents)))[
            "scorer_calls"] == len(documents)

    def forwarded(query: str, docs: list[str]) -> tuple[int, dict[str, Any]]:
        before = judge.documents_sent
        meta = earm_of(client.post("/v1/rerank", json=cohere_body(query=query, documents=docs)))
        assert meta["scorer_calls"] == judge.documents_sent - before
        return judge.documents_sent - before, meta

    sent, meta = forwarded("Which city is Alice in?", documents)
    assert sent == 7 and meta["budget"] == 7 and meta["reused"] == 0
    # A repeat of a query that scored every document at warm-up: reuse covers the budget.
    sent, meta = forwarded("What does Alice eat?", documents)
    assert sent == 0 and meta["reused"] == len(documents)
    # Three documents its family has not seen: the budget (8 of 45) less the 42 reused.
    sent, meta = forwarded("What does Alice eat?", documents + ["x 1", "x 2", "x 3"])
    assert meta["budget"] == 8 and sent == 3 and meta["reused"] == len(documents)


def test_an_upstream_failure_degrades_to_estimates_never_an_error(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    judge, _ = upstream
    judge.failing = True
    response = earm().post("/v1/rerank", json=cohere_body())
    meta = earm_of(response)
    assert meta["degraded"] is True and meta["query_id"] is not None
    assert sorted(r["index"] for r in response.json()["results"]) == list(range(5))
    assert_sorted_unit_relevances([r["relevance_score"] for r in response.json()["results"]])


def test_a_failing_embedder_degrades_to_the_callers_order(
    earm: Earm, upstream: tuple[Upstream, str]
) -> None:
    def fail(texts: list[str]) -> list[list[float]]:
        raise HTTPFault(500, "embedder down")

    with LoopbackServer(embeddings_app(fail)) as embedder:
        client = earm(embedder="openai", embedder_base_url=embedder.url + "/v1",
                      embedder_max_retries=0)
        response = client.post("/v1/rerank", json=cohere_body())
    meta = earm_of(response)
    assert meta["degraded"] is True and meta["query_id"] is None
    assert [r["index"] for r in response.json()["results"]] == list(range(len(DOCUMENTS)))
    assert_sorted_unit_relevances([r["relevance_score"] for r in response.json()["results"]])
    assert upstream[0].documents_sent == 0


# ------------------------------------------------------------------------------- bad input


def _long(n: int) -> str:
    return "word " * (n // 5 + 1)


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        (cohere_body(documents=[]), 422, "validation_error", "documents"),
        (cohere_body(documents=["a"] * 6), 413, "limit_exceeded", "EARM_MAX_CANDIDATES=5"),
        (cohere_body(documents=["short", _long(120)]), 413, "limit_exceeded", "documents[1]"),
        (cohere_body(documents=["a", 3]), 422, "validation_error", "documents"),
        (cohere_body(documents=[{"txt": "a"}]), 422, "validation_error", "documents"),
        (cohere_body(top_n=0), 422, "validation_error", "top_n"),
        (cohere_body(top_n=-1), 422, "validation_error", "top_n"),
        (cohere_body(query=_long(120)), 413, "limit_exceeded", "query"),
        ({"query": QUERY, "texts": []}, 422, "validation_error", "texts"),
    ],
    ids=["no documents", "too many", "too long", "a number", "an object without text",
         "top_n 0", "top_n negative", "query too long", "tei without texts"],
)
def test_bad_input_is_refused_in_the_error_shape_and_stores_nothing(
    earm: Earm, body: dict[str, Any], status: int, code: str, says: str
) -> None:
    client = earm(max_candidates=5, default_candidates=5, max_text_chars=100,
                  rerank_namespace="tour")
    response = client.post("/rerank", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and says in error["message"]
    assert client.get("/memories", params={"namespace": "tour"}).json()["memories"] == []


def test_without_an_embedder_rerank_is_refused_saying_so(earm: Earm) -> None:
    response = earm(embedder="none").post("/v1/rerank", json=cohere_body())
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "embedding_required"
    assert "EARM_EMBEDDER=none" in response.json()["error"]["message"]


# --------------------------------------------------------------------------- real clients


def test_the_cohere_sdk_reranks_through_earm(earm: Earm) -> None:
    cohere = pytest.importorskip("cohere")
    # The SDK always sends its api_key as a bearer key: an earm key.
    key = "earm_cohere-sdk-key-0123456789abcdefghijklmn"
    client = earm(api_keys=f"{key}=tour")
    co = cohere.ClientV2(base_url=str(client.base_url), api_key=key)
    answer = co.rerank(model="earm/tour", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert len(answer.results) == 3 and answer.results[0].index == 2
    assert answer.results[0].relevance_score >= answer.results[1].relevance_score
    assert answer.meta.earm["query_id"] == 1  # an extra field the SDK keeps as it came


def test_langchain_coheres_reranker_compresses_documents_through_earm(earm: Earm) -> None:
    langchain_cohere = pytest.importorskip("langchain_cohere")
    from langchain_core.documents import Document

    key = "earm_langchain-cohere-key-0123456789abcdefgh"
    client = earm(api_keys=f"{key}=tour")
    reranker = langchain_cohere.CohereRerank(
        base_url=str(client.base_url), cohere_api_key=key, model="earm/tour", top_n=2
    )
    documents = [Document(page_content=text, metadata={"n": i}) for i, text in enumerate(DOCUMENTS)]
    compressed = reranker.compress_documents(documents, QUERY)
    assert [d.metadata["n"] for d in compressed][:1] == [2] and len(compressed) == 2
    assert compressed[0].metadata["relevance_score"] >= compressed[1].metadata["relevance_score"]


def test_two_calls_of_the_largest_allowed_document_set_are_both_answered(earm: Earm) -> None:
    # The second call records 1,000 observations and updates as many memory rows: a record
    # that once outgrew the socket and hung for ever (tests/retrieve/test_large_records.py).
    client = earm()
    documents = [f"Note {i}: Alice mentioned topic {i % 37} on day {i}." for i in range(1000)]
    for query in ("What did Alice say about topic 5?", "When did Alice mention topic 9?"):
        response = client.post(
            "/v1/rerank", json=cohere_body(query=query, documents=documents), timeout=120
        )
        assert earm_of(response)["scorer_calls"] > 0
        assert len(response.json()["results"]) == len(documents)


def test_top_n_is_the_top_the_stop_rule_protects(earm: Earm) -> None:
    """With a stop threshold no posterior falls below, a call whose round one filled its
    top_n with scores skips round two; without top_n every document is read, so it never
    stops."""
    client = earm(budget_schedule="0:0.5", stop_expected=1000.0, anchor_rounds=2)
    documents = [f"Alice's note {i}: {word}" for i, word in enumerate(
        ["peanuts", "sushi", "Porto", "marathon", "meetings", "river"] * 5
    )]  # 30 documents: a budget of 15, of which the head is 10
    for top_n, calls in ((3, 10), (None, 15)):
        body = cohere_body(query=f"What does Alice eat {top_n}?", documents=documents)
        meta = earm_of(client.post("/v1/rerank", json=body | {"top_n": top_n}))
        assert (meta["budget"], meta["scorer_calls"]) == (15, calls)
