"""The demo's bundled workload: the committed file is what its generator writes, and its labels
are consistent (each question answered by a fact of its topic, every text its own, so the
simulated scorer can tell each pair by its texts)."""

from __future__ import annotations

from service.demo import generate
from service.demo.workload import ASIDE, FACT, STANDING, WORKLOAD_PATH, load


def test_the_committed_workload_is_what_the_generator_writes() -> None:
    assert WORKLOAD_PATH.read_text(encoding="utf-8") == generate.render()


def test_each_question_is_answered_by_a_fact_of_its_topic_and_every_text_is_its_own() -> None:
    workload = load()
    memories = {memory.external_id: memory for memory in workload.memories}
    for question in workload.questions:
        answer = memories[question.answer]
        assert (answer.topic, answer.kind) == (question.topic, FACT)
    texts = [memory.text for memory in workload.memories]
    assert len(set(texts)) == len(texts)
    questions = [question.text for question in workload.questions]
    assert len(set(questions)) == len(questions)
    assert {memory.kind for memory in workload.memories} == {FACT, STANDING, ASIDE}


def test_the_labels_grade_the_answer_then_standing_facts_then_the_topic_and_nothing_else() -> None:
    workload = load()
    question = workload.questions[0]
    grades: dict[tuple[str, str], set[float]] = {}
    for memory in workload.memories:
        relation = (
            "answer" if memory.external_id == question.answer
            else "same topic" if memory.topic == question.topic else "other topic"
        )
        grades.setdefault((relation, memory.kind), set()).add(workload.relevance(question, memory))
    assert grades[("answer", FACT)] == {1.0}
    assert grades[("same topic", STANDING)] == {0.7}
    assert grades[("same topic", FACT)] == {0.2}
    assert grades[("same topic", ASIDE)] == {0.0}
    others = [grade for (relation, _), grade in grades.items() if relation == "other topic"]
    assert others and all(grade == {0.0} for grade in others)
