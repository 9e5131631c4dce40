"""The LLM judge: one chat completion per (query, memory) pair, over any OpenAI-compatible
``/chat/completions`` endpoint, as a :class:`~service.providers.scorers.RelevanceScorer`."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import httpx

from service.providers.http_scorer import HTTPScorer, RequestFailed, ScoringRequest
from service.providers.scorers import ScorerObserver

logger = logging.getLogger(__name__)

__all__ = ["SYSTEM_PROMPT", "USER_PROMPT", "OpenAIChatScorer", "parse_score"]

SYSTEM_PROMPT = (
    "You are a relevance judge for a long-term memory store of an AI agent. "
    "Given a query and one stored memory, rate how relevant the memory is for answering or "
    "responding to the query: 0 means unrelated or useless, 1 means it directly provides the "
    "needed information. Answer with a single number between 0 and 1 (for example 0.7) "
    "and nothing else."
)
#: Query and memory are inserted verbatim; the labelled blocks keep them apart.
USER_PROMPT = "Query:\n{query}\n\nMemory:\n{memory}\n\nRelevance (0 to 1):"

# The first number of a reply: an optional minus sign (so "-0.2" is out of range rather than
# 0.2), digits with an optional "." fraction, or a bare fraction like ".9". A comma is accepted as
# the decimal separator only after a lone 0 or 1 ("0,7"), where it cannot be a thousands
# separator of an in-range number. Digits glued to letters ("gpt4", "Q3") and pieces of longer
# tokens ("1.5e-1", "0.8.1") are not numbers.
_NUMBER = re.compile(r"(?<![\w.,-])-?(?:[01],\d+|\d+(?:\.\d+)?|\.\d+)(?!\.?\w)")


def parse_score(reply: str) -> float | None:
    """The relevance in a judge's reply: its FIRST number if in [0, 1], else ``None``.

    Accepted: "0.8", "Score: 0.35", "1", "1.0", "The relevance is .9 out of 1", "0,7".
    Rejected (``None``): no number ("I cannot"), a first number outside [0, 1] ("7", "80%",
    "8/10", "-0.2"). Taking the first number is a deliberate simplification: the prompt asks for
    a bare number, and a reply like "On a scale of 0 to 1: 0.8" would parse as 0.
    """
    match = _NUMBER.search(reply)
    if match is None:
        return None
    try:
        value = float(match.group(0).replace(",", "."))
    except ValueError:  # pragma: no cover - the regex only matches numbers
        return None
    if not 0.0 <= value <= 1.0:
        return None
    return value


class OpenAIChatScorer(HTTPScorer):
    """Pointwise LLM judge over an OpenAI-compatible ``POST {base_url}/chat/completions``: one
    request per pair, under :class:`~service.providers.http_scorer.HTTPScorer`'s slots, deadline
    and retries. Size ``timeout_s`` for the budget: with latency L per call, it should exceed
    L · ceil(budget / concurrency).

    Temperature 0 and a small ``max_tokens`` keep judgments repeatable and cheap.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        *,
        max_tokens: int = 16,
        backoff_base_s: float = 0.25,
        observer: ScorerObserver | None = None,
    ) -> None:
        super().__init__(
            base_url.rstrip("/") + "/chat/completions",
            api_key,
            concurrency,
            timeout_s,
            max_retries,
            backoff_base_s=backoff_base_s,
            observer=observer,
        )
        self.model = model
        self.max_tokens = max_tokens

    def build_messages(self, query_text: str, memory_text: str) -> list[dict[str, str]]:
        """The judge prompt for one pair; query and memory go in verbatim."""
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT.format(query=query_text, memory=memory_text)},
        ]

    def plan(self, query_text: str, memory_texts: Sequence[str]) -> list[ScoringRequest]:
        return [
            ScoringRequest(
                [position],
                {
                    "model": self.model,
                    "messages": self.build_messages(query_text, memory_text),
                    "temperature": 0,
                    "max_tokens": self.max_tokens,
                },
            )
            for position, memory_text in enumerate(memory_texts)
        ]

    def parse(self, response: httpx.Response, request: ScoringRequest) -> list[float | None]:
        try:
            payload: Any = response.json()
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RequestFailed("unparseable") from None
        if not isinstance(content, str):
            raise RequestFailed("unparseable")
        value = parse_score(content)
        if value is None:
            raise RequestFailed("unparseable")
        return [value]

    def __repr__(self) -> str:  # no api key, ever
        return f"OpenAIChatScorer(url={self.url!r}, model={self.model!r}, concurrency={self.concurrency})"
