"""Real HTTP stand-ins for the LLM and embedding providers, served on loopback.

Tests and benchmarks talk to these through the very same httpx code path that talks to OpenAI,
vLLM or Ollama in production, so retries, timeouts, concurrency limits and response parsing are
exercised for real (sockets, HTTP framing, JSON) rather than through mocks of our own code. The
apps speak just enough of the OpenAI protocol for earm's clients; the behaviour (scores, vectors,
latency, faults) is supplied by a plain callback.

Typical use::

    app = chat_completions_app(lambda prompt: "0.8")
    with LoopbackServer(app) as server:
        scorer = OpenAIChatScorer(base_url=server.url + "/v1", model="judge")
        ...
    assert app.state.calls == 3

Over 400 lines on purpose: the stand-ins of the three provider protocols (chat completions,
embeddings, rerank) share one request handler, fault injection and call counters here.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

logger = logging.getLogger(__name__)

__all__ = [
    "HTTPFault",
    "LoopbackServer",
    "RERANK_PATHS",
    "chat_completions_app",
    "embeddings_app",
    "rerank_app",
    "rerank_request",
    "rerank_response",
]

T = TypeVar("T")

ReplyFn = Callable[[str], "str | Awaitable[str]"]
EmbedFn = Callable[[list[str]], "Any | Awaitable[Any]"]
#: (query, documents) -> one raw score per document, ``None`` to leave that document out.
RerankFn = Callable[[str, list[str]], "list[float | None] | Awaitable[list[float | None]]"]


class LoopbackServer:
    """Runs an ASGI app with uvicorn on 127.0.0.1 in a daemon thread; a context manager.

    A separate thread with its own event loop (rather than a task on the caller's loop) lets the
    same server serve synchronous benchmark code, ``asyncio.run`` based tests and several client
    event loops in turn, and keeps a slow stand-in from stalling the client under test.
    ``port=0`` asks the OS for a free port; the port actually bound is read back from the
    listening socket, so parallel test runs never collide.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, loop: str = "asyncio"
    ) -> None:
        self.app = app
        self.loop = loop
        self.host = host
        self.port = port
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> LoopbackServer:
        """Start serving; returns once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("LoopbackServer already started")
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            loop=self.loop,
            log_level="warning",
            lifespan="on",
            # Stand-ins may be sleeping in a handler to simulate a hung provider; do not let
            # that hold up stop() for the whole simulated latency.
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="loopback-server", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"loopback server failed to start on {self.host}:{self.port}")
            if time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"loopback server did not start within {timeout_s} s")
            time.sleep(0.005)
        sockname = server.servers[0].sockets[0].getsockname()
        self.port = int(sockname[1])
        self.url = f"http://{self.host}:{self.port}"
        logger.debug("loopback server listening on %s", self.url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for its thread; idempotent."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("loopback server on %s did not stop within %s s", self.url, timeout_s)
        self._server = None
        self._thread = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class HTTPFault(Exception):
    """Raised by a reply/embed callback to answer with an HTTP error instead of a result.

    ``headers`` lets a stand-in send e.g. ``Retry-After`` with a 429, as real providers do.
    """

    def __init__(
        self, status: int, body: str = "", headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def _fault_response(fault: HTTPFault) -> JSONResponse:
    """An error body shaped like OpenAI's, so clients can parse it the same way."""
    payload = {
        "error": {
            "message": fault.body or f"HTTP {fault.status}",
            "type": "loopback_fault",
            "code": fault.status,
        }
    }
    return JSONResponse(payload, status_code=fault.status, headers=fault.headers)


class _BadRequest(ValueError):
    """The request does not speak the protocol; answered 400 like OpenAI does."""


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": 400}},
        status_code=400,
    )


async def _maybe_await(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


def _init_counters(app: FastAPI) -> None:
    """Request accounting shared by both apps; mutated only on the server's event loop."""
    app.state.calls = 0
    app.state.in_flight = 0
    app.state.max_in_flight = 0
    app.state.last_request = None  # {"headers": {...}, "json": {...}} of the latest POST


class _Track:
    """Counts one request and keeps the in-flight high-water mark (for concurrency tests)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def __enter__(self) -> None:
        state = self.app.state
        state.calls += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)

    def __exit__(self, *exc: object) -> None:
        self.app.state.in_flight -= 1


def _message_text(content: Any) -> str:
    """Content of one chat message: a string, or OpenAI's list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _openai_app(title: str, model: str) -> FastAPI:
    """An app with the request counters and ``GET /v1/models`` listing ``model``."""
    app = FastAPI(title=title)
    _init_counters(app)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "loopback"}],
        }

    return app


