"""Where LoCoMo's evidence lies against the semantic candidates (MiniLM, the dev conversations):
the share outside the top 200 and 100, and how much of what lies outside was evidence of an
earlier question inside its own top 200, i.e. learnable from history.

    PYTHONPATH=.:bench python docs/perf/evidence_outside_pool.py ../shared/data/locomo
"""

import asyncio
import sys

import numpy as np

from earm_bench.locomo.data import load_conversations
from service.providers.local_embedder import LocalEmbedder

POOL = 200


async def main(data: str) -> None:
    embedder = LocalEmbedder()
    ranks: list[int] = []
    outside = learnable = 0
    history_outside: list[int] = []
    for conversation in load_conversations(data):
        ids = [turn.dia_id for turn in conversation.turns]
        memories = await embedder.embed([t.memory_text for t in conversation.turns], bulk=True)
        questions = [q for q in conversation.replay_questions() if q.has_evidence]
        queries = await embedder.embed([q.question for q in questions])
        order = np.argsort(-(queries @ memories.T), axis=1)
        relevant_before: set[str] = set()
        for i, question in enumerate(questions):
            rank = {ids[j]: r for r, j in enumerate(order[i])}
            pool = {ids[j] for j in order[i][:POOL]}
            ranks += [rank[e] for e in question.evidence]
            missed = [e for e in question.evidence if e not in pool]
            outside += len(missed)
            learnable += sum(e in relevant_before for e in missed)
            history_outside.append(len(relevant_before - pool))
            relevant_before |= {e for e in question.evidence if e in pool}
    r = np.array(ranks)
    print(f"evidence {len(r)}, outside top 200 {np.mean(r >= 200):.1%}, outside top 100 "
          f"{np.mean(r >= 100):.1%}, median rank {np.median(r):.0f}")
    print(f"outside top 200: {outside}, evidence of an earlier question in its top 200: "
          f"{learnable} ({learnable / len(r):.1%} of all evidence); such memories outside a "
          f"query's top 200: median {np.median(history_outside):.0f}")


asyncio.run(main(sys.argv[1]))
