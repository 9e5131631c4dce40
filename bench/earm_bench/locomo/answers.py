"""Answer accuracy of ``earm bench locomo`` (``--reader-url``): the measure the LoCoMo and Mem0
evaluations report, beside evidence recall.

For each replayed question, policy and cut-off k, a reader LLM gets the policy's top k memories
in chronological order and the question, and answers in a short phrase; a grader LLM compares
that answer with the gold one and labels it CORRECT or WRONG. Both are OpenAI-compatible
chat-completions endpoints (``POST {url}/chat/completions``); the grader defaults to the reader.
The prompts follow the Mem0 evaluation of LoCoMo in structure (memories with their times, a
short answer, a generous CORRECT/WRONG grading returned as JSON), written out below and in
docs/benchmarks.md.

An identical prompt is asked once (two policies with the same top k share the reader's answer,
an identical answer the grader's label). A call is retried on 429 and 5xx with the service's
own retry policy (:mod:`service.providers.retry`); an answer still missing after the retries
is counted as ``failed`` and left out of the accuracy, a 4xx other than 429 (a wrong key or
model) stops the run with the endpoint's message.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from earm_bench.locomo.data import Conversation, Question, Turn, scoped_id
from earm_bench.locomo.metrics import QueryRecord
from service.providers.retry import backoff_delay, retry_after_seconds, retryable_status

#: What the reader gets: the memories (oldest first, each with its time) and the question.
ANSWER_PROMPT = """\
You answer a question about a long conversation between {speaker_a} and {speaker_b}. \
What you know of it are the memories below: turns of the conversation, each with the time it \
was said, oldest first.

# Memories
{memories}

# How to answer
- Answer from the memories alone. Where two disagree, the more recent one holds.
- A relative time in a memory ("last year", "two weeks ago") is relative to that memory's \
time: answer with the date or period it refers to, not with the phrase.
- Answer in a short phrase of at most six words: the name, date, place or thing asked for.

Question: {question}
Answer:"""

#: What the grader gets: the question, the gold answer and the reader's.
GRADING_PROMPT = """\
Label an answer to a question CORRECT or WRONG. You get a question one person asked about \
another from their earlier conversations, its gold answer, and a generated answer.

The gold answer is short and names what the question asks for. Be generous: the generated \
answer is CORRECT when it refers to the same thing as the gold answer, however long or however \
worded; for a time, when it refers to the same date or period, in any format ("7 May 2023" \
and "May 7th" alike). It is WRONG when it names something else, or says it does not know.

Question: {question}
Gold answer: {gold}
Generated answer: {answer}

Reply with JSON only: {{"label": "CORRECT"}} or {{"label": "WRONG"}}."""

_LABEL = re.compile(r"\b(CORRECT|WRONG)\b")
ATTEMPTS = 4


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible chat-completions endpoint: its base URL (``…/v1``), model, key."""

    url: str
    model: str
    api_key: str | None = None

    def describe(self) -> dict[str, str]:
        """The endpoint as RESULTS.json names it (never the key)."""
        return {"url": self.url, "model": self.model}


class EndpointRefused(RuntimeError):
    """An endpoint answered a request with a 4xx other than 429: a wrong URL, key or model."""


@dataclass
class TokenCount:
    """Tokens an endpoint's ``usage`` reported, and the calls made."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, usage: Mapping[str, Any] | None) -> None:
        self.calls += 1
        usage = usage or {}
        self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens") or 0)


@dataclass
class ChatClient:
    """Asks one endpoint, at most ``concurrency`` requests at a time, each identical prompt once."""

    endpoint: Endpoint
    http: httpx.AsyncClient
    limit: asyncio.Semaphore
    tokens: TokenCount = field(default_factory=TokenCount)
    _asked: dict[str, asyncio.Task[str | None]] = field(default_factory=dict)

    def ask(self, prompt: str) -> Awaitable[str | None]:
        """The assistant's text for ``prompt`` (None when every attempt failed)."""
        if prompt not in self._asked:
            self._asked[prompt] = asyncio.ensure_future(self._ask(prompt))
        return self._asked[prompt]

    async def _ask(self, prompt: str) -> str | None:
        body = {"model": self.endpoint.model, "temperature": 0,
                "messages": [{"role": "user", "content": prompt}]}
        headers = ({"Authorization": f"Bearer {self.endpoint.api_key}"}
                   if self.endpoint.api_key else {})
        url = self.endpoint.url.rstrip("/") + "/chat/completions"
        for attempt in range(ATTEMPTS):
            wait: float | None = None
            async with self.limit:
                try:
                    response = await self.http.post(url, json=body, headers=headers)
                except httpx.HTTPError:
                    response = None
            if response is not None and response.status_code == 200:
                return self._text(response.json())
            if response is not None and not retryable_status(response.status_code):
                raise EndpointRefused(f"{url} answered {response.status_code}: "
                                      f"{response.text[:300]}")
            if response is not None:
                wait = retry_after_seconds(response.headers)
            if attempt + 1 < ATTEMPTS:
                await asyncio.sleep(min(wait if wait is not None else backoff_delay(attempt, 1.0),
                                        30.0))
        return None

    def _text(self, completion: Mapping[str, Any]) -> str:
        self.tokens.add(completion.get("usage"))
        choices = completion.get("choices") or [{}]
        return str((choices[0].get("message") or {}).get("content") or "").strip()


def answer_prompt(question: Question, conversation: Conversation, memories: Sequence[Turn]) -> str:
    """The reader's prompt: ``memories`` oldest first, each with the time it was said."""
    lines = [f"- {turn.occurred_at.day} {turn.occurred_at:%B %Y, %H:%M}: {turn.memory_text}"
             for turn in sorted(memories, key=lambda t: (t.occurred_at, t.session, t.position))]
    return ANSWER_PROMPT.format(speaker_a=conversation.speaker_a,
                                speaker_b=conversation.speaker_b,
                                memories="\n".join(lines), question=question.question)