async def _serve(
    app: FastAPI, request: Request, answer: Callable[[Any], Awaitable[Any]]
) -> Any:
    """One POST: counted, its JSON body recorded as ``last_request`` and answered by
    ``answer``, or a 400 (not JSON, or :class:`_BadRequest`) or the callback's
    :class:`HTTPFault`."""
    with _Track(app):
        try:
            body = await request.json()
        except ValueError:
            return _bad_request("body is not valid JSON")
        app.state.last_request = {"headers": dict(request.headers), "json": body}
        try:
            return await answer(body)
        except _BadRequest as exc:
            return _bad_request(str(exc))
        except HTTPFault as fault:
            return _fault_response(fault)


def chat_completions_app(
    reply: ReplyFn, model: str = "loopback-judge", logprobs: bool = False
) -> FastAPI:
    """An OpenAI-compatible ``POST /v1/chat/completions`` whose answers come from ``reply``.

    ``reply`` receives the contents of all request messages (system, then user, …) joined by
    ``"\\n\\n"`` as one prompt string and returns the assistant text. It may be a coroutine
    function (``await asyncio.sleep(...)`` simulates latency without blocking other requests;
    a *synchronous* reply runs on the server's event loop and should be quick) and may raise
    :class:`HTTPFault` to answer with an HTTP error.

    ``app.state`` exposes ``calls`` (every POST, including faulted ones), ``in_flight``,
    ``max_in_flight`` and ``last_request`` (headers and JSON body of the latest POST).
    ``GET /v1/models`` lists ``model``.

    ``logprobs=True`` makes it a model that reports log-probabilities: a request asking for
    ``logprobs`` gets the one-token answer "yes" or "no" with ``top_logprobs`` giving "yes"
    the probability ``float(reply(prompt))`` (a reply that is not a probability is answered as
    is). Without it, ``logprobs`` in a request is ignored, as some servers do.
    """
    app = _openai_app("loopback chat completions", model)
    ids = itertools.count(1)

    async def answer(body: Any) -> dict[str, Any]:
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' must be a non-empty list")
        prompt = "\n\n".join(
            _message_text(m.get("content")) for m in messages if isinstance(m, dict)
        )
        text = str(await _maybe_await(reply(prompt)))
        completion = _chat_completion(next(ids), body.get("model") or model, prompt, text)
        if logprobs and body.get("logprobs") is True:
            _answer_yes_no(completion, text)
        return completion

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _serve(app, request, answer)

    return app


