"""The LoCoMo replay benchmark: loader, oracle judge, metrics, and a seconds-long end-to-end smoke.

The LoCoMo data is read from ``../shared/data/locomo`` next to the repository (or
``EARM_LOCOMO_DIR``); it is never copied into the repository. Unit tests use synthetic samples,
and the end-to-end smokes a made-up conversation in its layout (``tests/data/locomo-mini``), so
they run on any checkout; the tests that need the real data skip without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from earm_bench.common.cli import config_from_args
from earm_bench.locomo import (
    LocomoConfig,
    add_locomo_parser,
    format_markdown,
    run_locomo,
)
from earm_bench.locomo.data import (
    Conversation,
    Question,
    Turn,
    memory_text,
    normalize_evidence,
    parse_conversation,
    parse_session_datetime,
)
from earm_bench.locomo.judge import (
    NoiseModel,
    OracleJudge,
    oracle_score,
    pair_key,
    start_judge,
)
from earm_bench.locomo.metrics import (
    QueryRecord,
    behind_exact_cache,
    derived,
    estimated_share_at_k,
    hit_at_k,
    percentile,
    quality,
    recall_at_k,
    rolling_mean,
    source_shares_at_k,
    summarize_policy,
)
from earm_bench.locomo.replay import askings
from earm_bench.locomo.report import pct
from earm_bench.locomo.shift import summarize_shift
from service.budget import BudgetSchedule

REPO_ROOT = Path(__file__).resolve().parents[2]
#: A made-up conversation in LoCoMo's layout (4 sessions of 16 turns, 16 questions): the smoke
#: replays need no external data.
MINI_DIR = Path(__file__).parent / "data" / "locomo-mini"
LOCOMO_DIR = Path(
    os.environ.get("EARM_LOCOMO_DIR") or REPO_ROOT.parent / "shared" / "data" / "locomo"
)
#: Where the data comes from, for the skip message of the tests that need it.
LOCOMO_SOURCE = (
    "set EARM_LOCOMO_DIR to a directory holding one <sample_id>.json per conversation "
    "(conv-26.json, ...), the elements of data/locomo10.json of github.com/snap-research/locomo "
    "(CC BY-NC 4.0)"
)

# A prompt shaped like the service's scorer prompt (query and memory verbatim, labelled blocks).
SYSTEM = "You are a relevance judge. Answer with a single number between 0 and 1."
USER = "Query:\n{query}\n\nMemory:\n{memory}\n\nRelevance (0 to 1):"


def prompt(query: str, memory: str) -> str:
    """The concatenated message contents, as the loopback judge receives them."""
    return SYSTEM + "\n\n" + USER.format(query=query, memory=memory)


# --- synthetic data ---------------------------------------------------------------------------


def synthetic_sample(sample_id: str = "conv-x") -> dict:
    """A tiny LoCoMo-shaped sample (made-up text) exercising the schema's quirks."""
    return {
        "sample_id": sample_id,
        "qa": [
            {"question": "When did Ann paint a lake?", "answer": 2022, "evidence": ["D1:2"],
             "category": 2},
            {"question": "What does Ann like?", "answer": "lakes",
             "evidence": ["D1:2; D2:1", "D1:2", "D:2:2"], "category": 1},
            {"question": "Would Bob enjoy hiking?", "answer": "yes", "evidence": [],
             "category": 3},
            {"question": "What did Bob buy?", "adversarial_answer": "a boat",
             "evidence": ["D2:09", "D"], "category": 5},
        ],
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1_date_time": "11:59 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Bob!"},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Look at this.",
                 "img_url": ["http://example.invalid/x.jpg"],
                 "blip_caption": "a painting of a lake", "query": "lake painting"},
            ],
            "session_2_date_time": "12:00 am on 9 May, 2023",
            "session_2": [
                {"speaker": "Ann", "dia_id": "D2:1", "text": "I love lakes."},
                {"speaker": "Bob", "dia_id": "D2:2", "text": "Me too."},
            ],
            "session_3_date_time": "1:00 pm on 9 May, 2023",  # stray key without a session list
        },
    }


# --- loader -----------------------------------------------------------------------------------


def test_normalize_evidence_readme_quirks() -> None:
    valid = {"D8:6", "D9:17", "D11:26", "D10:16", "D3:5", "D1:1", "D1:2"}
    assert normalize_evidence(["D8:6; D9:17"], valid) == ("D8:6", "D9:17")
    assert normalize_evidence(["D:11:26"], valid) == ("D11:26",)
    assert normalize_evidence(["D"], valid) == ()
    assert normalize_evidence(["D10:19"], valid) == ()  # well formed, past the session's end
    assert normalize_evidence(["D10:19"]) == ("D10:19",)  # kept when validity is not checked
    assert normalize_evidence(["D3:05"], valid) == ("D3:5",)  # zero-padded turn
    assert normalize_evidence(["D1:1", "D1:1", "D1:2 D1:1"], valid) == ("D1:1", "D1:2")
    assert normalize_evidence(["(D1:2)", "D1:1,D8:6"], valid) == ("D1:2", "D1:1", "D8:6")
    assert normalize_evidence([], valid) == ()


