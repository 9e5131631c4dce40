"""The demo's replay: the workload's memories ingested into a namespace of a running earm, then
its questions asked one after the other through the HTTP API like any agent's, and then all of
them again, as an agent's needs come back; and what the answers add up to, phase by phase (a
phase is a budget stage of one of the two passes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from service.client import EarmAPIError, EarmClient
from service.demo.workload import Question, Workload

#: The demo's namespace; its name says, on the dashboard too, that the scores are simulated.
NAMESPACE = "demo-simulated-scorer"


@dataclass(frozen=True)
class Request:
    """What each question asks for. An agent filling a prompt asks for ten memories; forty
    candidates keep the late budget stage (17.5% of them: 7 anchors) below k, so the top k
    holds estimated memories, where 200 candidates would score 35 and mostly fill it with
    observed ones."""

    k: int = 10
    candidates: int = 40


@dataclass(frozen=True)
class Ask:
    """One question asked, and whether it was asked before."""

    question: Question
    again: bool


def stream(questions: Sequence[Question]) -> list[Ask]:
    """Every question, then every question again in the same order, as an agent's needs come
    back."""
    return [Ask(question, again) for again in (False, True) for question in questions]


@dataclass(frozen=True)
class Outcome:
    """One question's answer, as the demo reports it."""

    again: bool
    query_id: int
    stage: int
    scorer_calls: int
    candidates: int
    returned: int
    estimated: int  # returned memories ranked by the completion model's estimate
    answered: bool  # the memory that answers the question is among those returned
    prequential_error: float | None  # of this query's anchors (None: no anchor had history)


@dataclass(frozen=True)
class Phase:
    """The questions asked at one budget stage, new or asked again."""

    again: bool
    stage: int
    first: int  # 1-based numbers of its first and last retrieve
    last: int
    outcomes: tuple[Outcome, ...]

    @property
    def scorer_calls(self) -> int:
        return sum(outcome.scorer_calls for outcome in self.outcomes)

    @property
    def full_rerank_calls(self) -> int:
        return sum(outcome.candidates for outcome in self.outcomes)

    @property
    def estimated_share(self) -> float:
        returned = sum(outcome.returned for outcome in self.outcomes)
        return sum(outcome.estimated for outcome in self.outcomes) / max(returned, 1)

    @property
    def answered_share(self) -> float:
        return fmean(outcome.answered for outcome in self.outcomes)

    @property
    def prequential_error(self) -> float | None:
        return mean_prequential_error(self.outcomes)


def mean_prequential_error(outcomes: Sequence[Outcome]) -> float | None:
    """The mean of the outcomes' prequential errors (None: none has one)."""
    errors = [o.prequential_error for o in outcomes if o.prequential_error is not None]
    return fmean(errors) if errors else None


def ingest(client: EarmClient, workload: Workload, namespace: str = NAMESPACE) -> int:
    """Store the workload's memories in a fresh ``namespace`` (an earlier demo's is erased, so
    every run starts from no experience); the number stored."""
    try:
        client.delete_namespace(namespace)
    except EarmAPIError as error:
        if error.status != 404:
            raise
    memories = [
        {"text": m.text, "external_id": m.external_id, "occurred_at": m.occurred_at}
        for m in workload.memories
    ]
    return client.add(namespace, memories).created


def ask(client: EarmClient, asked: Ask, request: Request, namespace: str = NAMESPACE) -> Outcome:
    """Retrieve for the question and read back its trace (the prequential error)."""
    question = asked.question
    result = client.retrieve(namespace, question.text, k=request.k, candidates=request.candidates)
    if result.query_id is None:  # only where the namespace has no memories
        raise RuntimeError(f"the namespace {namespace} has no memories: ingest the workload first")
    trace = client.trace(result.query_id)
    return Outcome(
        again=asked.again,
        query_id=result.query_id,
        stage=result.stage,
        scorer_calls=result.scorer_calls,
        candidates=trace.candidate_count,
        returned=len(result.memories),
        estimated=sum(memory.source == "estimated" for memory in result.memories),
        answered=any(memory.external_id == question.answer for memory in result.memories),
        prequential_error=trace.prequential_error,
    )


def replay(
    client: EarmClient,
    asks: Sequence[Ask],
    request: Request,
    on_phase: Callable[[Phase], None] = lambda phase: None,
    namespace: str = NAMESPACE,
) -> list[Phase]:
    """Ask ``asks`` in order; ``on_phase`` hears of each phase as it ends."""
    phases: list[Phase] = []
    current: list[Outcome] = []

    def close_phase(number: int) -> None:
        first = current[0]
        phase = Phase(first.again, first.stage, number - len(current) + 1, number, tuple(current))
        phases.append(phase)
        on_phase(phase)

    for number, asked in enumerate(asks, start=1):
        outcome = ask(client, asked, request, namespace)
        if current and (outcome.again, outcome.stage) != (current[0].again, current[0].stage):
            close_phase(number - 1)
            current = []
        current.append(outcome)
    if current:
        close_phase(len(asks))
    return phases
