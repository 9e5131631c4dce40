"""``earm bench locomo`` with a user's own models: the scorer (``--judge scorer``) and the
reader and grader of answer accuracy (``--reader-url``), each a server on loopback speaking the
real protocol (a ``/rerank`` endpoint, OpenAI chat completions)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from earm_bench.locomo.answers import answer_prompt, graded_correct
from earm_bench.locomo.config import LocomoConfig
from earm_bench.locomo.data import load_conversations, parse_conversation
from earm_bench.locomo.report import format_markdown
from earm_bench.locomo.run import run_locomo
from service.testing import HTTPFault, LoopbackServer, chat_completions_app, rerank_app

MINI_DIR = Path(__file__).parent / "data" / "locomo-mini"
_MEMORY_LINE = re.compile(r"^- (\d+ \w+ \d{4}, \d\d:\d\d): ", re.MULTILINE)


def memory_times(prompt: str) -> list[datetime]:
    return [datetime.strptime(t, "%d %B %Y, %H:%M") for t in _MEMORY_LINE.findall(prompt)]


def test_the_reader_gets_the_memories_oldest_first_with_their_times_and_the_question() -> None:
    conversation = load_conversations(MINI_DIR, ["conv-mini"])[0]
    question = conversation.questions[0]
    newest_first = sorted(conversation.turns[:12], key=lambda t: t.occurred_at, reverse=True)
    prompt = answer_prompt(question, conversation, newest_first)
    times = memory_times(prompt)
    assert len(times) == 12 and times == sorted(times)
    assert all(turn.memory_text in prompt for turn in newest_first)
    assert f"Question: {question.question}\nAnswer:" in prompt
    assert conversation.speaker_a in prompt and conversation.speaker_b in prompt


def test_a_gold_answer_given_as_a_number_is_graded_as_its_text() -> None:
    sample = {
        "sample_id": "conv-n",
        "qa": [{"question": "When?", "answer": 2022, "evidence": ["D1:1"], "category": 2},
               {"question": "What?", "adversarial_answer": "x", "evidence": ["D1:1"],
                "category": 5}],
        "conversation": {"speaker_a": "A", "speaker_b": "B",
                         "session_1_date_time": "1:00 pm on 8 May, 2023",
                         "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]},
    }
    answers = [q.answer for q in parse_conversation(sample).questions]
    assert answers == ["2022", ""]


@pytest.mark.parametrize(("reply", "label"), [
    ('{"label": "CORRECT"}', True),
    ('{"label": "WRONG"}', False),
    ('```json\n{"label": "correct"}\n```', True),
    ("The answer names the same city, so: CORRECT", True),
    ("It is not CORRECT, it is WRONG", False),
    ("INCORRECT", None),
    ("I cannot tell.", None),
])
def test_the_graders_label_is_read_from_json_or_its_last_word(
    reply: str, label: bool | None
) -> None:
    assert graded_correct(reply) is label


class Reader:
    """A reader on loopback that answers with every memory it was given (so its answer holds
    the gold one exactly when a memory does) and records its prompts."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        memories = prompt.split("# Memories\n", 1)[1].split("\n\n# How to answer", 1)[0]
        return " | ".join(line.split(": ", 2)[-1] for line in memories.splitlines())


