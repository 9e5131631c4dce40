"""Real HTTP stand-ins for the providers earm calls, served on loopback: a public helper for
testing earm, or code that talks to it, without an LLM or embedding provider.

As starlette ships its test client, earm ships these. Its own tests and its benchmarks (the
earm-bench distribution) use them, and so can anyone who builds on earm. They are talked to
through the very same client code that talks to OpenAI, vLLM or Ollama in production, so
retries, timeouts, concurrency limits and response parsing are exercised for real (sockets,
HTTP framing, JSON) rather than through mocks. The apps speak just enough of each protocol for
earm's clients; the behaviour (scores, vectors, latency, faults) is supplied by a plain callback,
which may be a coroutine function and may raise :class:`HTTPFault` to answer with an error.
:func:`chat_answer` is the judge's answer to one request body, for a server of one's own.

- :class:`LoopbackServer` serves any ASGI app on 127.0.0.1 (a free port) from a thread of its
  own, as a context manager;
- :func:`chat_completions_app`: ``POST /v1/chat/completions`` (the LLM judge, optionally with
  log-probabilities); :func:`embeddings_app`: ``POST /v1/embeddings``; :func:`rerank_app`:
  ``POST /rerank`` in the Cohere/vLLM or the text-embeddings-inference shape, whose request and
  response shapes are :func:`rerank_request` and :func:`rerank_response` (at
  :data:`RERANK_PATHS`); :class:`GatedEmbed`, an embeddings callback that holds chosen texts
  until the test lets them through, and :class:`GatedReply`, its chat judge counterpart. Each
  app counts its requests on ``app.state`` (``calls``, ``in_flight``, ``max_in_flight``,
  ``last_request``);
- :func:`free_port`, :func:`wait_ready` and :func:`interrupt`: start, await and stop an
  ``earm serve`` or ``earm worker`` process;
- :mod:`service.testing.standby`: an embedded primary with a real streaming standby, for read
  replicas (imported from there: it needs the embedded Postgres).

Typical use::

    from service.settings import Settings
    from service.testing import LoopbackServer, chat_completions_app

    app = chat_completions_app(lambda prompt: "0.8")
    with LoopbackServer(app) as server:
        settings = Settings(scorer="openai", scorer_base_url=server.url + "/v1")
        ...
    assert app.state.calls == 3
"""

from service.testing.chat import GatedReply, ReplyFn, chat_answer, chat_completions_app
from service.testing.embeddings import EmbedFn, GatedEmbed, embeddings_app, text_vector
from service.testing.processes import free_port, interrupt, wait_ready
from service.testing.rerank import (
    RERANK_PATHS,
    RerankFn,
    rerank_app,
    rerank_request,
    rerank_response,
)
from service.testing.server import HTTPFault, LoopbackServer

__all__ = [
    "RERANK_PATHS",
    "EmbedFn",
    "GatedEmbed",
    "GatedReply",
    "HTTPFault",
    "LoopbackServer",
    "RerankFn",
    "ReplyFn",
    "chat_answer",
    "chat_completions_app",
    "embeddings_app",
    "free_port",
    "interrupt",
    "rerank_app",
    "rerank_request",
    "rerank_response",
    "text_vector",
    "wait_ready",
]
