"""What a cold scorer pool costs a retrieve: the chat scorer's ``score`` of 35 pairs (a retrieve's
anchors at the schedule's last stage) and of 200 (a namespace's first queries) against a judge of
fixed latency in a child process (a deep listen backlog), three times: on a cold pool (the
process's first retrieve), on the warm pool, and after 5 s idle (the pool's connections closed
after ``PoolLimits.keepalive_s``, as between an agent's questions), in backend latencies, at the
shipped pool bounds and at a connect hold of ``unanswered_s`` given on the command line.

    PYTHONPATH=.:bench python docs/perf/scorer_cold_pool.py [unanswered_s ...]
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

import numpy as np

from earm_bench.common.chat_server import ChatServer
from earm_bench.common.processes import child_server
from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.http_client import PoolLimits

LATENCIES_S = (0.1, 0.5)
PAIRS = (35, 200)
IDLE_S = 5.0


def judge_of(latency_s: float) -> ChatServer:
    async def reply(prompt: str) -> str:
        await asyncio.sleep(latency_s)
        return "0.5"

    return ChatServer(reply)


async def measure(url: str, latency_s: float, pairs: int, limits: PoolLimits) -> list[float]:
    """Latencies of the cold, warm and idle-after calls."""
    scorer = OpenAIChatScorer(base_url=url + "/v1", model="judge", pool=limits)
    memories = [f"memory {i}" for i in range(pairs)]
    costs = []
    try:
        for pause_s in (0.0, 0.2, IDLE_S):
            await asyncio.sleep(pause_s)
            started = time.perf_counter()
            scores = await scorer.score("q", np.zeros(4), memories, np.zeros((pairs, 4)))
            assert None not in scores.values
            costs.append((time.perf_counter() - started) / latency_s)
    finally:
        await scorer.aclose()
    return costs


def main() -> None:
    holds = [float(arg) for arg in sys.argv[1:]] or [PoolLimits().unanswered_s]
    print("| connect hold | backend latency | pairs | cold | warm | after 5 s idle |")
    print("| --- | --- | --- | --- | --- | --- |")
    for hold in holds:
        limits = dataclasses.replace(PoolLimits(), unanswered_s=hold)
        for latency_s in LATENCIES_S:
            with child_server(lambda latency_s=latency_s: judge_of(latency_s)) as url:
                for pairs in PAIRS:
                    cold, warm, idle = asyncio.run(measure(url, latency_s, pairs, limits))
                    print(f"| {hold * 1000:.0f} ms | {latency_s * 1000:.0f} ms | {pairs} | "
                          f"{cold:.1f} | {warm:.1f} | {idle:.1f} |")


if __name__ == "__main__":
    main()