def test_parse_conversation_memories_and_questions() -> None:
    conv = parse_conversation(synthetic_sample())
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D2:1", "D2:2"]
    assert conv.turns[1].memory_text == "Bob: Look at this. [image: a painting of a lake]"
    assert conv.turns[0].memory_text == "Ann: Hi Bob!"
    memories = conv.memories()
    assert memories[1]["external_id"] == "D1:2"
    assert memories[0]["occurred_at"] == "2023-05-08T23:59:00+00:00"
    # Session 2 starts one minute later: turn offsets shrink so order is kept across sessions.
    times = [t.occurred_at for t in conv.turns]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert times[1] < parse_session_datetime("12:00 am on 9 May, 2023") == times[2]
    qs = conv.questions
    assert [q.category for q in qs] == [2, 1, 3, 5]
    assert qs[1].evidence == ("D1:2", "D2:1", "D2:2")
    assert qs[2].evidence == () and not qs[2].has_evidence
    assert qs[3].evidence == ()  # "D2:09" -> D2:9 does not exist; "D" is dropped
    assert [q.category for q in conv.replay_questions()] == [2, 1, 3]
    sliced = parse_conversation(synthetic_sample(), max_sessions=1)
    assert [t.dia_id for t in sliced.turns] == ["D1:1", "D1:2"]
    assert [q.qa_index for q in sliced.questions] == [0]  # evidence entirely inside the slice


# --- oracle judge -----------------------------------------------------------------------------


def test_oracle_score_is_deterministic_per_pair_and_seed() -> None:
    model = NoiseModel(seed=7)
    key = pair_key(7, "conv-x", "What does Ann like?", "D1:2")
    assert oracle_score(True, key, model) == oracle_score(True, key, model)
    one, two = NoiseModel(seed=1), NoiseModel(seed=2)
    a = [oracle_score(True, pair_key(1, "c", "q", f"D1:{i}"), one) for i in range(50)]
    b = [oracle_score(True, pair_key(2, "c", "q", f"D1:{i}"), two) for i in range(50)]
    assert a != b
    assert all(0.0 <= s <= 1.0 for s in a + b)


def test_oracle_noise_model_rates() -> None:
    n = 5000
    flips = NoiseModel(miss=0.2, false=0.05, noise=0.0, seed=3)
    missed = sum(oracle_score(True, f"3|c|q{i}|D1:1", flips) < 0.5 for i in range(n)) / n
    false_pos = sum(oracle_score(False, f"3|c|q{i}|D1:2", flips) > 0.5 for i in range(n)) / n
    assert abs(missed - 0.2) < 0.03
    assert abs(false_pos - 0.05) < 0.015
    # Gaussian noise only: E[min(1, 1 + 0.1 Z)] = 1 - 0.1 * phi(0) = 0.9601.
    gauss = NoiseModel(miss=0.0, false=0.0, noise=0.1, seed=3)
    scores = [oracle_score(True, f"3|c|q{i}|D1:1", gauss) for i in range(n)]
    assert abs(statistics.fmean(scores) - 0.9601) < 0.01
    assert 0.35 < sum(s == 1.0 for s in scores) / n < 0.65  # half clipped at 1


def _conversation(
    sample_id: str, speaker: str, turns: list[str], questions: list[tuple[str, list[str]]]
) -> Conversation:
    stamp = parse_session_datetime("1:00 pm on 1 May, 2023")
    ts = [Turn(f"D1:{i}", 1, i, speaker, text, None, stamp) for i, text in enumerate(turns, 1)]
    qs = [Question(sample_id, i, q, 1, tuple(ev), tuple(ev)) for i, (q, ev) in enumerate(questions)]
    return Conversation(sample_id, speaker, "X", ts, qs)


