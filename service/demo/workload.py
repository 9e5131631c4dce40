"""The demo's bundled workload (``workload.json``, written by :mod:`service.demo.generate`): a
made-up persona's memories, questions about them, which memory answers each, and so how a
judge would score every (question, memory) pair."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WORKLOAD_PATH = Path(__file__).with_name("workload.json")
#: What a memory is to the questions of its topic: a fact (the answer of one question), a
#: standing fact (it bears on each of them: a weak knee on every race) or an aside (it sounds
#: like the topic and says nothing of it).
FACT, STANDING, ASIDE = "fact", "standing", "aside"
SMALL_TALK_TOPIC = "small-talk"
#: A judge's relevance of a standing fact, and of another fact of the question's topic: a real
#: judge grades context the answer needs high and the topic's other facts above the unrelated.
STANDING_RELEVANCE = 0.7
SAME_TOPIC_RELEVANCE = 0.2


@dataclass(frozen=True)
class Memory:
    external_id: str
    text: str
    occurred_at: str
    topic: str
    kind: str  # FACT, STANDING or ASIDE


@dataclass(frozen=True)
class Question:
    text: str
    topic: str
    answer: str  # the external_id of the memory that answers it


@dataclass(frozen=True)
class Workload:
    persona: str
    memories: tuple[Memory, ...]
    questions: tuple[Question, ...]

    def relevance(self, question: Question, memory: Memory) -> float:
        """The label of a (question, memory) pair."""
        if memory.external_id == question.answer:
            return 1.0
        if memory.topic != question.topic or memory.kind == ASIDE:
            return 0.0
        return STANDING_RELEVANCE if memory.kind == STANDING else SAME_TOPIC_RELEVANCE


def load(path: Path = WORKLOAD_PATH) -> Workload:
    """The workload stored at ``path``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return Workload(
        persona=data["persona"],
        memories=tuple(Memory(**memory) for memory in data["memories"]),
        questions=tuple(Question(**question) for question in data["questions"]),
    )