class Grader:
    """A grader on loopback: CORRECT when the gold answer appears in the generated one."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        gold = re.search(r"^Gold answer: (.*)$", prompt, re.MULTILINE)
        answer = re.search(r"^Generated answer: (.*)$", prompt, re.MULTILINE)
        assert gold and answer, prompt
        correct = gold.group(1).lower() in answer.group(1).lower()
        return '{"label": "%s"}' % ("CORRECT" if correct else "WRONG")


def replay_config(reader_url: str, grader_url: str | None, database: str, **more: Any) -> Any:
    return LocomoConfig(
        data_dir=MINI_DIR, conversations=("conv-mini",), max_sessions=4, candidates=40,
        ks=(5, 20), judge_miss=0.0, judge_false=0.0, judge_noise=0.0, progress=False,
        database_server=database, reader_url=reader_url, reader_model="reader-model",
        grader_url=grader_url, grader_model="grader-model" if grader_url else None, **more,
    )


def test_answer_accuracy_reads_each_policys_top_k_and_grades_against_the_gold_answer(
    postgres_server: str,
) -> None:
    reader, grader = Reader(), Grader()
    with LoopbackServer(chat_completions_app(reader)) as reader_server, \
            LoopbackServer(chat_completions_app(grader)) as grader_server:
        config = replay_config(f"{reader_server.url}/v1", f"{grader_server.url}/v1",
                               postgres_server, policies=("semantic", "full"))
        results = run_locomo(config)
    answers = results["answers"]
    assert answers["reader"] == {"url": f"{reader_server.url}/v1", "model": "reader-model"}
    assert answers["grader"]["model"] == "grader-model"
    questions = results["dataset"]["questions"]
    accuracy = {policy: {k: answers["policies"][policy][f"accuracy@{k}"] for k in (5, 20)}
                for policy in ("semantic", "full")}
    for by_k in accuracy.values():
        for entry in by_k.values():
            assert entry["graded"] == questions and entry["failed"] == entry["unparsed"] == 0
            assert sum(c["n"] for c in entry["by_category"].values()) == questions
    # a perfect judge puts each question's evidence turn (which holds its gold answer) first
    assert accuracy["full"][5]["accuracy"] == 1.0
    assert accuracy["semantic"][5]["accuracy"] < 1.0
    assert accuracy["semantic"][5]["accuracy"] <= accuracy["semantic"][20]["accuracy"]
    # one reader call per distinct prompt, each with k memories oldest first
    assert answers["reader_usage"]["calls"] == len(reader.prompts) == len(set(reader.prompts))
    assert len(reader.prompts) <= 2 * 2 * questions
    assert {len(memory_times(p)) for p in reader.prompts} == {5, 20}
    assert all(memory_times(p) == sorted(memory_times(p)) for p in reader.prompts)
    # the stand-ins count a word as a token
    assert answers["reader_usage"]["prompt_tokens"] == sum(len(p.split()) for p in reader.prompts)
    assert answers["grader_usage"]["calls"] == len(grader.prompts)
    assert any("Gold answer: a beagle\n" in p for p in grader.prompts)
    table = format_markdown(results)
    assert "### Answer accuracy (%): reader reader-model, grader grader-model" in table
    assert "| full | 100.0 | 100.0 |" in table


def test_a_reader_refusing_the_request_stops_the_answers_not_the_recall(
    postgres_server: str,
) -> None:
    def refuse(prompt: str) -> str:
        raise HTTPFault(401, '{"error": {"message": "Incorrect API key provided"}}')

    with LoopbackServer(chat_completions_app(refuse)) as reader_server:
        config = replay_config(f"{reader_server.url}/v1", None, postgres_server,
                               policies=("semantic",), max_questions=3)
        results = run_locomo(config)
    assert "401" in results["answers"]["error"]
    assert "Incorrect API key" in results["answers"]["error"]
    assert results["policies"]["semantic"]["queries"] == 3
    assert "Answer accuracy: stopped" in format_markdown(results)


def test_reader_flags_need_a_reader() -> None:
    with pytest.raises(ValueError, match="--reader-url needs --reader-model"):
        LocomoConfig(data_dir=MINI_DIR, reader_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="go with --reader-url"):
        LocomoConfig(data_dir=MINI_DIR, grader_model="m")


def overlap(query: str, documents: list[str]) -> list[float | None]:
    """A reranker on loopback: the share of the query's words each document holds."""
    words = set(re.findall(r"\w+", query.lower()))
    return [len(words & set(re.findall(r"\w+", d.lower()))) / max(1, len(words))
            for d in documents]


def test_your_rerank_scorer_is_the_services_scorer_for_every_policy_that_scores(
    postgres_server: str,
) -> None:
    app = rerank_app(overlap, protocol="rerank", model="your-reranker")
    with LoopbackServer(app) as scorer:
        config = LocomoConfig(
            data_dir=MINI_DIR, conversations=("conv-mini",), max_sessions=4, candidates=40,
            max_questions=8, ks=(10,), progress=False, database_server=postgres_server,
            policies=("semantic", "earm", "full"), judge="scorer", scorer="rerank",
            scorer_url=f"{scorer.url}/v1", scorer_model="your-reranker",
        )
        results = run_locomo(config)
    assert results["settings"]["judge_model"] == {
        "kind": "scorer", "scorer": "rerank", "url": f"{scorer.url}/v1", "model": "your-reranker"}
    policies = results["policies"]
    assert policies["full"]["scorer_calls"] == 8 * 40
    assert 0 < policies["earm"]["scorer_calls"] < policies["full"]["scorer_calls"]
    assert app.state.calls > 0 and all(p["degraded"] == 0 for p in policies.values())
    assert "your scorer (rerank at " in format_markdown(results)


def test_your_scorer_needs_its_url_and_a_known_protocol() -> None:
    with pytest.raises(ValueError, match="--judge scorer and --scorer-url go together"):
        LocomoConfig(data_dir=MINI_DIR, judge="scorer")
    with pytest.raises(ValueError, match="--judge scorer and --scorer-url go together"):
        LocomoConfig(data_dir=MINI_DIR, scorer_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="--scorer must be"):
        LocomoConfig(data_dir=MINI_DIR, judge="scorer", scorer="cohere",
                     scorer_url="http://127.0.0.1:1/v1")
