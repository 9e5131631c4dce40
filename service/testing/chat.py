"""The stand-in of an OpenAI-compatible chat-completions endpoint (the LLM judge)."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request

from service.testing.stand_in import BadRequest, answer_post, maybe_await, openai_app

#: The prompt (every message's content) -> the assistant's text.
ReplyFn = Callable[[str], "str | Awaitable[str]"]


class GatedReply:
    """A ``reply`` for :func:`chat_completions_app` that holds every prompt containing
    ``held_marker`` until :attr:`opened` is set (at most ``wait_s``) and answers the others at
    once, each with ``score``: a judge whose latency the test decides, e.g. to let a retrieve
    miss its answer deadline for chosen memories. :attr:`arrived` is released once per held
    prompt."""

    def __init__(self, held_marker: str = "held:", score: str = "0.9", wait_s: float = 60.0):
        self.held_marker = held_marker
        self.score = score
        self.wait_s = wait_s
        self.opened = threading.Event()
        self.arrived = threading.Semaphore(0)

    async def __call__(self, prompt: str) -> str:
        if self.held_marker in prompt:
            self.arrived.release()
            # In a worker thread: the stand-in's own event loop keeps answering other prompts.
            await asyncio.to_thread(self.opened.wait, self.wait_s)
        return self.score


def chat_completions_app(
    reply: ReplyFn, model: str = "loopback-judge", logprobs: bool = False
) -> FastAPI:
    """An OpenAI-compatible ``POST /v1/chat/completions`` whose answers come from ``reply``.

    ``reply`` receives the contents of all request messages (system, then user, …) joined by
    ``"\\n\\n"`` as one prompt string and returns the assistant text. It may be a coroutine
    function (``await asyncio.sleep(...)`` simulates latency without blocking other requests;
    a *synchronous* reply runs on the server's event loop and should be quick) and may raise
    :class:`~service.testing.HTTPFault` to answer with an HTTP error.

    ``app.state`` exposes ``calls`` (every POST, including faulted ones), ``in_flight``,
    ``max_in_flight`` and ``last_request`` (headers and JSON body of the latest POST).
    ``GET /v1/models`` lists ``model``.

    ``logprobs=True`` makes it a model that reports log-probabilities: a request asking for
    ``logprobs`` gets the one-token answer "yes" or "no" with ``top_logprobs`` giving "yes"
    the probability ``float(reply(prompt))`` (a reply that is not a probability is answered as
    is). Without it, ``logprobs`` in a request is ignored, as some servers do.
    """
    app = openai_app("loopback chat completions", model)
    ids = itertools.count(1)

    async def answer(body: Any) -> dict[str, Any]:
        return await chat_answer(body, reply, next(ids), model, logprobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await answer_post(app, request, answer)

    return app


async def chat_answer(
    body: Any, reply: ReplyFn, number: int, model: str = "loopback-judge", logprobs: bool = False
) -> dict[str, Any]:
    """The completion answering one request ``body`` (its ``number`` names it), as
    :func:`chat_completions_app` answers: ``reply`` gets the messages' contents joined by
    blank lines. :class:`BadRequest` for a body without messages."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    prompt = "\n\n".join(
        _message_text(m.get("content")) for m in messages if isinstance(m, dict)
    )
    text = str(await maybe_await(reply(prompt)))
    completion = _chat_completion(number, body.get("model") or model, prompt, text)
    if logprobs and body.get("logprobs") is True:
        _answer_yes_no(completion, text)
    return completion


def _message_text(content: Any) -> str:
    """Content of one chat message: a string, or OpenAI's list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


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
