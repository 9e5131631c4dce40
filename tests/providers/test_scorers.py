"""Relevance scorers: the offline cosine mapping, and the LLM judge against a real loopback
chat-completions server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from service.providers.chat_scorer import OpenAIChatScorer, parse_batch, parse_score
from service.providers.factory import build_scorer
from service.providers.http_client import PoolLimits
from service.providers.http_scorer import FailureLog
from service.providers.scorers import (
    LOCAL_CENTER,
    LOCAL_TEMPERATURE,
    LocalScorer,
    Scores,
    cosine_to_score,
)
from service.settings import Settings
from service.testing import HTTPFault, LoopbackServer, chat_completions_app

Serve = Callable[[object], LoopbackServer]  # the `serve` fixture (conftest.py)

DIM = 4
QUERY_EMBEDDING = np.zeros(DIM, dtype=np.float32)


# --- local scorer -----------------------------------------------------------------------------


def unit_vectors_with_cosines(cosines: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """A query e0 and memories whose cosine with it is exactly each given value."""
    query = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    memories = np.array([[c, math.sqrt(1 - c * c), 0.0] for c in cosines], dtype=np.float32)
    return query, memories


def local_scores(
    query_text: str, query: np.ndarray, texts: list[str], memories: np.ndarray
) -> list[float | None]:
    return asyncio.run(LocalScorer().score(query_text, query, texts, memories)).values


def test_local_scorer_maps_cosine_through_the_documented_sigmoid() -> None:
    cosines = [-1.0, -0.2, 0.0, 0.2, 0.35, 0.5, 0.69, 0.9, 1.0]
    query, memories = unit_vectors_with_cosines(cosines)
    scores = local_scores("q", query, ["m"] * len(cosines), memories)
    reference = [1 / (1 + math.exp(-(c - 0.35) / 0.08)) for c in cosines]
    assert scores == pytest.approx(reference, abs=1e-6)
    assert (LOCAL_CENTER, LOCAL_TEMPERATURE) == (0.35, 0.08)
    assert scores[cosines.index(0.35)] == pytest.approx(0.5)


def test_local_scorer_is_monotone_and_bounded() -> None:
    cosines = np.linspace(-1, 1, 201)
    scores = cosine_to_score(cosines)
    assert np.all(np.diff(scores) >= 0)
    assert np.all((scores >= 0) & (scores <= 1))
    assert np.isfinite(scores).all()


def test_local_scorer_does_not_need_normalised_or_nonzero_vectors() -> None:
    query = np.array([2.0, 0.0, 0.0])
    memories = np.array([[5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    scores = local_scores("q", query, ["a", "b"], memories)
    assert scores[0] == pytest.approx(float(cosine_to_score(1.0)))
    assert scores[1] == pytest.approx(float(cosine_to_score(0.0)))


def test_local_scorer_with_no_memories_returns_nothing() -> None:
    assert local_scores("q", QUERY_EMBEDDING, [], np.zeros((0, DIM))) == []


def test_local_scorer_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError):
        local_scores("q", QUERY_EMBEDDING, ["a", "b"], np.ones((3, DIM)))


# --- reply parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("0.8", 0.8),
        ("Score: 0.35", 0.35),
        ("1", 1.0),
        ("1.0", 1.0),
        ("0", 0.0),
        ("The relevance is .9 out of 1", 0.9),
        ("0,7", 0.7),
        ("**0.25**\n", 0.25),
        ("I cannot", None),
        ("", None),
        ("7", None),
        ("80%", None),
        ("8/10", None),
        ("-0.2", None),
        ("1.5e-1", None),
    ],
)
def test_parse_score_takes_the_first_number_and_requires_it_in_unit_interval(
    reply: str, score: float | None
) -> None:
    assert parse_score(reply) == (pytest.approx(score) if score is not None else None)


# --- OpenAI chat scorer over loopback HTTP ------------------------------------------------------

MEMORY_IN_PROMPT = re.compile(r"Memory:\n(.*)\n\nRelevance \(0 to 1\):", re.S)


def memory_of(prompt: str) -> str:
    match = MEMORY_IN_PROMPT.search(prompt)
    assert match is not None, "prompt does not follow the documented layout"
    return match.group(1)


def make_scorer(url: str, **kwargs: object) -> OpenAIChatScorer:
    options: dict[str, object] = {"timeout_s": 2.0, "backoff_base_s": 0.01}
    options.update(kwargs)
    return OpenAIChatScorer(base_url=url + "/v1", model="judge", **options)  # type: ignore[arg-type]


async def score_with(
    scorer: OpenAIChatScorer, query: str, memories: list[str]
) -> list[float | None]:
    try:
        embeddings = np.zeros((len(memories), DIM))
        scores = await scorer.score(query, QUERY_EMBEDDING, memories, embeddings)
        return scores.values
    finally:
        await scorer.aclose()


def test_openai_scorer_parses_scores_from_typical_replies(serve: Serve) -> None:
    replies = {
        "m-a": "0.8",
        "m-b": "Score: 0.35",
        "m-c": "1",
        "m-d": "The relevance is .9 out of 1",
    }
    app = chat_completions_app(lambda prompt: replies[memory_of(prompt)])
    server = serve(app)
    scorer = make_scorer(server.url)
    scores = asyncio.run(score_with(scorer, "q", list(replies)))
    assert scores == pytest.approx([0.8, 0.35, 1.0, 0.9])
    assert scorer.outcomes["ok"] == 4 and scorer.calls_failed == 0


def test_openai_scorer_makes_exactly_one_call_per_pair(serve: Serve) -> None:
    app = chat_completions_app(lambda prompt: "0.5")
    server = serve(app)
    scores = asyncio.run(score_with(make_scorer(server.url), "q", [f"m{i}" for i in range(25)]))
    assert len(scores) == 25
    assert app.state.calls == 25


def test_openai_scorer_with_no_memories_makes_no_call(serve: Serve) -> None:
    app = chat_completions_app(lambda prompt: "0.5")
    server = serve(app)
    assert asyncio.run(score_with(make_scorer(server.url), "q", [])) == []
    assert app.state.calls == 0


def test_openai_scorer_prompt_contains_query_and_memory_verbatim(
    serve: Serve,
) -> None:
    query = 'What did Anna say about {the trip}?\n  (Paris, "2019") %s'
    memory = "Anna: Paris was great 🎉 — ünïcode, {braces} and\nnewlines\n\tindented"
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return "0.6"

    app = chat_completions_app(reply)
    server = serve(app)
    asyncio.run(score_with(make_scorer(server.url), query, [memory]))
    assert f"Query:\n{query}\n\nMemory:\n{memory}\n\nRelevance (0 to 1):" in prompts[0]
    body = app.state.last_request["json"]
    assert body["temperature"] == 0
    assert 0 < body["max_tokens"] <= 32
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "between 0 and 1" in body["messages"][0]["content"]


def test_openai_scorer_gives_none_for_garbage_and_out_of_range_replies(
    serve: Serve,
) -> None:
    replies = {"good": "0.4", "garbage": "I cannot", "range": "7"}
    app = chat_completions_app(lambda prompt: replies[memory_of(prompt)])
    server = serve(app)
    scorer = make_scorer(server.url)
    scores = asyncio.run(score_with(scorer, "q", list(replies)))
    assert scores == [pytest.approx(0.4), None, None]
    assert scorer.outcomes["unparseable"] == 2
    assert app.state.calls == 3  # a deterministic judge is not asked again


def test_openai_scorer_retries_500_then_gives_none(serve: Serve) -> None:
    def reply(prompt: str) -> str:
        raise HTTPFault(500, "internal")

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = make_scorer(server.url, max_retries=2)
    assert asyncio.run(score_with(scorer, "q", ["m"])) == [None]
    assert app.state.calls == 3
    assert scorer.outcomes == {"http_error": 1}


def test_a_failing_backend_logs_one_warning_per_interval_not_one_per_retrieve(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    def reply(prompt: str) -> str:
        raise HTTPFault(500, "internal")

    scorer = make_scorer(serve(chat_completions_app(reply)).url, max_retries=0)

    async def three_retrieves() -> None:
        try:
            for _ in range(3):
                await scorer.score("q", QUERY_EMBEDDING, ["m", "n"], np.zeros((2, DIM)))
        finally:
            await scorer.aclose()

    with caplog.at_level(logging.WARNING, logger="service.providers.http_scorer"):
        asyncio.run(three_retrieves())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "2 of 2 calls failed" in warnings[0] and "http_error=2" in warnings[0]
    assert scorer.outcomes == {"http_error": 6}  # every pair is still counted


def test_the_failure_log_names_the_failing_retrieves_it_did_not_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    failure_log = FailureLog(interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="service.providers.http_scorer"):
        logged = [failure_log.failed(["ok", "timeout"], 0.5)]
        for at in (101.0, 105.0, 109.9):
            now[0] = at
            logged.append(failure_log.failed(["timeout"], 0.5))
        now[0] = 112.0
        logged.append(failure_log.failed(["http_error", "http_error"], 0.5))
    assert logged == [True, False, False, False, True]
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "relevance scorer: 1 of 2 calls failed in 0.50 s (timeout=1)"
    assert messages[1] == (
        "relevance scorer: 2 of 2 calls failed in 0.50 s (http_error=2); "
        "3 more retrieves had failed calls in the 12 s before"
    )


def test_openai_scorer_does_not_retry_a_400(serve: Serve) -> None:
    def reply(prompt: str) -> str:
        raise HTTPFault(400, "bad model")

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = make_scorer(server.url, max_retries=2)
    assert asyncio.run(score_with(scorer, "q", ["m"])) == [None]
    assert app.state.calls == 1


def test_openai_scorer_scores_after_a_429(serve: Serve) -> None:
    def reply(prompt: str) -> str:
        if app.state.calls == 1:
            raise HTTPFault(429, "rate limited", headers={"Retry-After": "0.05"})
        return "0.7"

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = make_scorer(server.url)
    assert asyncio.run(score_with(scorer, "q", ["m"])) == [pytest.approx(0.7)]
    assert app.state.calls == 2
    assert scorer.outcomes == {"ok": 1}


def test_openai_scorer_gives_up_when_retry_after_exceeds_the_time_budget(
    serve: Serve,
) -> None:
    def reply(prompt: str) -> str:
        raise HTTPFault(429, "rate limited", headers={"Retry-After": "30"})

    app = chat_completions_app(reply)
    server = serve(app)
    started = time.perf_counter()
    assert asyncio.run(score_with(make_scorer(server.url, timeout_s=1.0), "q", ["m"])) == [None]
    assert time.perf_counter() - started < 0.5
    assert app.state.calls == 1


def test_a_429_backs_off_the_whole_backend_not_one_request(serve: Serve) -> None:
    """After a 429 whose Retry-After outlasts the deadline, a later call of the same scorer
    sends nothing until the wait is over: its pairs fail at once."""

    def reply(prompt: str) -> str:
        if app.state.calls == 1:
            raise HTTPFault(429, "rate limited", headers={"Retry-After": "30"})
        return "0.5"

    app = chat_completions_app(reply)
    server = serve(app)

    async def two_calls() -> tuple[list[float | None], list[float | None]]:
        scorer = make_scorer(server.url, timeout_s=1.0)
        try:
            embeddings = np.zeros((3, DIM))
            first = await scorer.score("q1", QUERY_EMBEDDING, ["m"], embeddings[:1])
            later = await scorer.score("q2", QUERY_EMBEDDING, ["a", "b", "c"], embeddings)
            return first.values, later.values
        finally:
            await scorer.aclose()

    assert asyncio.run(two_calls()) == ([None], [None, None, None])
    assert app.state.calls == 1  # the later call sent nothing into the backoff


class Gate:
    """A chat reply that holds every request until ``expected`` have arrived (each waits at
    most ``wait_s``): requests sent in waves instead of at once are held a ``wait_s`` per wave
    and the server never sees them all in flight."""

    def __init__(self, expected: int, wait_s: float = 2.0) -> None:
        self.expected, self.wait_s = expected, wait_s
        self.arrived = 0
        self.all_in: asyncio.Event | None = None

    async def reply(self, prompt: str) -> str:
        if self.all_in is None:  # created in the stand-in's event loop
            self.all_in = asyncio.Event()
        self.arrived += 1
        if self.arrived >= self.expected:
            self.all_in.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.wait_s):
                await self.all_in.wait()
        return "0.5"


@pytest.mark.parametrize("pairs", [35, 200])
def test_openai_scorer_sends_a_calls_pairs_at_once_over_a_warm_pool(
    serve: Serve, pairs: int
) -> None:
    """A retrieve's anchors cost one round of the backend's latency once the pool holds as many
    connections: a last-stage budget (35) and a first-stage one (all 200 candidates) alike."""
    gate = Gate(0)  # the first call, which fills the pool, is not held
    app = chat_completions_app(gate.reply)
    server = serve(app)
    scorer = OpenAIChatScorer(base_url=server.url + "/v1", model="judge", timeout_s=20.0,
                              pool=PoolLimits(connections=pairs))
    memories = [f"m{i}" for i in range(pairs)]

    async def warm_then_score() -> list[float | None]:
        await scorer.score("q", QUERY_EMBEDDING, memories, np.zeros((pairs, DIM)))
        gate.expected, gate.arrived, gate.all_in = pairs, 0, None
        return await score_with(scorer, "q", memories)

    assert asyncio.run(warm_then_score()) == [0.5] * pairs
    assert app.state.max_in_flight == pairs


def test_openai_scorer_times_out_slow_server_and_returns_promptly(
    serve: Serve,
) -> None:
    async def reply(prompt: str) -> str:
        await asyncio.sleep(2.0)
        return "0.5"

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = make_scorer(server.url, timeout_s=0.3, max_retries=3)
    started = time.perf_counter()
    scores = asyncio.run(score_with(scorer, "q", ["a", "b", "c"]))
    elapsed = time.perf_counter() - started
    assert scores == [None, None, None]
    assert elapsed < 0.3 + 0.6  # one budget for all pairs (one wave), not 4 attempts x 0.3 s
    assert scorer.outcomes == {"timeout": 3}


def test_openai_scorer_deadline_covers_pairs_queued_behind_a_hung_endpoint(
    serve: Serve,
) -> None:
    async def reply(prompt: str) -> str:
        await asyncio.sleep(5.0)
        return "0.5"

    server = serve(chat_completions_app(reply))
    scorer = make_scorer(server.url, timeout_s=0.4, concurrency=2)
    started = time.perf_counter()
    scores = asyncio.run(score_with(scorer, "q", [f"m{i}" for i in range(10)]))
    elapsed = time.perf_counter() - started
    assert scores == [None] * 10
    assert elapsed < 0.4 + 0.6  # one deadline for the request, not five waves of 0.4 s
    assert scorer.outcomes == {"timeout": 10}


def test_openai_scorer_respects_its_concurrency_limit(serve: Serve) -> None:
    async def reply(prompt: str) -> str:
        await asyncio.sleep(0.05)
        return "0.5"

    app = chat_completions_app(reply)
    server = serve(app)
    scores = asyncio.run(
        score_with(make_scorer(server.url, concurrency=4), "q", [f"m{i}" for i in range(20)])
    )
    assert scores == [0.5] * 20
    assert app.state.max_in_flight == 4


def test_openai_scorer_concurrent_requests_share_one_limit(serve: Serve) -> None:
    async def reply(prompt: str) -> str:
        await asyncio.sleep(0.05)
        return "0.5"

    app = chat_completions_app(reply)
    server = serve(app)

    async def two_requests() -> None:
        scorer = make_scorer(server.url, concurrency=3)
        try:
            memories = [f"m{i}" for i in range(9)]
            zeros = np.zeros((9, DIM))
            await asyncio.gather(
                scorer.score("q1", QUERY_EMBEDDING, memories, zeros),
                scorer.score("q2", QUERY_EMBEDDING, memories, zeros),
            )
        finally:
            await scorer.aclose()

    asyncio.run(two_requests())
    assert app.state.calls == 18
    assert app.state.max_in_flight == 3


def test_openai_scorer_slots_survive_a_cancellation_at_any_point_of_a_call(
    serve: Serve,
) -> None:
    """Wherever a cancellation lands (waiting for a slot, connecting, sending, reading or
    closing the response), every slot still serves the next call."""
    server = serve(chat_completions_app(lambda prompt: "0.5"))
    concurrency = 4
    memories = [f"m{i}" for i in range(concurrency)]
    embeddings = np.zeros((concurrency, DIM))

    async def cancel_at_every_step_then_score() -> list[float | None]:
        scorer = make_scorer(server.url, timeout_s=0.5, concurrency=concurrency, max_retries=0)
        try:
            for steps in range(50):
                call = asyncio.create_task(scorer.score("q", QUERY_EMBEDDING, memories, embeddings))
                for _ in range(steps):  # one event-loop iteration each
                    await asyncio.sleep(0)
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
            return (await scorer.score("q", QUERY_EMBEDDING, memories, embeddings)).values
        finally:
            await scorer.aclose()

    assert asyncio.run(cancel_at_every_step_then_score()) == [0.5] * concurrency


def test_openai_scorer_gives_none_when_nothing_listens() -> None:
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        scorer = make_scorer(f"http://127.0.0.1:{port}", max_retries=1)
        assert asyncio.run(score_with(scorer, "q", ["a", "b"])) == [None, None]
        assert scorer.outcomes == {"transport_error": 2}


def test_openai_scorer_sends_bearer_api_key(serve: Serve) -> None:
    app = chat_completions_app(lambda prompt: "0.5")
    server = serve(app)
    scorer = make_scorer(server.url, api_key="sk-judge-1")
    asyncio.run(score_with(scorer, "q", ["m"]))
    assert app.state.last_request["headers"]["authorization"] == "Bearer sk-judge-1"
    assert "sk-judge-1" not in repr(scorer)


#: The answer cap the scorers of the tests below get (EARM_SCORER_MAX_ANSWER_BYTES).
ANSWER_CAP = 2**20
#: What a backend can have sent beyond what the scorer read when it hangs up: the backend's send
#: buffer and the scorer's receive queue (tests/providers/test_http_client.py: SLACK).
SLACK = 4 * 2**20


def capped_settings(url: str, **more: object) -> Settings:
    """The chat scorer of ``url`` with :data:`ANSWER_CAP`, a timeout the tests never reach and
    the default retries."""
    return Settings(scorer="openai", scorer_base_url=url + "/v1", scorer_timeout_s=60.0,
                    scorer_max_answer_bytes=ANSWER_CAP, _env_file=None, **more)


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_openai_scorer_fails_an_endless_answer_as_too_large_after_reading_at_most_the_cap(
    endless_backend, framing: str,
) -> None:
    backend = endless_backend(framing)
    scorer = build_scorer(capped_settings(backend.url).scoring)
    assert isinstance(scorer, OpenAIChatScorer)
    assert asyncio.run(score_with(scorer, "q", ["m1", "m2"])) == [None, None]
    for sent in backend.sent():
        assert sent.cut_off and sent.body <= ANSWER_CAP + SLACK, sent
    assert scorer.outcomes == {"too_large": 2}
    assert backend.requests == 2  # one per pair: an answer over the cap is not asked again


def test_openai_scorer_does_not_ask_a_batch_pair_by_pair_after_an_answer_over_the_cap(
    endless_backend,
) -> None:
    backend = endless_backend("chunked")
    scorer = build_scorer(capped_settings(backend.url, scorer_chat_batch=4).scoring)
    assert isinstance(scorer, OpenAIChatScorer)
    assert asyncio.run(score_with(scorer, "q", ["m1", "m2", "m3"])) == [None] * 3
    for sent in backend.sent():
        assert sent.cut_off and sent.body <= ANSWER_CAP + SLACK, sent
    assert scorer.outcomes == {"too_large": 3}
    assert scorer.batch_fallbacks == 0
    assert backend.requests == 1


# --- factory ----------------------------------------------------------------------------------


def test_build_scorer_defaults_to_the_local_scorer() -> None:
    scorer = build_scorer(Settings(scorer="local").scoring)
    assert isinstance(scorer, LocalScorer) and scorer.name == "local"


def test_settings_refuse_the_openai_scorer_without_a_base_url() -> None:
    with pytest.raises(ValidationError, match="EARM_SCORER=openai requires EARM_SCORER_BASE_URL"):
        Settings(scorer="openai", scorer_base_url=None, _env_file=None)


@pytest.mark.parametrize("url", ["ftp://judge.example/v1", "judge.example/v1", "http://"])
def test_settings_refuse_a_scorer_url_that_is_not_http(url: str) -> None:
    with pytest.raises(ValidationError, match="http:// or https://"):
        Settings(scorer="openai", scorer_base_url=url, _env_file=None)


def test_build_scorer_openai_uses_settings() -> None:
    settings = Settings(
        scorer="openai",
        scorer_base_url="http://127.0.0.1:9/v1/",
        scorer_model="judge-1",
        scorer_concurrency=5,
        scorer_timeout_s=1.5,
    )
    scorer = build_scorer(settings.scoring)
    assert isinstance(scorer, OpenAIChatScorer)
    assert scorer.url == "http://127.0.0.1:9/v1/chat/completions"
    assert (scorer.model, scorer.concurrency, scorer.timeout_s, scorer.name) == (
        "judge-1",
        5,
        1.5,
        "openai",
    )
    asyncio.run(scorer.aclose())


# --- chat scorer: prompt template, logprobs mode, batches ---------------------------------------


def test_openai_scorer_fills_a_custom_prompt_template_verbatim(serve: Serve) -> None:
    prompts: list[str] = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return "0.6"

    server = serve(chat_completions_app(reply))
    template = 'Q={query} | M={memory} | JSON example: {"score": 0.5}'
    scorer = make_scorer(server.url, prompt_template=template)
    assert asyncio.run(score_with(scorer, "asks about {memory}", ["m {query}"])) == [0.6]
    assert prompts[0].endswith('Q=asks about {memory} | M=m {query} | JSON example: {"score": 0.5}')


def test_openai_scorer_refuses_a_template_without_its_placeholders() -> None:
    with pytest.raises(ValueError, match=r"lacks \{memory\}"):
        OpenAIChatScorer(base_url="http://127.0.0.1:9/v1", model="judge", prompt_template="{query}")


def test_build_scorer_reads_the_prompt_file(tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("Does {memory} answer {query}?", encoding="utf-8")
    scorer = build_scorer(
        Settings(
            scorer="openai", scorer_base_url="http://127.0.0.1:9/v1", scorer_prompt_file=prompt_file
        ).scoring
    )
    assert isinstance(scorer, OpenAIChatScorer)
    assert scorer.build_messages("q", "m")[1]["content"] == "Does m answer q?"
    asyncio.run(scorer.aclose())
    prompt_file.write_text("no placeholders", encoding="utf-8")
    with pytest.raises(ValueError, match="EARM_SCORER_PROMPT_FILE"):
        build_scorer(
            Settings(
                scorer="openai",
                scorer_base_url="http://127.0.0.1:9/v1",
                scorer_prompt_file=prompt_file,
            ).scoring
        )


def test_openai_scorer_in_logprobs_mode_stores_the_probability_of_yes(
    serve: Serve,
) -> None:
    probabilities = {"m-a": "0.83", "m-b": "0.1", "m-c": "0"}
    app = chat_completions_app(lambda prompt: probabilities[memory_of(prompt)], logprobs=True)
    server = serve(app)
    scorer = make_scorer(server.url, mode="logprobs")
    assert asyncio.run(score_with(scorer, "q", list(probabilities))) == pytest.approx(
        [0.83, 0.1, 0.0]
    )
    body = app.state.last_request["json"]
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"]) == (True, 5, 1)
    assert "yes or no" in body["messages"][0]["content"]


def test_openai_scorer_in_logprobs_mode_falls_back_to_the_answer_without_logprobs(
    serve: Serve,
) -> None:
    replies = {"m-a": "yes", "m-b": "No.", "m-c": "0.4", "m-d": "maybe"}
    server = serve(chat_completions_app(lambda prompt: replies[memory_of(prompt)]))
    scorer = make_scorer(server.url, mode="logprobs")
    assert asyncio.run(score_with(scorer, "q", list(replies))) == [
        1.0,
        0.0,
        pytest.approx(0.4),
        None,
    ]


BATCH_MEMORY = re.compile(r"\[(\d+)\]\n(m\d+)")


def test_openai_scorer_batches_memories_into_one_prompt(serve: Serve) -> None:
    def reply(prompt: str) -> str:
        memories = BATCH_MEMORY.findall(prompt)
        return "\n".join(f"[{n}] {int(m[1:]) / 100}" for n, m in reversed(memories))

    app = chat_completions_app(reply)
    server = serve(app)

    async def run() -> Scores:
        scorer = make_scorer(server.url, batch=4)
        try:
            return await scorer.score(
                "q", QUERY_EMBEDDING, [f"m{i}" for i in range(10)], np.zeros((10, DIM))
            )
        finally:
            await scorer.aclose()

    scores = asyncio.run(run())
    assert scores.values == pytest.approx([i / 100 for i in range(10)])
    assert scores.requests == 3 and app.state.calls == 3
    assert "[number] score" in app.state.last_request["json"]["messages"][0]["content"]


def test_openai_scorer_scores_a_malformed_batch_pair_by_pair(serve: Serve) -> None:
    def reply(prompt: str) -> str:
        memories = BATCH_MEMORY.findall(prompt)
        if not memories:  # a single-pair prompt
            return str(int(memory_of(prompt)[1:]) / 100)
        if ("1", "m0") in memories:  # the first batch answers only its first memory
            return "[1] 0.5"
        return "\n".join(f"{n}: {int(m[1:]) / 100}" for n, m in memories)

    app = chat_completions_app(reply)
    server = serve(app)
    scorer = make_scorer(server.url, batch=3)

    async def run() -> Scores:
        try:
            return await scorer.score(
                "q", QUERY_EMBEDDING, [f"m{i}" for i in range(6)], np.zeros((6, DIM))
            )
        finally:
            await scorer.aclose()

    scores = asyncio.run(run())
    assert scores.values == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04, 0.05])
    assert scorer.batch_fallbacks == 1
    assert scores.requests == 2 + 3 and app.state.calls == 5
    assert scorer.outcomes == {"ok": 6}


@pytest.mark.parametrize(
    ("reply", "scores"),
    [
        ("[1] 0.5\n[2] 0.25", [0.5, 0.25]),
        ("2: 1\n1: 0", [0.0, 1.0]),
        ("1. 0.3\n\n2) .9\n", [0.3, 0.9]),
        ("[1] 0.5", None),
        ("[1] 0.5\n[2] 7", None),
        ("[1] 0.5\n[1] 0.6", None),
        ("[1] 0.5\n[3] 0.6", None),
        ("[1] 0.5\n[2] 0.6\nbecause", None),
    ],
)
def test_parse_batch_needs_one_valid_score_for_every_memory(
    reply: str, scores: list[float] | None
) -> None:
    assert parse_batch(reply, 2) == (None if scores is None else pytest.approx(scores))