def test_judge_identifies_the_pair_in_a_prompt() -> None:
    a = _conversation(
        "conv-a", "Ann",
        ["I painted a lake yesterday.", "What did Ann paint? I wonder.", "Ok."],
        [("What did Ann paint?", ["D1:1"]), ("What did Ann paint in May?", ["D1:3"]),
         ("Shared question text?", ["D1:1"])],
    )
    b = _conversation(
        "conv-b", "Ann",  # same speaker name: "Ann: Ok." exists in both conversations
        ["Ok.", "Something else entirely here."],
        [("Shared question text?", ["D1:2"])],
    )
    judge = OracleJudge([a, b], NoiseModel(miss=0.0, false=0.0, noise=0.0))
    lake = memory_text("Ann", "I painted a lake yesterday.")
    assert judge.reply(prompt("What did Ann paint?", lake)) == "1.000"
    assert judge.reply(prompt("What did Ann paint?", "Ann: Ok.")) == "0.000"
    # The longest question match wins over its prefix "What did Ann paint?".
    pair = judge.identify(prompt("What did Ann paint in May?", "Ann: Ok."))
    assert pair is not None and pair.question == "What did Ann paint in May?" and pair.relevant
    # A memory that quotes a question: the nested question match inside the memory is ignored.
    pair = judge.identify(prompt("Shared question text?", "Ann: What did Ann paint? I wonder."))
    assert pair is not None and pair.question == "Shared question text?"
    assert pair.dia_ids == ("D1:2",)
    # Same question text in two conversations: the memory's conversation decides.
    pair = judge.identify(prompt("Shared question text?", "Ann: Something else entirely here."))
    assert pair is not None and pair.sample_id == "conv-b" and pair.relevant
    # Both texts in both conversations: the active conversation decides.
    judge.set_active(["conv-b"])
    pair = judge.identify(prompt("Shared question text?", "Ann: Ok."))
    assert pair is not None and pair.sample_id == "conv-b" and pair.dia_ids == ("D1:1",)
    assert not pair.relevant
    # Unknown pairs score 0.
    assert judge.reply(prompt("Who is Carl?", "Ann: Ok.")) == "0"
    assert judge.reply("nothing known here") == "0"
    assert judge.stats()["unknown"] == 2


def test_judge_scores_a_question_with_another_conversations_turn_as_not_evidence() -> None:
    a = _conversation("conv-a", "Ann", ["I painted a lake yesterday."],
                      [("What did Ann paint?", ["D1:1"])])
    b = _conversation("conv-b", "Bob", ["I sold my boat."], [("What did Bob sell?", ["D1:1"])])
    judge = OracleJudge([a, b], NoiseModel(miss=0.0, false=0.0, noise=0.0))
    judge.set_active(["conv-a"])
    pair = judge.identify(prompt("What did Ann paint?", "Bob: I sold my boat."))
    assert pair is not None and pair.sample_id == "conv-a" and not pair.relevant
    assert pair.dia_ids == ("conv-b/D1:1",)
    assert judge.reply(prompt("What did Ann paint?", "Bob: I sold my boat.")) == "0.000"
    assert judge.stats()["unknown"] == 0


def test_judge_serves_chat_completions_on_loopback() -> None:
    conv = parse_conversation(synthetic_sample())
    model = NoiseModel(miss=0.0, false=0.0, noise=0.0)
    with start_judge("oracle", [conv], model) as judge:
        assert judge.service_settings()["scorer_base_url"] == judge.base_url
        body = {"model": "m", "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user",
             "content": USER.format(query="What does Ann like?", memory="Ann: I love lakes.")},
        ]}
        reply = httpx.post(f"{judge.base_url}/chat/completions", json=body, timeout=10).json()
        assert reply["choices"][0]["message"]["content"] == "1.000"
        assert judge.http_calls() == 1
    with start_judge("local", [conv]) as local:
        assert local.url is None and local.service_settings() == {"scorer": "local"}


# --- metrics ----------------------------------------------------------------------------------


def _rec(
    ranked: str, evidence: str, category: int = 4, stage: int = 0, sources: str = "",
    t: int = 0, calls: int = 0,
) -> QueryRecord:
    return QueryRecord(
        sample_id="c", qa_index=t, query_index=t, category=category,
        evidence=tuple(evidence.split()), ranked=tuple(ranked.split()),
        sources=tuple(sources.split()), stage=stage, budget=calls, scorer_calls=calls,
        total_ms=100.0 + t, score_ms=60.0,
    )


