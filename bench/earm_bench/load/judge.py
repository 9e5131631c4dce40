"""The LLM judge of ``earm bench load``: the world's low-rank relevance, after a latency."""

from __future__ import annotations

import asyncio
import re

from earm_bench.load.world import World

_QUERY_RE = re.compile(r"bench query (\d+)")
_MEMORY_RE = re.compile(r"bench memory (\d+)")


class Judge:
    """Reads the query and memory numbers from a scorer prompt and answers their relevance
    after ``latency_ms``.

    It is served by child processes of its own (:func:`earm_bench.common.processes.
    judge_process`, :func:`~earm_bench.common.processes.rerank_judge_process`), so serving
    the judge's HTTP does not compete with this process's clients for the GIL; the latency is
    shared memory, so the run can change it between phases.
    """

    def __init__(self, world: World, latency_ms: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.world = world
        self._latency = context.Value("d", latency_ms)
        # A chat backend that works on at most this many calls at once and queues the rest,
        # silently (0: every call at once); and the most calls it has had, waiting or worked
        # on, since :meth:`reset_most_at_once`. Written by the serving child, read by the run.
        self._limit = context.Value("i", 0)
        self._most = context.Value("i", 0, lock=False)
        self._at_once = 0  # the serving child's own count
        self._gate: tuple[int, asyncio.Semaphore] | None = None

    @property
    def latency_ms(self) -> float:
        return float(self._latency.value)

    @latency_ms.setter
    def latency_ms(self, value: float) -> None:
        self._latency.value = value

    @property
    def limit(self) -> int:
        """Chat calls worked on at once, the rest queued (0: no limit)."""
        return int(self._limit.value)

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit.value = value

    @property
    def most_at_once(self) -> int:
        """The most chat calls the judge has had at once, waiting or worked on."""
        return int(self._most.value)

    def reset_most_at_once(self) -> None:
        self._most.value = 0

    def latency_s(self) -> float:
        return self.latency_ms / 1000

    def rerank(self, query: str, documents: list[str]) -> list[float | None]:
        """A ``/rerank`` answer: every document's relevance (the server serving it waits
        ``latency_ms`` from the request's arrival: :func:`earm_bench.common.processes.
        rerank_judge_process`)."""
        return [float(self._relevance(query, document)) for document in documents]

    async def reply(self, prompt: str) -> str:
        self._at_once += 1
        self._most.value = max(self._most.value, self._at_once)
        try:
            gate = self._gate_of(self.limit)
            if gate is None:
                return await self._answer(prompt)
            async with gate:  # the latency starts once the call is worked on
                return await self._answer(prompt)
        finally:
            self._at_once -= 1

    async def _answer(self, prompt: str) -> str:
        answered_at = self._answer_time()
        relevance = self._relevance(prompt, prompt)
        await _sleep_until(answered_at)
        return relevance

    def _gate_of(self, limit: int) -> asyncio.Semaphore | None:
        """The serving child's semaphore of ``limit`` (a new one when the limit changed)."""
        if limit <= 0:
            return None
        if self._gate is None or self._gate[0] != limit:
            self._gate = (limit, asyncio.Semaphore(limit))
        return self._gate[1]

    def _answer_time(self) -> float:
        """When a call that reaches the judge now is answered: ``latency_ms`` later, its own
        work included, as a backend of that latency would (working and then sleeping the whole
        latency answered later by the time of the work)."""
        return asyncio.get_running_loop().time() + self.latency_ms / 1000

    def _relevance(self, query_text: str, memory_text: str) -> str:
        """The relevance of the numbered query and memory, 3 decimals; "0" if not found."""
        query, memory = _QUERY_RE.search(query_text), _MEMORY_RE.search(memory_text)
        if query is None or memory is None:
            return "0"
        _, _, latent = self.world.query(int(query.group(1)))
        return f"{float(self.world.relevance(latent, int(memory.group(1)))):.3f}"


async def _sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)
