"""The scorer's queue signal (``service.providers.concurrency_limit.QueueEstimate``) against
backends that queue and backends whose latency varies without queueing: the chat scorer's
``score`` of 200 pairs (a retrieve at policy ``full``), ``CALLS`` times in a row on one scorer
(the shipped pool, a window of at most 64), with the signal and without it, against a judge in a
child process:

- ``slots``: works on 4 calls at once for 100 ms each and queues the rest without a word (the
  capacity bench's T10 backend);
- ``random``: no queue, each call 100 to 300 ms at random;
- ``prompt``: no queue, 100 ms + 200 ms x the memory's share of 8,000 characters, memories of
  10 to 8,000 characters in random order;
- ``prompt-sorted``: the same, the memories sent shortest first (the rising latency a queue
  would show, its worst case);
- ``instant``: no wait at all (what bounds it is the judge's and the client's CPU).

The two scorers (without the signal, with it) take turns on one judge. Per scorer: the score's
wall time, the most calls the judge had at once (waiting or worked on), the first call apart
(a window learns the backend in it), and the window at the end.

    PYTHONPATH=.:bench python docs/perf/scorer_queue_signal.py [calls [backend ...]]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from earm_bench.common.chat_server import ChatServer
from earm_bench.common.processes import child_server
from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.concurrency_limit import AIMDLimit

PAIRS = 200
SLOTS = 4
BASE_S = 0.1
LONGEST = 8000

_context = multiprocessing.get_context("fork")
_at_once = _context.Value("i", 0)
_most = _context.Value("i", 0)


def _memories(kind: str) -> list[str]:
    rng = random.Random(7)
    lengths = [rng.randint(10, LONGEST) for _ in range(PAIRS)]
    if kind == "prompt-sorted":
        lengths.sort()
    return [f"m{i} " + "x" * max(0, n - 6) for i, n in enumerate(lengths)]


def judge(kind: str) -> Callable[[], ChatServer]:
    def make() -> ChatServer:
        gate: list[asyncio.Semaphore] = []
        rng = random.Random(11)

        async def work(prompt: str) -> None:
            if kind == "slots":
                if not gate:
                    gate.append(asyncio.Semaphore(SLOTS))
                async with gate[0]:
                    await asyncio.sleep(BASE_S)
            elif kind == "instant":
                return
            elif kind == "random":
                await asyncio.sleep(BASE_S * rng.uniform(1, 3))
            else:
                memory = max(prompt.split(), key=len)
                await asyncio.sleep(BASE_S * (1 + 2 * min(len(memory), LONGEST) / LONGEST))

        async def reply(prompt: str) -> str:
            _at_once.value += 1
            _most.value = max(_most.value, _at_once.value)
            try:
                await work(prompt)
            finally:
                _at_once.value -= 1
            return "0.5"

        return ChatServer(reply)

    return make


async def call(scorer: OpenAIChatScorer, memories: list[str]) -> dict[str, Any]:
    _most.value = 0
    started = time.perf_counter()
    scores = await scorer.score("q", np.zeros(4), memories, np.zeros((PAIRS, 4)))
    seconds = time.perf_counter() - started
    assert None not in scores.values
    return {"s": seconds, "most": _most.value, "window": scorer.limit.window}


async def run(url: str, kind: str, calls: int) -> dict[bool, list[dict[str, Any]]]:
    """``calls`` calls of a scorer without the signal and of one with it, in turn."""
    scorers = {}
    for signal in (False, True):
        scorer = OpenAIChatScorer(base_url=url + "/v1", model="judge", max_retries=0,
                                  timeout_s=60.0)
        scorer.limit = AIMDLimit(scorer.limit.ceiling, queue_signal=signal)
        scorers[signal] = scorer
    memories = _memories(kind)
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    try:
        for _ in range(calls):
            for signal, scorer in scorers.items():
                rows[signal].append(await call(scorer, memories))
    finally:
        for scorer in scorers.values():
            await scorer.aclose()
    return rows


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print("| backend | signal | score s: 1st call, median of the rest (× off) "
          "| most at the judge at once: 1st call, most of the rest | window after the last |")
    print("| --- | --- | --- | --- | --- |")
    kinds = sys.argv[2:] or ["slots", "random", "prompt", "prompt-sorted", "instant"]
    for kind in kinds:
        with child_server(judge(kind)) as url:
            rows = asyncio.run(run(url, kind, calls))
        off = statistics.median(row["s"] for row in rows[False][1:])
        for signal in (False, True):
            first, rest = rows[signal][0], rows[signal][1:]
            median = statistics.median(row["s"] for row in rest)
            print(f"| {kind} | {'on' if signal else 'off'} | {first['s']:.3f}, {median:.3f} "
                  f"({median / off:.3f}) | {first['most']}, {max(row['most'] for row in rest)} "
                  f"| {rest[-1]['window']} |", flush=True)


if __name__ == "__main__":
    main()
