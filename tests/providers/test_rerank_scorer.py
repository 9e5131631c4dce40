"""Rerank scorers (``/rerank`` of Cohere/Jina/vLLM/llama.cpp/Infinity, and TEI) against real
loopback servers speaking each protocol."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import numpy as np
import pytest
from pydantic import ValidationError

from service.providers.factory import build_scorer
from service.providers.rerank_scorer import (
    RerankProtocol,
    RerankScorer,
    transform_score,
)
from service.providers.scorers import Scores
from service.settings import Settings
from service.testing import HTTPFault, LoopbackServer, rerank_app

Serve = Callable[[object], LoopbackServer]  # the `serve` fixture (conftest.py)

DIM = 4
QUERY_EMBEDDING = np.zeros(DIM, dtype=np.float32)
PROTOCOLS: list[RerankProtocol] = ["rerank", "tei"]


def make_scorer(url: str, protocol: RerankProtocol, **kwargs: object) -> RerankScorer:
    options: dict[str, object] = {"timeout_s": 2.0, "backoff_base_s": 0.01}
    options.update(kwargs)
    return RerankScorer(base_url=url, model="reranker", protocol=protocol, **options)  # type: ignore[arg-type]


async def score_with(scorer: RerankScorer, query: str, memories: list[str]) -> Scores:
    try:
        return await scorer.score(query, QUERY_EMBEDDING, memories, np.zeros((len(memories), 0)))
    finally:
        await scorer.aclose()


def score_of(document: str) -> float:
    """A distinct score per document "m<i>": i / 100."""
    return int(document.removeprefix("m")) / 100


def by_name(query: str, documents: list[str]) -> list[float | None]:
    return [score_of(d) for d in documents]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_maps_sorted_results_back_by_index(
    serve: Serve, protocol: RerankProtocol
) -> None:
    app = rerank_app(by_name, protocol=protocol)
    server = serve(app)
    memories = ["m3", "m50", "m7", "m99", "m0"]
    scores = asyncio.run(score_with(make_scorer(server.url, protocol), "q", memories))
    assert scores.values == pytest.approx([0.03, 0.5, 0.07, 0.99, 0.0])
    assert scores.requests == 1 and app.state.calls == 1


def test_rerank_scorer_sends_the_cohere_shaped_request_with_bearer_key(
    serve: Serve,
) -> None:
    app = rerank_app(by_name)
    server = serve(app)
    scorer = make_scorer(server.url + "/v2", "rerank", api_key="co-key-1")
    asyncio.run(score_with(scorer, "what about {x}?", ["m1", "m2"]))
    request = app.state.last_request
    assert request["json"] == {
        "model": "reranker",
        "query": "what about {x}?",
        "documents": ["m1", "m2"],
        "top_n": 2,
    }
    assert request["headers"]["authorization"] == "Bearer co-key-1"
    assert "co-key-1" not in repr(scorer)


def test_rerank_requests_carry_their_headers_json_body_and_the_providers_cookie(
    serve: Serve,
) -> None:
    # The scorer builds its requests once and sends them on its own connections: they carry
    # the JSON body, the key, earm's name and a cookie the provider set (session affinity).
    def set_cookie_first(query: str, documents: list[str]) -> list[float | None]:
        if app.state.calls == 1:
            raise HTTPFault(503, "warming", headers={"Set-Cookie": "lb=node-2; Path=/",
                                                     "Retry-After": "0"})
        return by_name(query, documents)

    app = rerank_app(set_cookie_first)
    server = serve(app)
    scores = asyncio.run(score_with(make_scorer(server.url, "rerank", api_key="k"), "q", ["m4"]))
    assert scores.values == pytest.approx([0.04]) and scores.requests == 2
    headers = app.state.last_request["headers"]
    assert headers["cookie"] == "lb=node-2"
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer k"
    assert headers["user-agent"].startswith("earm/")
    assert headers["host"] == server.url.removeprefix("http://")


def test_tei_scorer_sends_the_tei_shaped_request(serve: Serve) -> None:
    app = rerank_app(by_name, protocol="tei")
    server = serve(app)
    asyncio.run(score_with(make_scorer(server.url, "tei"), "q", ["m1", "m2"]))
    assert app.state.last_request["json"] == {
        "query": "q",
        "texts": ["m1", "m2"],
        "raw_scores": False,
    }
    assert "authorization" not in app.state.last_request["headers"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_batches_documents_and_sends_batches_concurrently(
    serve: Serve, protocol: RerankProtocol
) -> None:
    batches: list[list[str]] = []

    async def slow(query: str, documents: list[str]) -> list[float | None]:
        batches.append(documents)
        await asyncio.sleep(0.1)
        return by_name(query, documents)

    app = rerank_app(slow, protocol=protocol)
    server = serve(app)
    memories = [f"m{i}" for i in range(23)]
    scores = asyncio.run(
        score_with(make_scorer(server.url, protocol, batch_size=10), "q", memories)
    )
    assert scores.values == pytest.approx([i / 100 for i in range(23)])
    assert scores.requests == 3
    assert sorted(len(b) for b in batches) == [3, 10, 10]
    assert sorted(d for b in batches for d in b) == sorted(memories)
    assert app.state.max_in_flight == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_leaves_documents_the_backend_omits_unobserved(
    serve: Serve, protocol: RerankProtocol
) -> None:
    def drop_odd(query: str, documents: list[str]) -> list[float | None]:
        return [None if score_of(d) * 100 % 2 else score_of(d) for d in documents]

    server = serve(rerank_app(drop_odd, protocol=protocol))
    scorer = make_scorer(server.url, protocol)
    scores = asyncio.run(score_with(scorer, "q", ["m1", "m2", "m3", "m4"]))
    assert scores.values == [None, pytest.approx(0.02), None, pytest.approx(0.04)]
    assert scorer.outcomes == {"ok": 2, "unparseable": 2}


@pytest.mark.parametrize(
    ("raw", "clip", "sigmoid"),
    [
        (0.3, 0.3, 1 / (1 + math.exp(-0.3))),
        (-4.0, 0.0, 1 / (1 + math.exp(4.0))),
        (7.5, 1.0, 1 / (1 + math.exp(-7.5))),
        (-1000.0, 0.0, 0.0),
        (1000.0, 1.0, 1.0),
        (math.nan, None, None),
        ("0.5", None, None),
        (None, None, None),
        (True, None, None),
    ],
)
def test_score_transforms_put_every_score_in_the_unit_interval(
    raw: object, clip: float | None, sigmoid: float | None
) -> None:
    assert transform_score(raw, "clip") == (None if clip is None else pytest.approx(clip))
    assert transform_score(raw, "sigmoid") == (None if sigmoid is None else pytest.approx(sigmoid))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_applies_the_sigmoid_to_logits(
    serve: Serve, protocol: RerankProtocol
) -> None:
    server = serve(rerank_app(lambda q, docs: [-2.0, 0.0, 3.0], protocol=protocol))
    scorer = make_scorer(server.url, protocol, transform="sigmoid")
    scores = asyncio.run(score_with(scorer, "q", ["a", "b", "c"]))
    assert scores.values == pytest.approx([1 / (1 + math.exp(2.0)), 0.5, 1 / (1 + math.exp(-3.0))])


def test_rerank_scorer_clips_out_of_range_scores(serve: Serve) -> None:
    server = serve(rerank_app(lambda q, docs: [-2.0, 0.4, 3.0]))
    scores = asyncio.run(score_with(make_scorer(server.url, "rerank"), "q", ["a", "b", "c"]))
    assert scores.values == pytest.approx([0.0, 0.4, 1.0])


def test_rerank_scorer_ignores_results_with_indices_outside_the_batch(
    serve: Serve,
) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/rerank")
    async def bogus() -> dict[str, object]:
        return {
            "results": [
                {"index": 5, "relevance_score": 0.9},
                {"index": -1, "relevance_score": 0.9},
                {"index": "0", "relevance_score": 0.9},
                {"index": 1, "relevance_score": 0.2},
            ]
        }

    server = serve(app)
    scores = asyncio.run(score_with(make_scorer(server.url, "rerank"), "q", ["a", "b"]))
    assert scores.values == [None, pytest.approx(0.2)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_loses_only_the_failing_batch(
    serve: Serve, protocol: RerankProtocol
) -> None:
    def fail_first_batch(query: str, documents: list[str]) -> list[float | None]:
        if "m0" in documents:
            raise HTTPFault(500, "internal")
        return by_name(query, documents)

    app = rerank_app(fail_first_batch, protocol=protocol)
    server = serve(app)
    scorer = make_scorer(server.url, protocol, batch_size=2, max_retries=1)
    scores = asyncio.run(score_with(scorer, "q", ["m0", "m1", "m2", "m3", "m4"]))
    assert scores.values == [
        None,
        None,
        pytest.approx(0.02),
        pytest.approx(0.03),
        pytest.approx(0.04),
    ]
    assert scores.requests == 4  # the failing batch was tried twice
    assert app.state.calls == 4
    assert scorer.outcomes == {"ok": 3, "http_error": 2}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_retries_a_429_honouring_retry_after(
    serve: Serve, protocol: RerankProtocol
) -> None:
    def limited(query: str, documents: list[str]) -> list[float | None]:
        if app.state.calls == 1:
            raise HTTPFault(429, "slow down", headers={"Retry-After": "0.2"})
        return by_name(query, documents)

    app = rerank_app(limited, protocol=protocol)
    server = serve(app)
    started = time.perf_counter()
    scores = asyncio.run(score_with(make_scorer(server.url, protocol), "q", ["m5"]))
    assert time.perf_counter() - started >= 0.2
    assert scores.values == pytest.approx([0.05])
    assert scores.requests == 2


def test_rerank_scorer_does_not_retry_a_400(serve: Serve) -> None:
    def refuse(query: str, documents: list[str]) -> list[float | None]:
        raise HTTPFault(400, "bad model")

    app = rerank_app(refuse)
    server = serve(app)
    scores = asyncio.run(
        score_with(make_scorer(server.url, "rerank", max_retries=3), "q", ["a", "b"])
    )
    assert scores.values == [None, None] and app.state.calls == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_gives_up_on_a_hung_backend_at_the_deadline(
    serve: Serve, protocol: RerankProtocol
) -> None:
    async def hang(query: str, documents: list[str]) -> list[float | None]:
        await asyncio.sleep(5.0)
        return by_name(query, documents)

    server = serve(rerank_app(hang, protocol=protocol))
    scorer = make_scorer(server.url, protocol, timeout_s=0.3, batch_size=2, concurrency=1)
    started = time.perf_counter()
    scores = asyncio.run(score_with(scorer, "q", [f"m{i}" for i in range(6)]))
    assert time.perf_counter() - started < 0.3 + 0.6  # one deadline, not three batches of it
    assert scores.values == [None] * 6
    assert scorer.outcomes == {"timeout": 6}


def test_rerank_scorer_gives_none_for_a_body_that_is_not_the_protocol(
    serve: Serve,
) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/rerank")
    async def tei_shaped() -> list[dict[str, object]]:  # a list, where {"results": …} belongs
        return [{"index": 0, "score": 0.5}, {"index": 1, "score": 0.5}]

    server = serve(app)
    scorer = make_scorer(server.url, "rerank")
    scores = asyncio.run(score_with(scorer, "q", ["m1", "m2"]))
    assert scores.values == [None, None]
    assert scorer.outcomes == {"unparseable": 2}


#: The answer cap the scorers of the test below get (EARM_SCORER_MAX_ANSWER_BYTES), and what a
#: backend can have sent beyond what the scorer read when it hangs up (test_http_client.py: SLACK).
ANSWER_CAP = 2**20
SLACK = 4 * 2**20


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_fails_endless_answers_as_too_large_after_reading_at_most_the_cap(
    endless_backend, protocol: RerankProtocol, framing: str,
) -> None:
    backend = endless_backend(framing)
    settings = Settings(scorer=protocol, scorer_base_url=backend.url, scorer_timeout_s=60.0,
                        scorer_max_answer_bytes=ANSWER_CAP, _env_file=None)
    scorer = build_scorer(settings.scoring)
    assert isinstance(scorer, RerankScorer)
    scores = asyncio.run(score_with(scorer, "q", [f"m{i}" for i in range(192)]))
    assert scores.values == [None] * 192
    for sent in backend.sent():
        assert sent.cut_off and sent.body <= ANSWER_CAP + SLACK, sent
    assert scorer.outcomes == {"too_large": 192}
    assert backend.requests == 3  # one per batch of 64: an answer over the cap is not asked again


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rerank_scorer_slots_survive_a_cancellation_at_any_point_of_a_call(
    serve: Serve, protocol: RerankProtocol
) -> None:
    server = serve(rerank_app(by_name, protocol=protocol))
    memories = [f"m{i}" for i in range(8)]
    embeddings = np.zeros((8, 0))

    async def cancel_at_every_step_then_score() -> list[float | None]:
        scorer = make_scorer(
            server.url, protocol, timeout_s=0.5, concurrency=4, batch_size=2, max_retries=0
        )
        try:
            for steps in range(50):
                call = asyncio.create_task(scorer.score("q", QUERY_EMBEDDING, memories, embeddings))
                for _ in range(steps):
                    await asyncio.sleep(0)
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
            return (await scorer.score("q", QUERY_EMBEDDING, memories, embeddings)).values
        finally:
            await scorer.aclose()

    assert asyncio.run(cancel_at_every_step_then_score()) == pytest.approx(
        [i / 100 for i in range(8)]
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_build_scorer_builds_a_reranker_from_settings(protocol: RerankProtocol) -> None:
    settings = Settings(
        scorer=protocol,
        scorer_base_url="http://127.0.0.1:9/v1/",
        scorer_model="bge-reranker",
        scorer_batch_size=32,
        scorer_score_transform="sigmoid",
    )
    scorer = build_scorer(settings.scoring)
    assert isinstance(scorer, RerankScorer)
    assert (scorer.url, scorer.name, scorer.protocol) == (
        "http://127.0.0.1:9/v1/rerank",
        protocol,
        protocol,
    )
    assert (scorer.model, scorer.batch_size, scorer.transform) == ("bge-reranker", 32, "sigmoid")
    asyncio.run(scorer.aclose())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_settings_refuse_a_reranker_without_a_base_url(protocol: RerankProtocol) -> None:
    with pytest.raises(
        ValidationError, match=f"EARM_SCORER={protocol} requires EARM_SCORER_BASE_URL"
    ):
        Settings(scorer=protocol, scorer_base_url=None, _env_file=None)
