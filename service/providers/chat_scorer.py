"""The LLM judge over any OpenAI-compatible ``/chat/completions`` endpoint, as a
:class:`~service.providers.scorers.RelevanceScorer`.

Three ways to ask (settings in parentheses):

* ``number`` (default): one completion per pair, the reply's number is the score;
* ``logprobs`` (``EARM_SCORER_CHAT_MODE=logprobs``): one completion per pair asking for a
  one-token yes/no with ``logprobs``; the score is P(yes) / (P(yes) + P(no)) over the top
  tokens, or the reply itself parsed (yes 1, no 0, or a number) when the endpoint gives no
  log-probabilities;
* batched (``EARM_SCORER_CHAT_BATCH=k``): k memories in one prompt, one ``[i] score`` line
  each; a malformed answer falls back to single-pair calls for that batch (counted in
  :attr:`OpenAIChatScorer.batch_fallbacks`).

The per-pair prompt is a template with ``{query}`` and ``{memory}`` placeholders
(``EARM_SCORER_PROMPT_FILE``; :data:`USER_PROMPT` by default), filled in verbatim.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from service.providers.breaker import Breaker
from service.providers.http_client import MAX_ANSWER_BYTES, Answer, PoolLimits
from service.providers.http_scorer import HTTPScorer, RequestFailed, ScoringRequest
from service.providers.scorers import ScorerObserver

logger = logging.getLogger(__name__)

__all__ = [
    "BATCH_SYSTEM_PROMPT",
    "LOGPROBS_SYSTEM_PROMPT",
    "SYSTEM_PROMPT",
    "USER_PROMPT",
    "ChatMode",
    "OpenAIChatScorer",
    "check_template",
    "parse_batch",
    "parse_score",
]

ChatMode = Literal["number", "logprobs"]

SYSTEM_PROMPT = (
    "You are a relevance judge for a long-term memory store of an AI agent. "
    "Given a query and one stored memory, rate how relevant the memory is for answering or "
    "responding to the query: 0 means unrelated or useless, 1 means it directly provides the "
    "needed information. Answer with a single number between 0 and 1 (for example 0.7) "
    "and nothing else."
)
#: Query and memory are inserted verbatim; the labelled blocks keep them apart.
USER_PROMPT = "Query:\n{query}\n\nMemory:\n{memory}\n\nRelevance (0 to 1):"
LOGPROBS_SYSTEM_PROMPT = (
    "You are a relevance judge for a long-term memory store of an AI agent. "
    "Given a query and one stored memory, decide whether the memory is relevant for answering "
    "or responding to the query. Answer with exactly one word, yes or no."
)
BATCH_SYSTEM_PROMPT = (
    "You are a relevance judge for a long-term memory store of an AI agent. "
    "Given a query and several numbered stored memories, rate how relevant each memory is for "
    "answering or responding to the query: 0 means unrelated or useless, 1 means it directly "
    "provides the needed information. Answer with one line per memory, in order, of the form "
    "[number] score (for example [1] 0.7), and nothing else."
)
_PLACEHOLDER = re.compile(r"\{(query|memory)\}")
# One line of a batched answer: "[3] 0.7", "3: 0.7", "3. 0.7" or "3) 0.7".
_BATCH_LINE = re.compile(r"^\s*\[?(\d+)\]?\s*[:.)]?\s+(\S+)\s*$")


def check_template(template: str) -> str:
    """``template`` if it has both ``{query}`` and ``{memory}``, else ``ValueError``."""
    missing = [p for p in ("{query}", "{memory}") if p not in template]
    if missing:
        raise ValueError(f"the scorer prompt template lacks {' and '.join(missing)}")
    return template


def fill(template: str, query_text: str, memory_text: str) -> str:
    """The template with its placeholders replaced in one pass, so a query that itself contains
    "{memory}" stays verbatim, and other braces in the template need no escaping."""
    values = {"query": query_text, "memory": memory_text}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)

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


def parse_batch(reply: str, size: int) -> list[float] | None:
    """One score per memory of a batched answer, or ``None`` unless every memory 1..size has
    exactly one line with a valid score (see :func:`parse_score`) and nothing else is said."""
    scores: dict[int, float] = {}
    for line in reply.strip().splitlines():
        if not line.strip():
            continue
        match = _BATCH_LINE.match(line)
        if match is None:
            return None
        number, value = int(match.group(1)), parse_score(match.group(2))
        if value is None or number in scores or not 1 <= number <= size:
            return None
        scores[number] = value
    if len(scores) != size:
        return None
    return [scores[number] for number in range(1, size + 1)]


def _yes_probability(choice: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) over the first token's top log-probabilities, ``None`` when the
    choice carries none (or neither answer is among them)."""
    try:
        top = choice["logprobs"]["content"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(top, list):
        return None
    mass = {"yes": 0.0, "no": 0.0}
    for entry in top:
        token = entry.get("token") if isinstance(entry, dict) else None
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        word = token.strip().lower() if isinstance(token, str) else ""
        if word in mass and isinstance(logprob, int | float) and math.isfinite(logprob):
            mass[word] += math.exp(min(0.0, float(logprob)))
    total = mass["yes"] + mass["no"]
    return mass["yes"] / total if total > 0 else None


def _parse_yes_no(content: str) -> float | None:
    """A reply without log-probabilities: yes 1, no 0, or the number it gives."""
    word = content.strip().strip(".!").lower()
    if word in ("yes", "no"):
        return 1.0 if word == "yes" else 0.0
    return parse_score(content)


class OpenAIChatScorer(HTTPScorer):
    """Pointwise LLM judge over an OpenAI-compatible ``POST {base_url}/chat/completions``: one
    request per pair, under :class:`~service.providers.http_scorer.HTTPScorer`'s slots, deadline
    and retries. Size ``timeout_s`` for the budget: with latency L per call, it should exceed
    L · ceil(budget / concurrency).

    Temperature 0 and a small ``max_tokens`` keep judgments repeatable and cheap. ``mode``,
    ``prompt_template`` and ``batch`` as in the module docstring.
    """

    name = "openai"
    operation = "chat"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 256,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        *,
        max_tokens: int = 16,
        mode: ChatMode = "number",
        prompt_template: str = USER_PROMPT,
        batch: int = 1,
        backoff_base_s: float = 0.25,
        observer: ScorerObserver | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        pool: PoolLimits | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        super().__init__(
            base_url.rstrip("/") + "/chat/completions",
            api_key,
            concurrency,
            timeout_s,
            max_retries,
            backoff_base_s=backoff_base_s,
            observer=observer,
            max_answer_bytes=max_answer_bytes,
            pool=pool,
            breaker=breaker,
        )
        self.model = model
        self.max_tokens = max_tokens
        self.mode: ChatMode = mode
        self.prompt_template = check_template(prompt_template)
        self.batch = batch
        #: Batches whose answer was malformed and were scored pair by pair instead.
        self.batch_fallbacks = 0

    def build_messages(self, query_text: str, memory_text: str) -> list[dict[str, str]]:
        """The judge prompt for one pair; query and memory go in verbatim."""
        system = LOGPROBS_SYSTEM_PROMPT if self.mode == "logprobs" else SYSTEM_PROMPT
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": fill(self.prompt_template, query_text, memory_text)},
        ]

    def build_batch_messages(
        self, query_text: str, memory_texts: Sequence[str]
    ) -> list[dict[str, str]]:
        """The judge prompt for several memories, numbered from 1; texts go in verbatim."""
        memories = "\n\n".join(f"[{i}]\n{text}" for i, text in enumerate(memory_texts, start=1))
        user = f"Query:\n{query_text}\n\nMemories:\n{memories}\n\nRelevance of each (0 to 1):"
        return [
            {"role": "system", "content": BATCH_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]

    def plan(self, query_text: str, memory_texts: Sequence[str]) -> list[ScoringRequest]:
        if self.batch == 1:
            return [self._pair_request(query_text, p, m) for p, m in enumerate(memory_texts)]
        requests: list[ScoringRequest] = []
        for start in range(0, len(memory_texts), self.batch):
            texts = list(memory_texts[start : start + self.batch])
            body = {
                "model": self.model,
                "messages": self.build_batch_messages(query_text, texts),
                "temperature": 0,
                # One short line per memory.
                "max_tokens": self.max_tokens * len(texts),
            }
            positions = list(range(start, start + len(texts)))
            fallback = [self._pair_request(query_text, p, memory_texts[p]) for p in positions]
            requests.append(ScoringRequest(positions, body, fallback))
        return requests

    def _pair_request(self, query_text: str, position: int, memory_text: str) -> ScoringRequest:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.build_messages(query_text, memory_text),
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        if self.mode == "logprobs":
            body |= {"max_tokens": 1, "logprobs": True, "top_logprobs": 5}
        return ScoringRequest([position], body)

    def parse(self, response: Answer, request: ScoringRequest) -> list[float | None]:
        try:
            payload: Any = response.json()
            choice = payload["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RequestFailed("unparseable") from None
        if not isinstance(content, str):
            raise RequestFailed("unparseable")
        if len(request.positions) > 1:
            scores = parse_batch(content, len(request.positions))
            if scores is None:
                self.batch_fallbacks += 1
                raise RequestFailed("unparseable")
            return list[float | None](scores)
        value = self._pair_score(choice, content)
        if value is None:
            raise RequestFailed("unparseable")
        return [value]

    def _pair_score(self, choice: Any, content: str) -> float | None:
        if self.mode != "logprobs":
            return parse_score(content)
        probability = _yes_probability(choice)
        return probability if probability is not None else _parse_yes_no(content)

    def __repr__(self) -> str:  # no api key, ever
        return (
            f"OpenAIChatScorer(url={self.url!r}, model={self.model!r}, mode={self.mode!r}, "
            f"batch={self.batch}, concurrency={self.concurrency})"
        )
