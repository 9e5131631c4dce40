"""The LLM judge of ``earm bench load``: the world's low-rank relevance, after a latency."""

from __future__ import annotations

import asyncio
import re

from service.bench.load.world import World

_QUERY_RE = re.compile(r"bench query (\d+)")
_MEMORY_RE = re.compile(r"bench memory (\d+)")


class Judge:
    """Reads the query and memory numbers from a scorer prompt and answers their relevance
    after ``latency_ms``.

    It is served by a child process of its own (:func:`service.bench.common.processes.
    judge_process`), so serving the judge's HTTP does not compete with this process's clients
    for the GIL; the latency is shared memory, so the run can change it between phases.
    """

    def __init__(self, world: World, latency_ms: float) -> None:
        import multiprocessing

        self.world = world
        self._latency = multiprocessing.get_context("fork").Value("d", latency_ms)

    @property
    def latency_ms(self) -> float:
        return float(self._latency.value)

    @latency_ms.setter
    def latency_ms(self, value: float) -> None:
        self._latency.value = value

    async def reply(self, prompt: str) -> str:
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        query, memory = _QUERY_RE.search(prompt), _MEMORY_RE.search(prompt)
        if query is None or memory is None:
            return "0"
        _, _, latent = self.world.query(int(query.group(1)))
        return f"{float(self.world.relevance(latent, int(memory.group(1)))):.3f}"