def test_metrics_on_hand_made_rankings() -> None:
    ranked = ["a", "b", "c", "d"]
    assert recall_at_k(ranked, ["b", "d", "z"], 2) == pytest.approx(1 / 3)
    assert recall_at_k(ranked, ["b", "d", "z"], 4) == pytest.approx(2 / 3)
    assert hit_at_k(ranked, ["d"], 3) == 0.0 and hit_at_k(ranked, ["d"], 4) == 1.0
    assert recall_at_k(ranked, [], 2) is None and hit_at_k(ranked, [], 2) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 95) == 5.0
    assert percentile([], 50) is None
    assert rolling_mean([1, 3, 5, 7], 2) == [1, 2, 4, 6]

    records = [
        _rec("a b c", "a", category=1, sources="observed estimated semantic", t=0, calls=3),
        _rec("a b c", "c x", category=4, stage=1, sources="estimated estimated observed", t=1,
             calls=1),
        _rec("a b c", "", category=3, stage=1, t=2),  # no evidence: skipped for recall
    ]
    q = quality(records, [1, 3])
    assert q["recall@1"] == pytest.approx(0.5) and q["recall@3"] == pytest.approx(0.75)
    assert q["hit@1"] == pytest.approx(0.5) and q["hit@3"] == 1.0
    assert q["n"] == 2 and q["skipped"] == 1
    assert estimated_share_at_k(records, 2) == pytest.approx(3 / 4)

    summary = summarize_policy(records, [1, 3])
    assert summary["scorer_calls"] == 4 and summary["budget_total"] == 4
    assert summary["by_category"]["4"]["recall@3"] == pytest.approx(0.5)
    assert summary["by_stage"]["1"]["n"] == 1 and summary["by_stage"]["1"]["first_query_index"] == 1
    assert summary["latency_ms"]["p50"] == pytest.approx(101.0)
    assert summary["latency_ms"]["p50_excl_scorer"] == pytest.approx(41.0)

    better = summarize_policy([_rec("a c b", "a", 1), _rec("c a b", "c x", 4)], [1, 3])
    rows = derived({"observed": better, "semantic": summary, "earm": better}, [1, 3])
    assert rows["observed_minus_semantic"]["recall@1"] == pytest.approx(0.75 - 0.5)
    assert rows["earm_minus_observed"]["recall@1"] == 0.0
    assert rows["earm_minus_semantic"]["by_category"]["4"]["recall@1"] == pytest.approx(0.5)
    assert "full_minus_earm" not in rows


def test_shift_summary_splits_segments_and_the_queries_after_each_shift() -> None:
    def rec(segment: int, position: int, hit: bool, calls: int) -> QueryRecord:
        base = _rec("a b", "a" if hit else "z", t=10 * segment + position, calls=calls)
        return dataclasses.replace(base, extra={"segment": segment, "position": position})

    records = [rec(0, 0, True, 5), rec(0, 1, True, 5),
               rec(1, 0, False, 3), rec(1, 1, True, 3), rec(1, 2, True, 1),
               rec(2, 0, False, 2), rec(2, 1, False, 2), rec(2, 2, True, 1)]
    summary = summarize_shift(records, [1], window=2)
    assert summary["segments"]["0"]["recall@1"] == 1.0
    assert summary["segments"]["1"]["scorer_calls"] == 7
    after = summary["after_shift"]  # positions 0 and 1 of segments 1 and 2
    assert after["n"] == 4 and after["recall@1"] == pytest.approx(0.25)
    assert after["scorer_calls"] == 10
    assert summary["settled"]["n"] == 2 and summary["settled"]["recall@1"] == 1.0


def test_score_cache_charges_only_pairs_no_earlier_asking_of_the_same_text_scored() -> None:
    def asked(text: str, ranked: str, sample_id: str = "c") -> QueryRecord:
        ids = tuple(ranked.split())
        return dataclasses.replace(_rec(ranked, "a", calls=len(ids)), text=text,
                                   sample_id=sample_id)

    records = [asked("q", "a b c"), asked("q", "a b"), asked("q", "c a d"),
               asked("q rephrased", "a b"), asked("q", "a b", sample_id="other")]
    cached = behind_exact_cache(records)
    assert [r.scorer_calls for r in cached] == [3, 0, 1, 2, 2]
    assert [r.reused for r in cached] == [0, 2, 2, 0, 0]
    assert [r.ranked for r in cached] == [r.ranked for r in records]