def _chat_completion(number: int, model: str, prompt: str, text: str) -> dict[str, Any]:
    """A chat-completions response body answering ``prompt`` with ``text``."""
    prompt_tokens = len(prompt.split())
    completion_tokens = len(text.split())
    return {
        "id": f"chatcmpl-loopback-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _answer_yes_no(completion: dict[str, Any], text: str) -> None:
    """Turn ``completion`` into a yes/no answer with log-probabilities, if ``text`` is a
    probability; ``log(0)`` is reported as -100 (JSON has no infinity)."""
    try:
        p_yes = float(text)
    except ValueError:
        return
    if not 0.0 <= p_yes <= 1.0:
        return
    choice = completion["choices"][0]
    answer = "yes" if p_yes >= 0.5 else "no"
    choice["message"]["content"] = answer
    logprob = {
        token: math.log(p) if p > 0 else -100.0
        for token, p in (("yes", p_yes), ("no", 1.0 - p_yes))
    }
    top = [
        {"token": token, "logprob": logprob[token], "bytes": None}
        for token in sorted(logprob, key=lambda token: -logprob[token])
    ]
    choice["logprobs"] = {
        "content": [
            {"token": answer, "logprob": logprob[answer], "bytes": None, "top_logprobs": top}
        ]
    }


def embeddings_app(
    embed: EmbedFn, model: str = "loopback-embedder", out_of_order: bool = False
) -> FastAPI:
    """An OpenAI-compatible ``POST /v1/embeddings`` whose vectors come from ``embed``.

    ``embed`` receives the input texts (a single string input becomes a one-element list) and
    returns one vector per text (lists or a numpy array); it may be a coroutine function and may
    raise :class:`HTTPFault`. ``out_of_order=True`` returns the ``data`` items in reverse order
    (with correct ``index`` fields), which the OpenAI protocol allows, to check that clients
    order by ``index``. Counters on ``app.state`` as in :func:`chat_completions_app`.
    """
    app = _openai_app("loopback embeddings", model)

    async def answer(body: Any) -> dict[str, Any]:
        raw = body.get("input") if isinstance(body, dict) else None
        if isinstance(raw, str):
            texts = [raw]
        elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
            texts = list(raw)
        else:
            raise _BadRequest("'input' must be a string or a list of strings")
        vectors = await _maybe_await(embed(texts))
        rows = [[float(x) for x in vector] for vector in vectors]
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
        if out_of_order:
            data.reverse()
        tokens = sum(len(t.split()) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model") or model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        return await _serve(app, request, answer)

    return app


#: Where the rerank stand-ins answer (providers put it under a version prefix or not).
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")


def rerank_app(
    rerank: RerankFn, protocol: str = "rerank", model: str = "loopback-reranker"
) -> FastAPI:
    """A ``POST /rerank`` (also at ``/v1/rerank`` and ``/v2/rerank``) whose scores come from
    ``rerank``.

    ``protocol="rerank"`` speaks the shape Cohere v2, Jina, vLLM, llama.cpp and Infinity share
    (``{"model", "query", "documents", "top_n"}`` answered by ``{"results": [{"index",
    "relevance_score", "document"}]}``); ``protocol="tei"`` speaks text-embeddings-inference's
    (``{"query", "texts", "raw_scores"}`` answered by ``[{"index", "score"}]``). Like the real
    servers, results come sorted by descending score, so clients must map them by ``index``;
    ``top_n`` cuts the list. ``rerank`` may be a coroutine function, may raise
    :class:`HTTPFault`, and returns ``None`` for a document the server should leave out.
    Counters on ``app.state`` as in :func:`chat_completions_app`.
    """
    if protocol not in ("rerank", "tei"):
        raise ValueError(f"unknown rerank protocol {protocol!r}")
    app = _openai_app(f"loopback {protocol}", model)

    async def answer(body: Any) -> Any:
        query, documents = rerank_request(body, protocol)
        scores = await _maybe_await(rerank(query, documents))
        return rerank_response(body, documents, scores, protocol, model)

    for path in RERANK_PATHS:

        async def endpoint(request: Request) -> Any:
            return await _serve(app, request, answer)

        app.post(path)(endpoint)

    return app


def rerank_request(body: Any, protocol: str) -> tuple[str, list[str]]:
    """The query and documents of a rerank request body of ``protocol`` (see
    :func:`rerank_app`); a :class:`ValueError` saying what is wrong if it has none."""
    documents_key = "texts" if protocol == "tei" else "documents"
    query = body.get("query") if isinstance(body, dict) else None
    documents = body.get(documents_key) if isinstance(body, dict) else None
    if not isinstance(query, str):
        raise _BadRequest("'query' must be a string")
    if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise _BadRequest(f"'{documents_key}' must be a list of strings")
    return query, list(documents)


def rerank_response(
    body: Any, documents: list[str], scores: list[float | None], protocol: str, model: str
) -> Any:
    """The answer of ``protocol`` to the rerank request ``body``, giving ``documents`` their
    ``scores`` (``None``: left out), sorted by descending score and cut to ``top_n``."""
    ranked = sorted(
        ((i, float(s)) for i, s in enumerate(scores) if s is not None), key=lambda r: -r[1]
    )
    if protocol == "tei":
        return [{"index": i, "score": s} for i, s in ranked]
    top_n = body.get("top_n")
    if isinstance(top_n, int):
        ranked = ranked[:top_n]
    return {
        "id": "rerank-loopback",
        "model": body.get("model") or model,
        "results": [
            {"index": i, "relevance_score": s, "document": {"text": documents[i]}}
            for i, s in ranked
        ],
        "usage": {"total_tokens": sum(len(d.split()) for d in documents)},
    }
