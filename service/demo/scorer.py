"""The demo's simulated scorer: a real ``/rerank`` server on loopback that answers from the
workload's labels with some noise, instead of a model. Its model name says so, and it is what
earm talks to through its ordinary reranker client (``EARM_SCORER=rerank``)."""

from __future__ import annotations

import hashlib

from fastapi import FastAPI

from service.demo.workload import Memory, Question, Workload
from service.settings import Settings
from service.testing import rerank_app

#: The model name the stand-in reports, so nothing downstream mistakes it for a model.
SIMULATED_MODEL = "simulated-scorer-answering-from-labels"
#: Half-width of the uniform noise on each label: a judge's scores are never exact, and
#: without noise the completion would have nothing left to be wrong about.
NOISE = 0.15


class LabelScorer:
    """Scores a (question, memory) pair as its label plus noise that is fixed per pair (a hash
    of the two texts), so a pair scored twice gets the same score, as from a deterministic
    judge. A text the workload does not know scores 0."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._questions = {question.text: question for question in workload.questions}
        self._memories = {memory.text: memory for memory in workload.memories}

    def __call__(self, query: str, documents: list[str]) -> list[float | None]:
        question = self._questions.get(query)
        return [self._score(question, self._memories.get(text)) for text in documents]

    def _score(self, question: Question | None, memory: Memory | None) -> float:
        if question is None or memory is None:
            return 0.0
        label = self.workload.relevance(question, memory)
        return min(1.0, max(0.0, label + NOISE * _noise(question.text, memory.text)))


def _noise(query: str, document: str) -> float:
    """A number in [-1, 1) fixed by the pair (blake2b, not Python's per-process salted hash)."""
    digest = hashlib.blake2b(f"{query}\0{document}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


def simulated_scorer_app(workload: Workload) -> FastAPI:
    """The ``/rerank`` app (Cohere/vLLM shape) answering with :class:`LabelScorer`."""
    return rerank_app(LabelScorer(workload), model=SIMULATED_MODEL)


def scored_by_stand_in(settings: Settings, url: str) -> Settings:
    """``settings`` with the simulated scorer at ``url`` as the relevance scorer, reached through
    the ordinary reranker client; every other setting is left as it is."""
    return settings.model_copy(
        update={"scorer": "rerank", "scorer_base_url": url, "scorer_model": SIMULATED_MODEL}
    )
