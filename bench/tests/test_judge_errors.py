"""The oracle judge's error models (``--judge-errors``): ``independent`` gives the scores it always
gave; ``correlated`` and ``crossencoder`` carry each of their ingredients, measurably, on the
LoCoMo dev data; every model scores a pair the same through chat and rerank, in any order;
and a tiny run of each goes through ``earm bench locomo``.

The statistics use conv-30 (369 turns, 81 questions: 30,000 pairs a model, well under a second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from earm_bench.common.cli import config_from_args
from earm_bench.locomo import LocomoConfig, add_locomo_parser
from earm_bench.locomo.data import Conversation, load_conversations
from earm_bench.locomo.judge import (
    NoiseModel,
    OracleJudge,
    judge_score,
    oracle_score,
    pair_key,
    start_judge,
)
from earm_bench.locomo.judge_errors import (
    PairFacts,
    crossencoder_scale,
    evidence_distance,
    false_positive_rate,
    jaccard,
)
from service.cli.main import main
from service.providers.chat_scorer import SYSTEM_PROMPT, USER_PROMPT, fill

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCOMO_DIR = Path(
    os.environ.get("EARM_LOCOMO_DIR") or REPO_ROOT.parent / "shared" / "data" / "locomo"
)
MODELS = ("independent", "correlated", "crossencoder")


@dataclass(frozen=True)
class Row:
    """One (question, turn) pair of conv-30 with its score."""

    question: int
    dia_id: str
    relevant: bool
    distance: int | None  # to the nearest evidence turn of the same session
    overlap: float  # content-word Jaccard
    score: float


@pytest.fixture(scope="module")
def locomo_dir() -> Path:
    if not LOCOMO_DIR.is_dir():
        pytest.skip(
            f"LoCoMo data not found at {LOCOMO_DIR}: set EARM_LOCOMO_DIR to a directory holding "
            "conv-30.json, an element of data/locomo10.json of github.com/snap-research/locomo"
        )
    return LOCOMO_DIR


@pytest.fixture(scope="module")
def conversations(locomo_dir: Path) -> list[Conversation]:
    return load_conversations(locomo_dir, ("conv-26", "conv-30"))


@pytest.fixture(scope="module")
def conv30(conversations: list[Conversation]) -> Conversation:
    return next(c for c in conversations if c.sample_id == "conv-30")


@pytest.fixture(scope="module")
def table(conv30: Conversation) -> Callable[..., list[Row]]:
    """The rows of every (question, turn) pair of conv-30 under a model (cached per model)."""
    cache: dict[NoiseModel, list[Row]] = {}

    def rows(errors: str, **flags: float) -> list[Row]:
        model = NoiseModel(errors=errors, **flags)
        if model not in cache:
            cache[model] = [
                Row(i, t.dia_id, facts.relevant,
                    evidence_distance(facts.dia_ids, facts.evidence),
                    jaccard(q.question, t.memory_text), judge_score(facts, model))
                for i, q in enumerate(conv30.replay_questions())
                for t in conv30.turns
                for facts in [PairFacts(conv30.sample_id, q.question, t.memory_text,
                                        (t.dia_id,), frozenset(q.evidence),
                                        t.dia_id in q.evidence)]
            ]
        return cache[model]

    return rows


def far(rows: list[Row]) -> list[Row]:
    """Non-evidence pairs more than 2 turns from any evidence turn of their session."""
    return [r for r in rows if not r.relevant and (r.distance is None or r.distance > 2)]


def mean(rows: list[Row]) -> float:
    return statistics.fmean(r.score for r in rows)


# --- independent: today's scores ---------------------------------------------------------------

# (sample, qa index, turn, reply at seed 0 with the default flags, reply at seed 3 with miss 0.3,
# false 0.1, noise 0.2), as the judge answered before the error models existed.
GOLDEN = [
    ("conv-26", 0, "D1:3", "0.959", "0.118"),
    ("conv-26", 7, "D2:14", "0.991", "0.549"),
    ("conv-26", 7, "D19:7", "0.054", "0.169"),
    ("conv-26", 151, "D7:23", "0.037", "0.000"),
    ("conv-30", 0, "D13:23", "0.036", "0.033"),
    ("conv-30", 7, "D2:1", "0.989", "0.272"),
    ("conv-30", 7, "D13:11", "0.153", "0.191"),
    ("conv-30", 81, "D18:13", "1.000", "0.429"),
    ("conv-30", 81, "D18:1", "0.125", "0.000"),
]


def test_independent_gives_the_scores_of_before(conversations: list[Conversation]) -> None:
    default = OracleJudge(conversations)
    assert default.model.errors == "independent"
    other = OracleJudge(conversations, NoiseModel(miss=0.3, false=0.1, noise=0.2, seed=3))
    by_id = {c.sample_id: c for c in conversations}
    for sample, qa_index, dia_id, at_seed0, at_seed3 in GOLDEN:
        conv = by_id[sample]
        question = conv.questions[qa_index].question
        turn = next(t for t in conv.turns if t.dia_id == dia_id)
        user = fill(USER_PROMPT, question, turn.memory_text)
        assert (default.reply(user), other.reply(user)) == (at_seed0, at_seed3)
    # and through the judge, every sampled pair is oracle_score of its pair key
    model = NoiseModel(seed=5)
    judge = OracleJudge(conversations, model)
    for conv in conversations:
        for q in conv.replay_questions()[::9]:
            for t in conv.turns[::7]:
                pair = judge.identify(fill(USER_PROMPT, q.question, t.memory_text))
                assert pair is not None
                key = pair_key(5, conv.sample_id, q.question, "|".join(sorted(pair.dia_ids)))
                assert pair.score == oracle_score(t.dia_id in q.evidence, key, model)


# --- every model: deterministic, same through chat and rerank ----------------------------------


@pytest.mark.parametrize("errors", MODELS)
def test_a_pair_scores_the_same_whatever_the_call_order(
    conversations: list[Conversation], errors: str
) -> None:
    conv = conversations[0]
    prompts = [fill(USER_PROMPT, q.question, t.memory_text)
               for q in conv.replay_questions()[:6] for t in conv.turns[::20]]
    first = [OracleJudge(conversations, NoiseModel(errors=errors)).reply(p) for p in prompts]
    again = OracleJudge(conversations, NoiseModel(errors=errors))
    assert [again.reply(p) for p in reversed(prompts)] == first[::-1]
    assert [again.reply(p) for p in prompts] == first  # answered from its cache
    reseeded = OracleJudge(conversations, NoiseModel(errors=errors, seed=1))
    assert [reseeded.reply(p) for p in prompts] != first


@pytest.mark.parametrize("errors", MODELS)
def test_chat_and_rerank_serve_the_same_score_for_a_pair(
    conv30: Conversation, errors: str
) -> None:
    model = NoiseModel(errors=errors)
    question = conv30.replay_questions()[0]
    evidence = [t for t in conv30.turns if t.dia_id in question.evidence]
    documents = list(dict.fromkeys(t.memory_text for t in evidence + conv30.turns[:12]))
    with start_judge("oracle", [conv30], model, protocol="rerank") as judge:
        body = {"model": "m", "query": question.question, "documents": documents}
        answer = httpx.post(f"{judge.base_url}/rerank", json=body, timeout=10).json()
        reranked = {documents[r["index"]]: r["relevance_score"] for r in answer["results"]}
    assert len(reranked) == len(documents)
    with start_judge("oracle", [conv30], model, protocol="chat") as judge, httpx.Client(
        base_url=str(judge.base_url), timeout=10
    ) as client:
        for document, score in reranked.items():
            body = {"model": "m", "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": fill(USER_PROMPT, question.question, document)},
            ]}
            reply = client.post("/chat/completions", json=body).json()
            assert float(reply["choices"][0]["message"]["content"]) == score
        assert judge.oracle is not None and judge.oracle.stats()["unknown"] == 0
        assert judge.describe()["errors"] == errors


# --- correlated: each ingredient ---------------------------------------------------------------


def test_turns_next_to_evidence_score_partially(table: Callable[..., list[Row]]) -> None:
    for errors, gap in (("correlated", 0.15), ("independent", None)):
        rows = table(errors)
        first = [r for r in rows if not r.relevant and r.distance == 1]
        second = [r for r in rows if not r.relevant and r.distance == 2]
        assert len(first) > 100 and len(second) > 100
        if gap is None:
            assert abs(mean(first) - mean(far(rows))) < 0.02
        else:
            assert mean(first) > mean(second) > mean(far(rows))
            assert mean(first) - mean(far(rows)) > gap


def _halves_correlation(rows: list[Row]) -> float:
    """Correlation over turns of a turn's mean score in even and in odd questions (non-evidence
    pairs far from the evidence only)."""
    sums: dict[str, list[list[float]]] = {}
    for r in far(rows):
        sums.setdefault(r.dia_id, [[], []])[r.question % 2].append(r.score)
    pairs = [(statistics.fmean(a), statistics.fmean(b)) for a, b in sums.values() if a and b]
    x, y = np.array(pairs).T
    return float(np.corrcoef(x, y)[0, 1])


def test_a_turns_bias_carries_across_questions(table: Callable[..., list[Row]]) -> None:
    assert _halves_correlation(table("correlated")) > 0.6
    assert abs(_halves_correlation(table("independent"))) < 0.15


def _positive_rate(rows: list[Row], low: float, high: float) -> float:
    chosen = [r for r in far(rows) if low <= r.overlap < high]
    assert len(chosen) > 300
    return sum(r.score > 0.5 for r in chosen) / len(chosen)


def test_false_positives_grow_with_word_overlap(table: Callable[..., list[Row]]) -> None:
    assert false_positive_rate(0.05, 0.05) == 0.05  # the dev split's mean overlap
    assert false_positive_rate(0.05, 0.0) == pytest.approx(0.02)
    assert false_positive_rate(0.05, 0.3) == pytest.approx(0.2)
    assert false_positive_rate(0.2, 1.0) == 0.5 and false_positive_rate(0.0, 1.0) == 0.0
    rates = {errors: (_positive_rate(table(errors), 0.0, 0.08),
                      _positive_rate(table(errors), 0.15, 1.01))
             for errors in ("correlated", "independent")}
    low, high = rates["correlated"]
    assert high - low > 0.05
    low, high = rates["independent"]
    assert abs(high - low) < 0.03
    # --judge-false 0 turns the lexical ones off too
    low, high = (_positive_rate(table("correlated", false=0.0), 0.0, 0.08),
                 _positive_rate(table("correlated", false=0.0), 0.15, 1.01))
    assert abs(high - low) < 0.03


def test_each_question_has_a_scale_of_its_own(table: Callable[..., list[Row]]) -> None:
    clean = {"miss": 0.0, "false": 0.0, "noise": 0.0}

    def medians(rows: list[Row]) -> list[float]:
        by_question: dict[int, list[float]] = {}
        for r in far(rows):
            by_question.setdefault(r.question, []).append(r.score)
        return [statistics.median(scores) for scores in by_question.values()]

    assert statistics.pstdev(medians(table("correlated", **clean))) > 0.04
    assert statistics.pstdev(medians(table("independent", **clean))) == 0.0


def test_scores_are_graded(table: Callable[..., list[Row]]) -> None:
    clean = {"miss": 0.0, "false": 0.0, "noise": 0.0}
    evidence = [r.score for r in table("correlated", **clean) if r.relevant]
    assert sum(s == 1.0 for s in evidence) / len(evidence) < 0.3
    assert statistics.pstdev(evidence) > 0.08 and 0.5 < statistics.median(evidence) < 0.95
    others = [r.score for r in table("correlated", **clean) if not r.relevant]
    assert sum(s == 0.0 for s in others) / len(others) < 0.9
    plain = table("independent", **clean)
    assert {r.score for r in plain if r.relevant} == {1.0}
    assert {r.score for r in plain if not r.relevant} == {0.0}


def test_the_flags_keep_their_meaning_under_correlated(conv30: Conversation) -> None:
    pairs = [PairFacts(conv30.sample_id, q.question, t.memory_text, (t.dia_id,),
                       frozenset(q.evidence), t.dia_id in q.evidence)
             for q in conv30.replay_questions() for t in conv30.turns[::4]
             if t.dia_id in q.evidence or q.qa_index % 8 == 0]

    def scores(relevant: bool, **flags: float) -> list[float]:
        model = NoiseModel(errors="correlated", **flags)
        return [judge_score(p, model) for p in pairs if p.relevant == relevant]

    missed, kept = scores(True, miss=1.0), scores(True, miss=0.0)
    assert statistics.fmean(missed) < statistics.fmean(kept) - 0.4
    assert statistics.fmean(scores(True, miss=0.5)) < statistics.fmean(kept) - 0.15
    noisy, quiet = scores(False, noise=0.3), scores(False, noise=0.0)
    assert statistics.pstdev(a - b for a, b in zip(noisy, quiet, strict=True)) > 0.1


def test_crossencoder_is_the_correlated_order_on_a_small_scale(
    table: Callable[..., list[Row]],
) -> None:
    cross, correlated = table("crossencoder"), table("correlated")
    assert all(c.score == crossencoder_scale(r.score)
               for c, r in zip(cross, correlated, strict=True))
    relevant = [r.score for r in cross if r.relevant]
    assert 0.1 <= statistics.median(relevant) <= 0.3
    assert statistics.median(r.score for r in cross if not r.relevant) <= 0.05
    assert max(r.score for r in cross) < 0.5  # a 0-1 judge's 0.5 threshold keeps nothing


# --- the bench CLI -----------------------------------------------------------------------------


def test_the_judge_errors_flag() -> None:
    parser = argparse.ArgumentParser()
    add_locomo_parser(parser.add_subparsers(dest="bench"))
    assert parser.parse_args(["locomo", "--data", "/d"]).judge_errors == "independent"
    args = parser.parse_args(["locomo", "--data", "/d", "--judge-errors", "crossencoder"])
    assert config_from_args(LocomoConfig, args, data_dir=Path("/d")).judge_errors == "crossencoder"
    with pytest.raises(SystemExit):
        parser.parse_args(["locomo", "--data", "/d", "--judge-errors", "lenient"])
    with pytest.raises(ValueError, match="--judge-errors"):
        LocomoConfig(data_dir=Path("/d"), judge_errors="lenient")
    with pytest.raises(ValueError, match="errors must be one of"):
        NoiseModel(errors="lenient")


#: A made-up conversation in LoCoMo's layout: the smoke runs need no external data.
MINI_DIR = Path(__file__).parent / "data" / "locomo-mini"


@pytest.mark.parametrize("errors", MODELS)
def test_earm_bench_locomo_runs_each_judge_error_model(
    tmp_path: Path, postgres_server: str, errors: str
) -> None:
    out = tmp_path / "RESULTS.json"
    status = main([
        "bench", "locomo", "--data", str(MINI_DIR), "--conversations", "conv-mini",
        "--max-sessions", "1", "--max-questions", "3", "--candidates", "20", "--k", "5",
        "--policies", "earm", "--schedule", "0:1.0,2:0.5",
        "--judge-protocol", "rerank", "--judge-errors", errors, "--no-progress",
        "--database-server", postgres_server, "--out", str(out),
    ])
    assert status == 0
    results = json.loads(out.read_text())
    judge = results["settings"]["judge_model"]
    assert judge["errors"] == errors == results["settings"]["judge_errors"]
    assert judge["stats"]["unknown"] == 0 and judge["stats"]["calls"] > 0
    assert results["policies"]["earm"]["queries"] == 3
    assert results["policies"]["earm"]["scorer_calls"] > 0
