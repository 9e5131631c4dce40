"""The stand-in of an OpenAI-compatible embeddings endpoint."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from fastapi import FastAPI, Request

from service.testing.stand_in import BadRequest, answer_post, maybe_await, openai_app

#: The input texts -> one vector per text (lists or a numpy array).
EmbedFn = Callable[[list[str]], "Any | Awaitable[Any]"]


def embeddings_app(
    embed: EmbedFn, model: str = "loopback-embedder", out_of_order: bool = False
) -> FastAPI:
    """An OpenAI-compatible ``POST /v1/embeddings`` whose vectors come from ``embed``.

    ``embed`` receives the input texts (a single string input becomes a one-element list) and
    returns one vector per text (lists or a numpy array); it may be a coroutine function and may
    raise :class:`~service.testing.HTTPFault`. ``out_of_order=True`` returns the ``data`` items
    in reverse order (with correct ``index`` fields), which the OpenAI protocol allows, to check
    that clients order by ``index``. Counters on ``app.state`` as in
    :func:`~service.testing.chat_completions_app`.
    """
    app = openai_app("loopback embeddings", model)

    async def answer(body: Any) -> dict[str, Any]:
        raw = body.get("input") if isinstance(body, dict) else None
        if isinstance(raw, str):
            texts = [raw]
        elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
            texts = list(raw)
        else:
            raise BadRequest("'input' must be a string or a list of strings")
        vectors = await maybe_await(embed(texts))
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
        return await answer_post(app, request, answer)

    return app


def text_vector(text: str, dim: int) -> list[float]:
    """A vector of ``dim`` numbers determined by ``text`` (normal, seeded by its CRC-32): the same
    text, the same vector, in every run."""
    vector: list[float] = np.random.default_rng(zlib.crc32(text.encode())).normal(size=dim).tolist()
    return vector


class GatedEmbed:
    """An ``embed`` callback for :func:`embeddings_app` that holds every request with a text
    starting with ``held_prefix`` until :attr:`opened` is set (at most ``wait_s``), and answers
    the others at once: a test holds an ingest inside its embedding while it checks what else
    the service does meanwhile. :attr:`arrived` is released once per held request. Vectors are
    :func:`text_vector` of ``dim`` numbers."""

    def __init__(self, dim: int, held_prefix: str = "held:", wait_s: float = 60.0) -> None:
        self.dim = dim
        self.held_prefix = held_prefix
        self.wait_s = wait_s
        self.opened = threading.Event()
        self.arrived = threading.Semaphore(0)

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        if any(text.startswith(self.held_prefix) for text in texts):
            self.arrived.release()
            # In a worker thread: the stand-in's own event loop keeps answering other requests.
            await asyncio.to_thread(self.opened.wait, self.wait_s)
        return [text_vector(text, self.dim) for text in texts]
