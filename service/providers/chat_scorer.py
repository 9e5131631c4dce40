"""The LLM judge: one chat completion per (query, memory) pair, over any OpenAI-compatible
``/chat/completions`` endpoint, as a :class:`~service.providers.scorers.RelevanceScorer`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import numpy as np

from service.providers.retry import backoff_delay, retry_after_seconds, retryable_status
from service.providers.scorers import Outcome, ScorerObserver, notify

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


class _PairFailed(Exception):
    """One pair's call failed for good; carries the outcome to count."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class OpenAIChatScorer:
    """Pointwise LLM judge over an OpenAI-compatible ``POST {base_url}/chat/completions``.

    All pairs of one :meth:`score` call are issued concurrently, bounded by ``concurrency``
    connections per scorer instance, so concurrent /retrieve requests share the provider's limit
    instead of multiplying it. One :meth:`score` call has
    ``timeout_s`` in total (waiting for a slot, attempts and backoff of all its pairs): a hung
    or slow endpoint costs a request at most about ``timeout_s``, then the pipeline proceeds
    ``degraded`` with the pairs that finished. Size it for the budget: with latency L per call,
    ``timeout_s`` should exceed L · ceil(budget / concurrency). 429, 5xx and transport errors are retried (``max_retries``), with jittered
    exponential backoff or the server's ``Retry-After`` when it fits in the remaining time.

    Temperature 0 and a small ``max_tokens`` keep judgments repeatable and cheap. Outcomes of
    every pair are tallied in :attr:`outcomes` (for Prometheus).
    """

    name = "openai"
    reads_embeddings = False  # the judge reads texts only

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
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.backoff_base_s = backoff_base_s
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.observer = observer
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One single-connection client per concurrency slot, handed out through a queue (which
        # is also the concurrency bound), rather than one client pooling `concurrency`
        # connections: httpcore's pool walks all its connections, querying each one's socket,
        # whenever a request starts or ends. Measured: 16 concurrent calls cost the client 29 ms
        # of CPU through one pool of 16, 17 ms through 16 single-connection clients.
        # They share one TLS context: loading the CA bundle costs ~25 ms per context.
        self._tls = httpx.create_ssl_context()
        self._clients: asyncio.LifoQueue[httpx.AsyncClient] = asyncio.LifoQueue()
        for _ in range(concurrency):
            self._clients.put_nowait(self._new_client())
        # Closing of clients taken out of service (see _slot); awaited by aclose().
        self._closing: set[asyncio.Task[None]] = set()

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            verify=self._tls,
            timeout=self.timeout_s,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    @property
    def calls_ok(self) -> int:
        return self.outcomes["ok"]

    @property
    def calls_failed(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if outcome != "ok")

    def build_messages(self, query_text: str, memory_text: str) -> list[dict[str, str]]:
        """The judge prompt for one pair; query and memory go in verbatim."""
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT.format(query=query_text, memory=memory_text)},
        ]

    async def score(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
    ) -> list[float | None]:
        if not memory_texts:
            return []
        started = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        results = await asyncio.gather(
            *(self._score_pair(query_text, m, deadline) for m in memory_texts)
        )
        failed = [outcome for _, outcome in results if outcome != "ok"]
        if failed:
            logger.warning(
                "relevance scorer: %d of %d calls failed in %.2f s (%s)",
                len(failed), len(results), time.perf_counter() - started,
                ", ".join(f"{k}={v}" for k, v in sorted(collections.Counter(failed).items())),
            )
        return [value for value, _ in results]

    async def _score_pair(
        self, query_text: str, memory_text: str, deadline: float
    ) -> tuple[float | None, Outcome]:
        body = {
            "model": self.model,
            "messages": self.build_messages(query_text, memory_text),
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        outcome: Outcome
        value: float | None = None
        started = time.perf_counter()
        try:
            # The deadline covers the wait for a slot too: one request's scoring never
            # outlives timeout_s, however many pairs queue behind a hung endpoint.
            async with asyncio.timeout_at(deadline), self._slot() as client:
                started = time.perf_counter()
                value = await self._call_with_retries(client, body, deadline)
            outcome = "ok"
        except TimeoutError:
            outcome = "timeout"
        except _PairFailed as failure:
            outcome = failure.outcome
        except Exception:  # the contract is None, never an exception, for any pair
            logger.exception("relevance scorer: unexpected error scoring a pair")
            outcome = "error"
        duration_s = time.perf_counter() - started
        self.outcomes[outcome] += 1
        notify(self.observer, self.name, outcome, duration_s)
        return value, outcome

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[httpx.AsyncClient]:
        """A concurrency slot's client for one pair's call; the slot always goes back.

        Its client goes back with it only if the call ended on its own: a score, or
        :class:`_PairFailed` after a whole response or an error httpcore cleaned up after.
        A call interrupted by asyncio cancellation (the request's deadline, or the request
        cancelled) or by an unexpected error hands the slot a fresh client and closes the old
        one. httpcore 1.0 shields its cleanup from anyio cancellation only, so a cancellation
        landing between connecting and sending leaves the single connection NEW, and one
        landing while the response is closed leaves it ACTIVE; the pool never reuses nor reaps
        either (encode/httpcore#1093), and every later call on the slot would wait for the
        pool until its deadline without reaching the endpoint.
        """
        client = await self._clients.get()
        interrupted = True
        try:
            yield client
            interrupted = False
        except _PairFailed:
            interrupted = False
            raise
        finally:
            self._clients.put_nowait(self._new_client() if interrupted else client)
            if interrupted:
                self._retire(client)

    def _retire(self, client: httpx.AsyncClient) -> None:
        """Close ``client`` in the background: the pair's answer does not wait for it, and a
        second cancellation of the pair cannot interrupt it."""
        closing = asyncio.get_running_loop().create_task(client.aclose())
        self._closing.add(closing)
        closing.add_done_callback(self._closed)

    def _closed(self, closing: asyncio.Task[None]) -> None:
        self._closing.discard(closing)
        if not closing.cancelled() and closing.exception() is not None:
            logger.debug("relevance scorer: closing a retired client failed: %r", closing.exception())

    async def _call_with_retries(
        self, client: httpx.AsyncClient, body: dict[str, Any], deadline: float
    ) -> float:
        """The parsed score, or :class:`_PairFailed`; runs inside the request's time budget."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            wait: float | None = None
            outcome: Outcome
            try:
                response = await client.post(
                    self.url, json=body, headers=self._headers, timeout=self.timeout_s
                )
            except httpx.TimeoutException:
                outcome = "timeout"
            except httpx.HTTPError:  # connect/read/protocol errors, undecodable bodies
                outcome = "transport_error"
            else:
                if response.status_code == 200:
                    return self._parse(response)
                outcome = "http_error"
                if not retryable_status(response.status_code):
                    logger.debug("scorer endpoint answered HTTP %d", response.status_code)
                    raise _PairFailed(outcome)
                wait = retry_after_seconds(response.headers)
            if attempt >= self.max_retries:
                raise _PairFailed(outcome)
            delay = wait if wait is not None else backoff_delay(attempt, self.backoff_base_s)
            if delay >= deadline - loop.time():
                raise _PairFailed(outcome)  # would outlive the budget: give the slot back now
            await asyncio.sleep(delay)
            attempt += 1

    @staticmethod
    def _parse(response: httpx.Response) -> float:
        try:
            payload: Any = response.json()
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _PairFailed("unparseable") from None
        if not isinstance(content, str):
            raise _PairFailed("unparseable")
        value = parse_score(content)
        if value is None:
            raise _PairFailed("unparseable")
        return value

    async def aclose(self) -> None:
        """Close the HTTP clients (the scorer is not used afterwards)."""
        while not self._clients.empty():
            await self._clients.get_nowait().aclose()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def __repr__(self) -> str:  # no api key, ever
        return f"OpenAIChatScorer(url={self.url!r}, model={self.model!r}, concurrency={self.concurrency})"
