"""What `earm demo` prints of a replay: every question is asked twice, and the summary adds the
phases up and compares the prequential error where it means something."""

from __future__ import annotations

from service.demo.replay import Outcome, Phase, Request, stream
from service.demo.report import phase_line, summary
from service.demo.workload import load


def outcome(
    again: bool, stage: int, calls: int, estimated: int, error: float | None
) -> Outcome:
    return Outcome(
        again=again, query_id=1, stage=stage, scorer_calls=calls, candidates=40, returned=10,
        estimated=estimated, answered=True, prequential_error=error,
    )


PHASES = [
    Phase(False, 0, 1, 2, (outcome(False, 0, 40, 0, None), outcome(False, 0, 40, 0, 0.1))),
    Phase(False, 3, 3, 4, (outcome(False, 3, 7, 3, 0.3), outcome(False, 3, 7, 4, 0.2))),
    Phase(True, 3, 5, 8, tuple(outcome(True, 3, 7, 0, 0.15) for _ in range(4))),
]


def test_every_question_is_asked_then_asked_again_in_the_same_order() -> None:
    questions = load().questions[:3]
    asks = stream(questions)
    assert [ask.question for ask in asks] == [*questions, *questions]
    assert [ask.again for ask in asks] == [False] * 3 + [True] * 3


def test_a_phase_line_says_what_it_cost_and_what_the_model_did() -> None:
    line = phase_line(PHASES[1], Request())
    assert "new" in line and "stage 3" in line and "questions 3–4" in line
    assert "scorer calls 14 of 80" in line and "estimated 35% of the top 10" in line
    assert "prequential error 0.250" in line


def test_the_summary_adds_up_calls_and_estimates_and_compares_the_errors() -> None:
    text = "\n".join(summary(PHASES, Request()))
    assert "Summary of 8 retrieves, 4 of them a question asked again" in text
    assert "SIMULATED" in text
    assert "122 made where a full rerank of every candidate makes 320: 62% saved" in text
    assert "9% of the memories returned" in text
    assert "(35% for the new questions at stage 3)" in text
    assert "0.100 at stage 0" in text
    assert "0.250 on new questions at stage 3, where 7 of 40 are scored" in text
    assert "0.150 on the questions asked again" in text
