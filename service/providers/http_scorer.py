"""The machinery every HTTP relevance scorer shares: concurrency slots over one pooled client
(``service.providers.http_client``), one deadline per :meth:`HTTPScorer.score` call, retries of
429/5xx/transport errors, and one backoff for the whole backend once it answers 429.

A backend (the chat judge, the rerank endpoints) only says which HTTP requests score which pairs
(:meth:`HTTPScorer.plan`) and how to read one response (:meth:`HTTPScorer.parse`): one request
per pair for the pointwise chat judge, one per batch of documents for a reranker. A failed
request loses only its own pairs.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.metadata
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from service.providers.breaker import Breaker
from service.providers.concurrency_limit import Admission, AIMDLimit
from service.providers.http_client import (
    MAX_ANSWER_BYTES,
    Answer,
    AnswerTooLarge,
    CannotConnect,
    ConnectionFailed,
    PoolLimits,
    ScorerClient,
    encode_json,
)
from service.providers.retry import backoff_delay, retry_after_seconds, retryable_status
from service.providers.scorers import Outcome, PartScored, ScorerObserver, Scores, notify
from service.tracing import Attributes, Span, current

logger = logging.getLogger(__name__)

#: Who calls, as the backend's logs see it.
USER_AGENT = f"earm/{importlib.metadata.version('earm')}"

__all__ = ["FailureLog", "HTTPScorer", "RequestFailed", "ScoringRequest"]

#: The statuses of a backend shedding load: the scorer's window halves (service.providers.
#: concurrency_limit).
SHED_LOAD = frozenset({429, 503})

#: While a backend is down every retrieve fails its calls: at most one warning per this many
#: seconds per scorer (counting the retrieves it stands for) keeps an outage from flooding the log.
FAILURE_WARNING_INTERVAL_S = 10.0


@dataclass(frozen=True)
class ScoringRequest:
    """One HTTP request of a :meth:`HTTPScorer.score` call: its JSON body and the positions (in
    the call's memory list) of the pairs it scores, in the order the body lists them.
    ``fallback``: the requests that score the same pairs another way, sent instead if this
    one's answer is unparseable (a chat batch falls back to one request per pair)."""

    positions: list[int]
    body: dict[str, Any]
    fallback: list[ScoringRequest] = field(default_factory=list)


class RequestFailed(Exception):
    """One request failed for good; carries the outcome to count for each of its pairs."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class FailureLog:
    """The warning of :meth:`HTTPScorer.score` calls with failed pairs, at most one per
    ``interval_s``: the first failing call is logged at once, the ones after it within the
    interval are counted and named by the next warning."""

    def __init__(
        self,
        interval_s: float = FAILURE_WARNING_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last_warning: float | None = None
        self._unreported = 0  # failing calls since the last warning, not logged

    def failed(self, outcomes: Sequence[str], seconds: float) -> bool:
        """Note one call whose ``outcomes`` (one per pair) include failures; True if it was
        logged."""
        now = self.clock()
        if self._last_warning is not None and now - self._last_warning < self.interval_s:
            self._unreported += 1
            return False
        failed = collections.Counter(outcome for outcome in outcomes if outcome != "ok")
        logger.warning(
            "relevance scorer: %d of %d calls failed in %.2f s (%s)%s",
            sum(failed.values()),
            len(outcomes),
            seconds,
            ", ".join(f"{k}={v}" for k, v in sorted(failed.items())),
            f"; {self._unreported} more retrieves had failed calls in the "
            f"{now - self._last_warning:.0f} s before"
            if self._unreported and self._last_warning is not None
            else "",
        )
        self._last_warning, self._unreported = now, 0
        return True


class HTTPScorer:
    """Base of the HTTP scorers: ``POST url`` per :class:`ScoringRequest`, all requests of one
    :meth:`score` call issued at once, over a keep-alive pool bounded by ``pool``: a retrieve's
    anchors cost one round of the backend's latency when the pool's connections are as many as
    its requests. Requests in flight per scorer instance (so concurrent /retrieve requests share
    the provider's limit instead of multiplying it) are at most :attr:`limit`'s window, which
    starts at ``concurrency`` (or the pool's connections, if fewer), halves when the backend
    sheds load (429, 503, no answer), with the pool's ``queue_signal`` is cut to twice what a
    backend that queues works on (its latency rising with the requests at it), and grows back
    by one per window of answers. A backend that refused connects ``breaker.threshold`` times
    in a row is taken as down: its requests fail ``unavailable`` at once, but for a probe every
    ``breaker.delay_s``.

    One :meth:`score` call has ``timeout_s`` in total (waiting for a slot, attempts and backoff
    of all its requests): a hung or slow endpoint costs a retrieve at most about ``timeout_s``,
    then the pipeline proceeds ``degraded`` with the pairs that finished. 429, 5xx and transport
    errors are retried (``max_retries``), with jittered exponential backoff or the server's
    ``Retry-After`` when it fits in the remaining time. A 429 backs off the whole backend: no
    request of any call is sent before its wait is over (a rate limit is the provider's, not
    one request's), and a call whose deadline comes first fails its pairs at once. An answer
    whose body is over ``max_answer_bytes`` is cut off there and fails its pairs ``too_large``,
    without retry. Outcomes of every pair are tallied in :attr:`outcomes` and told to
    ``observer`` (for Prometheus).
    """

    name = "http"
    #: The GenAI operation of its requests, as their spans name it ("chat", "rerank").
    operation: str
    reads_embeddings = False  # HTTP scorers read texts only

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        concurrency: int = 256,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        *,
        backoff_base_s: float = 0.25,
        observer: ScorerObserver | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        pool: PoolLimits | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.url = url
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.observer = observer
        self._headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT} | (
            {"Authorization": f"Bearer {api_key}"} if api_key else {})
        endpoint = urlsplit(url)
        self._server: Attributes = {
            "server.address": endpoint.hostname or "",
            "server.port": endpoint.port or (443 if endpoint.scheme == "https" else 80),
        }
        pool = pool or PoolLimits()
        self._client = ScorerClient(url, pool, max_answer_bytes)
        self.limit = AIMDLimit(min(concurrency, pool.connections), queue_signal=pool.queue_signal)
        self.breaker = breaker or Breaker(threshold=5, delay_s=5.0)
        # Event-loop time before which no request is sent: the backend's last 429 asked for it.
        self._backoff_until = 0.0
        self.failure_log = FailureLog()

    # ----------------------------------------------------------------- what a backend defines

    def plan(self, query_text: str, memory_texts: Sequence[str]) -> list[ScoringRequest]:
        """The requests that score ``memory_texts`` against ``query_text``."""
        raise NotImplementedError

    def parse(self, response: Answer, request: ScoringRequest) -> list[float | None]:
        """One score in [0, 1] (or ``None``) per position of ``request``, from a 200 response;
        raises :class:`RequestFailed` ("unparseable") when the body makes no sense at all."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------- scoring

    @property
    def calls_ok(self) -> int:
        return self.outcomes["ok"]

    @property
    def calls_failed(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if outcome != "ok")

    async def score(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
    ) -> Scores:
        return await self.score_in_parts(
            query_text, query_embedding, memory_texts, memory_embeddings, None
        )

    async def score_in_parts(
        self,
        query_text: str,
        query_embedding: np.ndarray,
        memory_texts: Sequence[str],
        memory_embeddings: np.ndarray,
        scored: PartScored | None,
    ) -> Scores:
        """:meth:`score`, telling ``scored`` (if given) each request's pairs as it ends."""
        if not memory_texts:
            return Scores([], requests=0)
        started = time.perf_counter()
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        attempts = _Attempts()
        values: list[float | None] = [None] * len(memory_texts)
        outcomes: list[Outcome] = ["error"] * len(memory_texts)
        done = await asyncio.gather(
            *(
                self._run_and_tell(request, deadline, attempts, scored)
                for request in self.plan(query_text, memory_texts)
            )
        )
        for request_scores in done:
            for position, (value, outcome) in request_scores.items():
                values[position], outcomes[position] = value, outcome
        if any(outcome != "ok" for outcome in outcomes):
            self.failure_log.failed(outcomes, time.perf_counter() - started)
        return Scores(values, requests=attempts.count)

    async def _run_and_tell(
        self,
        request: ScoringRequest,
        deadline: float,
        attempts: _Attempts,
        scored: PartScored | None,
    ) -> dict[int, tuple[float | None, Outcome]]:
        part = await self._run(request, deadline, attempts)
        if scored is not None:
            scored({position: value for position, (value, _) in part.items()})
        return part

    async def _run(
        self, request: ScoringRequest, deadline: float, attempts: _Attempts
    ) -> dict[int, tuple[float | None, Outcome]]:
        """One request under the call's deadline: value and outcome by position of each of its
        pairs; never raises."""
        size = len(request.positions)
        values: list[float | None] = [None] * size
        failure: Outcome | None = None
        started = time.perf_counter()
        try:
            # The deadline covers the wait for a slot too: one retrieve's scoring never
            # outlives timeout_s, however many requests queue behind a hung endpoint.
            async with asyncio.timeout_at(deadline), self.limit.admitted() as admission:
                started = time.perf_counter()
                values = await self._call_with_retries(request, deadline, attempts, admission)
        except TimeoutError:
            failure = "timeout"
        except RequestFailed as failed:
            failure = failed.outcome
        except Exception:  # the contract is None, never an exception, for any pair
            logger.exception("relevance scorer: unexpected error scoring a request")
            failure = "error"
        duration_s = time.perf_counter() - started
        if failure == "unparseable" and request.fallback:
            fallen_back = await asyncio.gather(
                *(self._run(single, deadline, attempts) for single in request.fallback)
            )
            return {position: scored for part in fallen_back for position, scored in part.items()}
        outcomes: list[Outcome] = [
            failure if failure is not None else ("ok" if value is not None else "unparseable")
            for value in values
        ]
        for outcome, calls in collections.Counter(outcomes).items():
            self.outcomes[outcome] += calls
            notify(self.observer, self.name, outcome, duration_s, calls)
        return dict(zip(request.positions, zip(values, outcomes, strict=True), strict=True))

    async def _call_with_retries(
        self,
        request: ScoringRequest,
        deadline: float,
        attempts: _Attempts,
        admission: Admission,
    ) -> list[float | None]:
        """The parsed scores, or :class:`RequestFailed`; runs inside the call's time budget."""
        loop = asyncio.get_running_loop()
        body = encode_json(request.body)
        attempt = 0
        while True:
            if not self.breaker.allows():
                raise RequestFailed("unavailable")
            await self._wait_out_backoff(deadline)
            wait: float | None = None
            outcome: Outcome
            attempts.count += 1
            sent = await self._send(body, request, admission)
            if isinstance(sent, Answer):
                if sent.status == 200:
                    return self.parse(sent, request)
                outcome = "http_error"
                if not retryable_status(sent.status):
                    logger.debug("scorer endpoint answered HTTP %d", sent.status)
                    raise RequestFailed(outcome)
                wait = retry_after_seconds(sent.headers)
                if sent.status == 429:
                    wait = wait if wait is not None else backoff_delay(attempt, self.backoff_base_s)
                    self._backoff_until = max(self._backoff_until, loop.time() + wait)
            else:
                outcome = sent
            if attempt >= self.max_retries:
                raise RequestFailed(outcome)
            delay = wait if wait is not None else backoff_delay(attempt, self.backoff_base_s)
            if delay >= deadline - loop.time():
                raise RequestFailed(outcome)  # would outlive the budget: give the slot back now
            await asyncio.sleep(delay)
            attempt += 1

    async def _send(
        self, body: bytes, request: ScoringRequest, admission: Admission
    ) -> Answer | Outcome:
        """One attempt: the backend's answer, or the outcome of a request it did not answer.
        Tells the breaker whether the backend is up and :attr:`limit` whether it sheds load."""
        try:
            response = await self._post(body, request)
        except AnswerTooLarge as error:  # a faulty backend: asking again would not help
            self.breaker.answered()
            logger.debug("scorer endpoint: %s (EARM_SCORER_MAX_ANSWER_BYTES)", error)
            raise RequestFailed("too_large") from None
        except ConnectionFailed as error:  # refused, reset, closed early, not HTTP
            if isinstance(error, CannotConnect):
                self.breaker.refused()
            self.limit.overloaded(admission)
            return "transport_error"
        self.breaker.answered()
        if response.status == 200:
            self.limit.succeeded(response.backend_s, response.at_backend)
        elif response.status in SHED_LOAD:
            self.limit.overloaded(admission)
        return response

    async def _post(self, body: bytes, request: ScoringRequest) -> Answer:
        """One HTTP request, in a span of its own (``{operation} {model}``, as the GenAI
        conventions name a model call) whose trace context the backend receives."""
        tracing = current()
        if not tracing.enabled:  # the common case: nothing to build for a span
            return await self._client.post(body, self._headers)
        model = request.body.get("model")
        attributes: Attributes = {
            "gen_ai.operation.name": self.operation,
            **({"gen_ai.request.model": model} if isinstance(model, str) else {}),
            **self._server,
            "earm.pairs": len(request.positions),
        }
        name = f"{self.operation} {model}" if isinstance(model, str) else self.operation
        with tracing.span(name, attributes, kind="client") as span:
            headers = dict(self._headers)
            tracing.inject(headers)
            try:
                response = await self._client.post(body, headers)
            except ConnectionFailed as error:
                span.fail(type(error).__name__)
                raise
            if span.recording:
                _describe_answer(span, response)
            return response

    async def _wait_out_backoff(self, deadline: float) -> None:
        """Wait until the backend's 429 backoff is over; :class:`RequestFailed` at once if it
        outlasts the call's deadline (the pairs would fail anyway, and nothing is sent)."""
        loop = asyncio.get_running_loop()
        pause = self._backoff_until - loop.time()
        if pause <= 0:
            return
        if pause >= deadline - loop.time():
            raise RequestFailed("http_error")
        await asyncio.sleep(pause)

    async def aclose(self) -> None:
        """Close the connections (the scorer is not used afterwards)."""
        await self._client.aclose()


def _describe_answer(span: Span, response: Answer) -> None:
    """A scorer request's span: the answer's status, and the model and tokens it reports
    (OpenAI's ``usage``, or a reranker's: Jina and vLLM count ``total_tokens``, all input)."""
    span.set({"http.response.status_code": response.status})
    if response.status != 200:
        span.fail(str(response.status))
        return
    try:
        answer = response.json()
    except ValueError:
        return
    if not isinstance(answer, dict):
        return
    if isinstance(answer.get("model"), str):
        span.set({"gen_ai.response.model": answer["model"]})
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return
    tokens = {
        "gen_ai.usage.input_tokens": usage.get(
            "prompt_tokens", usage.get("input_tokens", usage.get("total_tokens"))
        ),
        "gen_ai.usage.output_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
    }
    span.set({key: value for key, value in tokens.items() if isinstance(value, int)})


class _Attempts:
    """HTTP requests sent by one :meth:`HTTPScorer.score` call, retries included."""

    def __init__(self) -> None:
        self.count = 0