def grading_prompt(question: Question, answer: str) -> str:
    return GRADING_PROMPT.format(question=question.question, gold=question.answer, answer=answer)


def graded_correct(reply: str) -> bool | None:
    """The grader's label: True for CORRECT, False for WRONG, None when it gave neither."""
    try:
        label = json.loads(reply.strip().removeprefix("```json").strip("`\n ")).get("label")
    except (ValueError, AttributeError):
        found = _LABEL.findall(reply.upper())
        label = found[-1] if found else None
    if isinstance(label, str) and label.upper() in ("CORRECT", "WRONG"):
        return label.upper() == "CORRECT"
    return None


@dataclass
class _Tally:
    """The grades of one policy at one cut-off: overall and per category."""

    correct: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    graded: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    failed: int = 0
    unparsed: int = 0

    def add(self, category: int, correct: bool | None, failed: bool) -> None:
        if failed:
            self.failed += 1
            return
        if correct is None:
            self.unparsed += 1
        self.graded[category] += 1
        self.correct[category] += bool(correct)

    def summary(self) -> dict[str, Any]:
        graded = sum(self.graded.values())
        return {
            "accuracy": sum(self.correct.values()) / graded if graded else None,
            "graded": graded,
            "failed": self.failed,
            "unparsed": self.unparsed,
            "by_category": {
                str(c): {"accuracy": self.correct[c] / n, "n": n}
                for c, n in sorted(self.graded.items())
            },
        }


@dataclass(frozen=True)
class Readers:
    """The reader and the grader of ``--reader-url``, and how many requests each has open."""

    reader: Endpoint
    grader: Endpoint
    concurrency: int = 8
    timeout_s: float = 120.0


async def answer_accuracy(
    readers: Readers,
    records: Mapping[str, Sequence[QueryRecord]],
    conversations: Sequence[Conversation],
    ks: Sequence[int],
) -> dict[str, Any]:
    """Accuracy of each policy's answers at each cut-off, overall and per category, with the
    reader's and grader's calls and tokens (``records``: each policy's plain stream)."""
    lookup = _Lookup(conversations)
    async with httpx.AsyncClient(timeout=readers.timeout_s) as http:
        reader_limit = asyncio.Semaphore(readers.concurrency)
        grader_limit = (reader_limit if readers.grader.url == readers.reader.url
                        else asyncio.Semaphore(readers.concurrency))
        reader = ChatClient(readers.reader, http, reader_limit)
        grader = ChatClient(readers.grader, http, grader_limit)

        async def grade(record: QueryRecord, k: int) -> tuple[bool | None, bool]:
            question, conversation = lookup.question(record)
            answer = await reader.ask(
                answer_prompt(question, conversation, lookup.turns(record, k)))
            if answer is None:
                return None, True
            label = await grader.ask(grading_prompt(question, answer))
            return (None, True) if label is None else (graded_correct(label), False)

        jobs = [(policy, k, record) for policy, recs in records.items() for k in ks
                for record in recs if lookup.answerable(record)]
        grades = await _gather(grade(record, k) for _, k, record in jobs)
    tallies: dict[str, dict[int, _Tally]] = defaultdict(lambda: defaultdict(_Tally))
    for (policy, k, record), (correct, failed) in zip(jobs, grades, strict=True):
        tallies[policy][k].add(record.category, correct, failed)
    return {
        "reader": readers.reader.describe(),
        "grader": readers.grader.describe(),
        "policies": {policy: {f"accuracy@{k}": tallies[policy][k].summary() for k in ks}
                     for policy in records},
        "reader_usage": vars(reader.tokens),
        "grader_usage": vars(grader.tokens),
    }


async def _gather(
    grades: Iterable[Awaitable[tuple[bool | None, bool]]],
) -> list[tuple[bool | None, bool]]:
    """Every grade, the run stopped by the first refusal (the rest cancelled)."""
    tasks = [asyncio.ensure_future(g) for g in grades]
    try:
        return list(await asyncio.gather(*tasks))
    except EndpointRefused:
        for task in tasks:
            task.cancel()
        raise


class _Lookup:
    """Questions and turns by the ids the replay records carry (a turn's id is scoped by its
    conversation on the shift stream)."""

    def __init__(self, conversations: Sequence[Conversation]) -> None:
        self._questions: dict[tuple[str, int], tuple[Question, Conversation]] = {
            (c.sample_id, q.qa_index): (q, c) for c in conversations for q in c.questions
        }
        self._turns: dict[tuple[str, str], Turn] = {}
        for conversation in conversations:
            for turn in conversation.turns:
                self._turns[(conversation.sample_id, turn.dia_id)] = turn
                # "" for a scoped id: it names its conversation whichever question ranked it
                self._turns[("", scoped_id(conversation.sample_id, turn.dia_id))] = turn

    def answerable(self, record: QueryRecord) -> bool:
        """Whether the record's question has a gold answer (category 5 has none)."""
        found = self._questions.get((record.sample_id, record.qa_index))
        return found is not None and bool(found[0].answer)

    def question(self, record: QueryRecord) -> tuple[Question, Conversation]:
        return self._questions[(record.sample_id, record.qa_index)]

    def turns(self, record: QueryRecord, k: int) -> list[Turn]:
        """The turns of the record's top ``k``."""
        found = (self._turns.get(("", i)) or self._turns.get((record.sample_id, i))
                 for i in record.ranked[:k])
        return [turn for turn in found if turn is not None]