def test_cli_parser_registers_locomo() -> None:
    parser = argparse.ArgumentParser()
    add_locomo_parser(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(
        ["locomo", "--data", "/d", "--policies", "semantic,full", "--k", "20,10",
         "--judge-miss", "0.1", "--include-adversarial"]
    )
    assert args.func.__name__ == "run_locomo_command"
    assert args.policies == ("semantic", "full") and args.ks == (20, 10)
    assert args.judge == "oracle" and args.judge_miss == 0.1 and args.include_adversarial
    defaults = config_from_args(LocomoConfig, parser.parse_args(["locomo", "--data", "/d"]),
                                data_dir=Path("/d"))
    assert defaults.policies == ("semantic", "observed", "earm", "top-b", "full")
    args = parser.parse_args(["locomo", "--data", "/d", "--policies", "top-b",
                              "--database-server", "postgresql://h/postgres"])
    assert args.policies == ("top-b",) and args.database_server == "postgresql://h/postgres"
    via = config_from_args(LocomoConfig, parser.parse_args(["locomo", "--data", "/d", "--via",
                                                           "rerank"]), data_dir=Path("/d"))
    assert via.policies == ("semantic", "earm", "top-b", "full")
    assert via.judge_protocol == "rerank"
    with pytest.raises(ValueError):
        LocomoConfig(data_dir=Path("/d"), policies=("bogus",))
    with pytest.raises(ValueError, match="budget schedule"):
        LocomoConfig(data_dir=Path("/d"), schedule="5:0.5")
    with pytest.raises(ValueError, match="--database-server"):
        LocomoConfig(data_dir=Path("/d"), database_server="postgresql://h/postgres",
                     database_url="postgresql://h/earm")


# --- end to end -------------------------------------------------------------------------------


needs_locomo = pytest.mark.skipif(
    not LOCOMO_DIR.is_dir(),
    reason=f"LoCoMo data not found at {LOCOMO_DIR}: {LOCOMO_SOURCE}",
)


def top_b_budgets(schedule: str, k: int, candidates: Sequence[int]) -> list[int]:
    """top-b's B of each asking of a namespace, by query index: the schedule's budget for the
    asking's candidate count, never below k."""
    parsed = BudgetSchedule.parse(schedule)
    return [max(k, parsed.budget_for_query(t, n)) for t, n in enumerate(candidates)]


def test_locomo_replay_smoke(tmp_path: Path, postgres_server: str) -> None:
    n_questions, candidates, schedule = 15, 40, "0:1.0,5:0.5,10:0.25"
    config = LocomoConfig(
        data_dir=MINI_DIR,
        out=tmp_path / "RESULTS.json",
        plot=tmp_path / "plot.png",
        conversations=("conv-mini",),
        max_sessions=4,
        max_questions=n_questions,
        candidates=candidates,
        ks=(10,),
        schedule=schedule,
        judge_miss=0.0,
        judge_false=0.0,
        judge_noise=0.0,
        per_query=True,
        progress=False,
        database_server=postgres_server,
    )
    results = run_locomo(config)
    policies = results["policies"]
    assert list(policies) == ["semantic", "observed", "earm", "top-b", "full"]
    assert results["dataset"]["questions"] == n_questions
    for entry in policies.values():
        assert entry["queries"] == n_questions
        assert entry["degraded"] == 0
    assert policies["semantic"]["scorer_calls"] == 0
    assert policies["full"]["scorer_calls"] == n_questions * candidates
    for name in ("observed", "earm"):
        entry = policies[name]
        budgets = sum(row["budget"] for row in results["per_query"][name])
        assert entry["scorer_calls"] == budgets == entry["budget_total"]
        assert 0 < entry["scorer_calls"] < policies["full"]["scorer_calls"]
        assert entry["calls_vs_full"] < 1.0
    # top-b: full over the semantic top B of each query, B the schedule's (never below k).
    expected = top_b_budgets(schedule, 10, [candidates] * n_questions)
    assert expected == [40] * 5 + [20] * 5 + [10] * 5
    top_b_rows = results["per_query"]["top-b"]
    assert [r["t"] for r in top_b_rows] == list(range(n_questions))
    assert [r["scorer_calls"] for r in top_b_rows] == expected
    assert policies["top-b"]["scorer_calls"] == sum(expected)
    # A perfect judge: reranking more of the semantic order finds more of the evidence.
    recall = {name: entry["recall@10"] for name, entry in policies.items()}
    assert recall["semantic"] <= recall["top-b"] <= recall["full"]
    assert recall["full"] > recall["semantic"]
    assert results["derived"]["earm_minus_top-b"]["scorer_calls"] == (
        policies["earm"]["scorer_calls"] - policies["top-b"]["scorer_calls"]
    )
    assert results["settings"]["judge_model"]["stats"]["unknown"] == 0
    # earm's traces give its completion's prequential error; the other policies have none
    assert 0.0 <= policies["earm"]["prequential_error"] <= 1.0
    assert all(policies[name]["prequential_error"] is None for name in ("semantic", "full"))
    assert (tmp_path / "RESULTS.json").stat().st_size > 0
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    table = format_markdown(results)
    assert "| earm |" in table and "observed − semantic" in table
    assert f"| top-b | {pct(recall['top-b'])} |" in table and "| earm − top-b |" in table


def test_the_paper_profile_replays_the_papers_four_policies_and_prints_its_table(
    postgres_server: str,
) -> None:
    parser = argparse.ArgumentParser()
    add_locomo_parser(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["locomo", "--data", str(MINI_DIR), "--profile", "paper",
                              "--conversations", "conv-mini", "--limit", "8"])
    config = config_from_args(LocomoConfig, args, data_dir=MINI_DIR,
                              conversations=args.conversations)
    assert config.policies == ("semantic", "observed", "earm", "full")
    assert config.max_questions == 8
    config = dataclasses.replace(config, max_sessions=3, candidates=30, ks=(5, 10),
                                 schedule="0:1.0,3:0.5", per_query=True, progress=False,
                                 database_server=postgres_server)
    results = run_locomo(config)
    service = results["settings"]["service"]
    assert (service["profile"], service["anchor_policy"], service["completion_model"]) == (
        "paper", "paper", "plain")
    policies = results["policies"]
    # Observed-only scores the very anchors Mixed scores (the paper's rule draws them from the
    # seed, not from the completion) and differs only in how it ranks the rest.
    assert [r["scorer_calls"] for r in results["per_query"]["observed"]] == [
        r["scorer_calls"] for r in results["per_query"]["earm"]]
    table = format_markdown(results)
    assert "### The paper's table: recall@5 / recall@10 (%) per budget stage" in table
    stage_rows = [line for line in table.splitlines() if " scored (n=" in line]
    assert [row.split(" scored")[0] for row in stage_rows] == ["| 100.0%", "| 50.0%"]
    overall = next(line for line in table.splitlines() if line.startswith("| all |"))
    cells = [cell.strip() for cell in overall.strip("|").split("|")]
    recall = {name: policies[name]["recall@5"] for name in ("semantic", "observed", "earm")}
    assert cells[3].split(" / ")[0] == pct(recall["observed"])
    assert cells[5].split(" / ")[0] == pct(recall["observed"] - recall["semantic"], signed=True)
    assert cells[6].split(" / ")[0] == pct(recall["earm"] - recall["observed"], signed=True)
    assert cells[7] == " / ".join(f"{policies[name]['scorer_calls']:,}"
                                  for name in ("observed", "earm", "full"))


@pytest.mark.parametrize("errors", ["independent", "correlated", "crossencoder"])
def test_locomo_judge_gives_the_same_recall_through_chat_and_rerank(
    postgres_server: str, errors: str
) -> None:
    # The other error models replay earm alone, on fewer questions: the judge's scores are
    # under test, not a policy.
    policies = ("observed", "earm") if errors == "independent" else ("earm",)
    questions = 6 if errors == "independent" else 3

    def run(protocol: str) -> dict[str, Any]:
        return run_locomo(LocomoConfig(
            data_dir=MINI_DIR, conversations=("conv-mini",), max_sessions=2,
            max_questions=questions, candidates=30, ks=(5, 10), policies=policies,
            schedule="0:1.0,2:0.5",
            judge_protocol=protocol, judge_errors=errors, seed=7, per_query=True,
            progress=False, database_server=postgres_server,
        ))

    chat, rerank = run("chat"), run("rerank")
    assert rerank["settings"]["judge_model"]["protocol"] == "rerank"
    assert chat["settings"]["judge_model"]["errors"] == errors
    for policy in policies:
        chat_entry, rerank_entry = chat["policies"][policy], rerank["policies"][policy]
        for k in (5, 10):
            assert rerank_entry[f"recall@{k}"] == chat_entry[f"recall@{k}"]
        assert [r["recall@10"] for r in rerank["per_query"][policy]] == [
            r["recall@10"] for r in chat["per_query"][policy]
        ]
        assert rerank_entry["scorer_calls"] == chat_entry["scorer_calls"] > 0
        # The chat judge answers one request per pair, the reranker one per round of the anchor
        # rule: one, every anchor at once.
        assert chat_entry["scorer_requests"] == chat_entry["scorer_calls"]
        assert rerank_entry["scorer_requests"] == rerank_entry["queries"]
    assert rerank["settings"]["judge_model"]["stats"]["unknown"] == 0


def test_locomo_via_rerank_puts_earm_in_the_reranker_slot_of_a_client_with_its_own_search(
    postgres_server: str,
) -> None:
    """The client's own top N by cosine goes to earm's /v1/rerank (the judge behind it) and,
    for full and top-b, to the judge directly; every document earm forwards reaches the judge
    verbatim (no unknown pair)."""
    n_questions, candidates, schedule = 6, 20, "0:1.0,2:0.5,4:0.25"
    results = run_locomo(LocomoConfig(
        data_dir=MINI_DIR, conversations=("conv-mini",), max_sessions=2,
        max_questions=n_questions, candidates=candidates, ks=(5,), schedule=schedule,
        via="rerank", judge_miss=0.0, judge_false=0.0, judge_noise=0.0, per_query=True,
        progress=False, database_server=postgres_server,
    ))
    policies, rows = results["policies"], results["per_query"]
    assert list(policies) == ["semantic", "earm", "top-b", "full"]
    assert results["settings"]["judge_model"]["protocol"] == "rerank"
    assert all(entry["queries"] == n_questions for entry in policies.values())
    assert policies["semantic"]["scorer_calls"] == 0
    assert policies["full"]["scorer_calls"] == n_questions * candidates
    assert [r["scorer_calls"] for r in rows["top-b"]] == top_b_budgets(
        schedule, 5, [candidates] * n_questions
    )
    # earm forwards its schedule's budget of each call's documents (a fresh namespace: no reuse)
    assert [r["scorer_calls"] for r in rows["earm"]] == [r["budget"] for r in rows["earm"]]
    assert [r["budget"] for r in rows["earm"]] == [20, 20, 10, 10, 5, 5]
    assert policies["earm"]["degraded"] == 0
    recall = {name: entry["recall@5"] for name, entry in policies.items()}
    assert recall["semantic"] <= recall["full"] and recall["earm"] > recall["semantic"]
    assert results["settings"]["judge_model"]["stats"]["unknown"] == 0
    with pytest.raises(ValueError, match="--via rerank runs"):
        LocomoConfig(data_dir=LOCOMO_DIR, via="rerank", policies=("observed",))


def test_repeat_rounds_reask_every_question_half_verbatim_half_rephrased() -> None:
    conv = parse_conversation(synthetic_sample())
    config = LocomoConfig(data_dir=Path("."), repeat=3, seed=5)
    stream = askings(conv, config)
    questions = [q.question for q in conv.replay_questions(config.categories)]
    assert [a.text for a in stream[: len(questions)]] == questions
    assert {a.kind for a in stream[: len(questions)]} == {"plain"}
    for round_ in (1, 2, 3):
        this_round = [a for a in stream if a.round == round_]
        assert sorted(a.question.question for a in this_round) == sorted(questions)
        verbatim = [a for a in this_round if a.kind == "verbatim"]
        assert len(verbatim) == len(questions) // 2
        assert all(a.text == a.question.question for a in verbatim)
    rephrased = [a for a in stream if a.kind == "rephrased"]
    assert all(a.question.question in a.text != a.question.question for a in rephrased)
    # The same question keeps its kind across rounds and never repeats a rephrasing.
    by_question: dict[str, list[str]] = {}
    for a in rephrased:
        by_question.setdefault(a.question.question, []).append(a.text)
    assert all(len(set(texts)) == 3 for texts in by_question.values())
    assert askings(conv, config) == stream  # seeded
    assert askings(conv, LocomoConfig(data_dir=Path("."))) == stream[: len(questions)]


def test_locomo_repeat_smoke_reuses_for_earm_and_keeps_full_and_top_b_stateless(
    postgres_server: str,
) -> None:
    n_questions, candidates, repeat, schedule = 10, 40, 2, "0:1.0,5:0.5,10:0.25"
    config = LocomoConfig(
        data_dir=MINI_DIR,
        conversations=("conv-mini",),
        max_sessions=4,
        max_questions=n_questions,
        candidates=candidates,
        ks=(10,),
        policies=("earm", "top-b", "full"),
        schedule=schedule,
        judge_miss=0.0,
        judge_false=0.0,
        judge_noise=0.0,
        repeat=repeat,
        # One scorer request per asking (the chat judge answers one per pair, with the same
        # scores: test_locomo_judge_gives_the_same_recall_through_chat_and_rerank).
        judge_protocol="rerank",
        per_query=True,
        progress=False,
        database_server=postgres_server,
    )
    results = run_locomo(config)
    # The policy tables are the plain stream's.
    assert results["policies"]["full"]["queries"] == n_questions
    assert results["policies"]["full"]["scorer_calls"] == n_questions * candidates
    repeated = results["repeat"]
    assert list(repeated) == ["earm", "top-b", "top-b+cache", "full"]
    rounds = repeated["earm"]["rounds"]
    assert set(rounds) == {"0", "1", "2"} and set(rounds["0"]) == {"plain"}
    assert set(rounds["1"]) == set(rounds["2"]) == {"verbatim", "rephrased"}
    # full is stateless: every asking scores every candidate, nothing reused.
    full = repeated["full"]
    assert full["scorer_calls"] == (1 + repeat) * n_questions * candidates
    assert full["reused"] == 0
    # earm re-asks verbatim from experience: more reused each round, and cheaper than full.
    assert 0 < rounds["1"]["verbatim"]["reused"] < rounds["2"]["verbatim"]["reused"]
    assert rounds["1"]["rephrased"]["reused"] == 0
    assert repeated["earm"]["calls_vs_full"] < 1.0
    # top-b is stateless too: every asking, a verbatim re-ask included, pays its whole B.
    budgets = top_b_budgets(schedule, 10, [candidates] * (1 + repeat) * n_questions)
    top_b_rows = results["per_query"]["top-b"]
    assert [r["scorer_calls"] for r in top_b_rows] == budgets
    assert repeated["top-b"]["scorer_calls"] == sum(budgets) and repeated["top-b"]["reused"] == 0
    # Behind an exact-match cache a verbatim re-ask costs nothing, a rephrased one all its B,
    # and the ranking, hence recall, is top-b's.
    top_b, cached = repeated["top-b"]["rounds"], repeated["top-b+cache"]["rounds"]
    for round_ in ("1", "2"):
        assert top_b[round_]["verbatim"]["scorer_calls"] == 10 * n_questions // 2
        assert cached[round_]["verbatim"]["scorer_calls"] == 0
        assert cached[round_]["verbatim"]["reused"] == top_b[round_]["verbatim"]["scorer_calls"]
        assert cached[round_]["rephrased"]["scorer_calls"] == (
            top_b[round_]["rephrased"]["scorer_calls"]
        )
    for round_, kinds in top_b.items():
        for kind, entry in kinds.items():
            assert cached[round_][kind]["recall@10"] == entry["recall@10"]
    derived_rows = results["repeat_derived"]["earm_minus_top-b+cache"]
    assert derived_rows["1"]["verbatim"]["scorer_calls"] == rounds["1"]["verbatim"]["scorer_calls"]
    assert results["settings"]["judge_model"]["stats"]["unknown"] == 0
    table = format_markdown(results)
    assert "--repeat: per round and kind" in table
    assert "| top-b | 1 | verbatim |" in table and "| top-b+cache | 1 | verbatim |" in table
    assert "| earm − top-b+cache | 1 | rephrased |" in table


@needs_locomo
def test_locomo_shift_replays_conversations_into_one_namespace(postgres_server: str) -> None:
    per_conversation, candidates, schedule = 4, 30, "0:1.0,2:0.5,4:0.2"
    config = LocomoConfig(
        data_dir=LOCOMO_DIR,
        conversations=("conv-26", "conv-30"),
        max_sessions=2,
        max_questions=per_conversation,
        candidates=candidates,
        ks=(10,),
        policies=("semantic", "earm", "top-b"),
        schedule=schedule,
        shift=True,
        shift_window=2,
        judge_protocol="rerank",  # as in the repeat smoke: one scorer request per asking
        per_query=True,
        progress=False,
        database_server=postgres_server,
    )
    results = run_locomo(config)
    for policy in ("semantic", "earm", "top-b"):
        rows = results["per_query"][policy]
        # One namespace: the query index runs on across the conversations.
        assert [r["t"] for r in rows] == list(range(2 * per_conversation))
        assert [r["segment"] for r in rows] == [0] * per_conversation + [1] * per_conversation
        shift = results["shift"][policy]
        assert [s["sample_id"] for s in shift["segments"].values()] == ["conv-26", "conv-30"]
        assert shift["after_shift"]["queries"] == 2
        assert shift["after_shift"]["scorer_calls"] == sum(
            r["scorer_calls"] for r in rows if r["segment"] == 1 and r["position"] < 2
        )
    earm_rows = results["per_query"]["earm"]
    # The second conversation starts at stage 2 of the schedule: its first query scores 20%
    # of the candidates, which now include the first conversation's turns.
    assert earm_rows[per_conversation]["budget"] == 6
    # top-b's B follows the same schedule over the namespace's memories so far, never below k.
    turns = [results["dataset"]["per_conversation"][c]["turns"] for c in ("conv-26", "conv-30")]
    stored = [turns[0]] * per_conversation + [turns[0] + turns[1]] * per_conversation
    budgets = top_b_budgets(schedule, 10, [min(candidates, n) for n in stored])
    assert [r["scorer_calls"] for r in results["per_query"]["top-b"]] == budgets
    assert budgets[per_conversation] == 10  # 20% of 30 is 6, below k
    assert results["shift"]["top-b"]["segments"]["1"]["scorer_calls"] == sum(
        budgets[per_conversation:]
    )
    assert results["policies"]["semantic"]["recall@10"] > 0  # scoped evidence ids resolve
    assert results["settings"]["judge_model"]["stats"]["unknown"] == 0
    table = format_markdown(results)
    assert "after each shift" in table and "| top-b |" in table.split("### --shift")[1]


def test_estimated_share_counts_the_top_k_scored_by_the_completion_model() -> None:
    records = [_rec("a b c d", "a", sources="observed estimated estimated semantic")]
    assert estimated_share_at_k(records, 4) == pytest.approx(2 / 4)
    assert source_shares_at_k(records, 4)["semantic"] == pytest.approx(1 / 4)
