"""The markdown report of ``earm bench locomo``: policies, categories, stages, derived rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from earm_bench.common.markdown import table
from earm_bench.locomo.data import CATEGORY_NAMES

Policies = dict[str, Any]


def pct(value: Any, signed: bool = False) -> str:
    """A share as a percentage with one decimal; a dash when there is none."""
    if not isinstance(value, (int, float)):
        return "–"
    return f"{100.0 * value:+.1f}" if signed else f"{100.0 * value:.1f}"


def _ms(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "–"


def _error(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}"


def _calls(value: Any, signed: bool = False) -> str:
    if not isinstance(value, int):
        return "–"
    return f"{value:+,}" if signed else f"{value:,}"


def _row_name(name: str) -> str:
    return name.replace("_minus_", " − ")


def _quality_names(ks: Sequence[int]) -> list[str]:
    return [f"{m}@{k}" for m in ("recall", "hit") for k in ks]


def _title(results: dict[str, Any]) -> str:
    settings, dataset = results.get("settings", {}), results.get("dataset", {})
    judge = settings.get("judge_model", {})
    if judge.get("kind") == "oracle":
        judge_text = (f"oracle judge ({judge.get('errors', 'independent')} errors, miss "
                      f"{judge.get('miss')}, false {judge.get('false')}, "
                      f"noise {judge.get('noise')}, seed {judge.get('seed')})")
    elif judge.get("kind") == "scorer":
        judge_text = (f"your scorer ({judge.get('scorer')} at {judge.get('url')}, "
                      f"model {judge.get('model')})")
    else:
        judge_text = "local scorer"
    return (
        f"## LoCoMo replay: {len(dataset.get('conversations', []))} conversation(s) "
        f"({', '.join(dataset.get('conversations', []))}), {dataset.get('questions')} questions "
        f"of categories 1–4 ({dataset.get('skipped_no_evidence')} without resolvable evidence, "
        f"skipped for recall), N = {settings.get('candidates')} candidates, {judge_text}"
    )


def _policy_row(name: str, p: dict[str, Any], ks: Sequence[int]) -> list[str]:
    latency = p.get("latency_ms", {})
    return [name, *(pct(p.get(n)) for n in _quality_names(ks)),
            _calls(p.get("scorer_calls", 0)), pct(p.get("calls_vs_full")),
            pct(p.get(f"estimated_share@{ks[0]}")), _ms(latency.get("p50")),
            _ms(latency.get("p95")), _ms(latency.get("p50_excl_scorer")),
            str(p.get("degraded", 0)), _error(p.get("prequential_error"))]


def _summary(policies: Policies, ks: Sequence[int]) -> list[str]:
    head = ["policy", *_quality_names(ks), "scorer calls", "% of full",
            f"estimated share@{ks[0]}", "p50 ms", "p95 ms", "p50 ms excl. scorer", "degraded",
            "prequential error"]
    return table(head, (_policy_row(name, p, ks) for name, p in policies.items()))


def _by_category(policies: Policies, ks: Sequence[int], cats: list[str]) -> list[str]:
    if not cats:
        return []
    any_policy = next(iter(policies.values()))
    cuts = [ks[0]] if len(ks) == 1 else [ks[0], ks[-1]]
    head = ["policy"] + [
        f"{c} {CATEGORY_NAMES.get(int(c), '')} "
        f"(n={any_policy['by_category'].get(c, {}).get('n', 0)})"
        for c in cats
    ]
    rows = [
        [name] + [
            " / ".join(pct(p.get("by_category", {}).get(c, {}).get(f"recall@{k}")) for k in cuts)
            for c in cats
        ]
        for name, p in policies.items()
    ]
    return ["", f"### {' / '.join(f'recall@{k}' for k in cuts)} per category (%)", "",
            *table(head, rows)]


def _stage_heading(stage: str, entry: dict[str, Any]) -> str:
    budget = entry.get("budget_mean")
    budget_txt = f", budget {budget:.0f}" if isinstance(budget, (int, float)) else ""
    return f"stage {stage} (t ≥ {entry.get('first_query_index', '?')}{budget_txt}, " \
           f"n={entry.get('n', 0)})"


def _by_stage(policies: Policies, k0: int) -> list[str]:
    stages = sorted({s for p in policies.values() for s in p.get("by_stage", {})}, key=int)
    if not stages:
        return []
    ref = policies.get("earm") or policies.get("observed") or next(iter(policies.values()))
    head = ["policy"] + [_stage_heading(s, ref.get("by_stage", {}).get(s, {})) for s in stages]
    rows = [
        [name] + [pct(p.get("by_stage", {}).get(s, {}).get(f"recall@{k0}")) for s in stages]
        for name, p in policies.items()
    ]
    return ["", f"### recall@{k0} per budget stage (%)", "", *table(head, rows)]


#: The paper's table: its policy names, in its column order, for the bench's policies.
PAPER_COLUMNS = (("semantic", "Semantic"), ("full", "Full"), ("observed", "Observed-only"),
                 ("earm", "Mixed"))


def _paper_table(policies: Policies, ks: Sequence[int], candidates: int) -> list[str]:
    """``--profile paper``: the EARM paper's table, per budget stage (its share of the
    candidates scored) and overall, recall at each K with scorer calls, and its two ablations
    (Observed-only − Semantic, Mixed − Observed-only)."""
    if not all(name in policies for name, _ in PAPER_COLUMNS):
        return []
    stages = sorted(policies["earm"].get("by_stage", {}), key=int)
    head = ["stage", *(title for _, title in PAPER_COLUMNS), "Observed-only − Semantic",
            "Mixed − Observed-only", "calls: Observed-only / Mixed / Full"]

    def row(label: str, entries: dict[str, dict[str, Any]]) -> list[str]:
        def recall(name: str) -> list[float | None]:
            return [entries[name].get(f"recall@{k}") for k in ks]

        def cell(values: Sequence[float | None], signed: bool = False) -> str:
            return " / ".join(pct(v, signed) for v in values)

        def minus(a: str, b: str) -> list[float | None]:
            return [x - y if x is not None and y is not None else None
                    for x, y in zip(recall(a), recall(b), strict=True)]

        calls = " / ".join(_calls(entries[name].get("scorer_calls"))
                           for name in ("observed", "earm", "full"))
        return [label, *(cell(recall(name)) for name, _ in PAPER_COLUMNS),
                cell(minus("observed", "semantic"), signed=True),
                cell(minus("earm", "observed"), signed=True), calls]

    rows = []
    for stage in stages:
        entries = {name: policies[name].get("by_stage", {}).get(stage, {})
                   for name, _ in PAPER_COLUMNS}
        budget = entries["earm"].get("budget_mean")
        share = f"{100 * budget / candidates:.1f}%" if isinstance(budget, (int, float)) else "?"
        rows.append(row(f"{share} scored (n={entries['earm'].get('n', 0)})", entries))
    rows.append(row("all", {name: policies[name] for name, _ in PAPER_COLUMNS}))
    cuts = " / ".join(f"recall@{k}" for k in ks)
    return ["", f"### The paper's table: {cuts} (%) per budget stage", "", *table(head, rows)]


def _derived(derived: dict[str, Any], ks: Sequence[int], cats: list[str]) -> list[str]:
    if not derived:
        return []
    names, k0 = _quality_names(ks), ks[0]
    head = ["row", *names, *(f"recall@{k0} cat {c}" for c in cats), "scorer calls"]
    rows = [
        [_row_name(name), *(pct(d.get(n), signed=True) for n in names),
         *(pct(d.get("by_category", {}).get(c, {}).get(f"recall@{k0}"), signed=True)
           for c in cats),
         _calls(d.get("scorer_calls"), signed=True)]
        for name, d in derived.items()
    ]
    return ["", "### derived rows (percentage points; scorer calls: the difference)", "",
            *table(head, rows)]


def _adversarial(adversarial: dict[str, Any] | None, ks: Sequence[int]) -> list[str]:
    if not adversarial:
        return []
    names = _quality_names(ks)
    rows = [[name, *(pct(a.get(n)) for n in names), str(a.get("n"))]
            for name, a in adversarial.items()]
    return ["", "### category 5 (adversarial), reported separately (%)", "",
            *table(["policy", *names, "n"], rows)]


def _repeat(repeat: dict[str, Any] | None, ks: Sequence[int]) -> list[str]:
    if not repeat:
        return []
    k0 = ks[0]
    head = ["policy", "round", "kind", "n", *(f"recall@{k}" for k in ks),
            f"recall@{k0} % of full", "scorer calls", "reused"]
    rows = [
        [policy, round_, kind, str(q.get("n")), *(pct(q.get(f"recall@{k}")) for k in ks),
         pct((entry.get("recall_vs_full") or {}).get(round_, {}).get(kind, {})
              .get(f"recall@{k0}")),
         _calls(q.get("scorer_calls", 0)), _calls(q.get("reused", 0))]
        for policy, entry in repeat.items()
        for round_, kinds in entry["rounds"].items()
        for kind, q in kinds.items()
    ]
    totals = [[policy, _calls(entry["scorer_calls"]), pct(entry.get("calls_vs_full")),
               _calls(entry["reused"]), _error(entry.get("prequential_error"))]
              for policy, entry in repeat.items()]
    return ["", "### --repeat: per round and kind of asking (round 0 = the plain stream, %)", "",
            *table(head, rows), "", "whole stream, all rounds:", "",
            *table(["policy", "scorer calls", "% of full", "reused cells", "prequential error"],
                   totals)]


def _repeat_derived(derived: dict[str, Any] | None, ks: Sequence[int]) -> list[str]:
    if not derived:
        return []
    head = ["row", "round", "kind", *(f"recall@{k}" for k in ks), "scorer calls"]
    rows = [
        [_row_name(name), round_, kind, *(pct(d.get(f"recall@{k}"), signed=True) for k in ks),
         _calls(d.get("scorer_calls"), signed=True)]
        for name, rounds in derived.items()
        for round_, kinds in rounds.items()
        for kind, d in kinds.items()
    ]
    return ["", "### --repeat: derived rows per round and kind (percentage points; scorer "
            "calls: the difference)", "", *table(head, rows)]


def _shift(shift: dict[str, Any] | None, ks: Sequence[int]) -> list[str]:
    if not shift:
        return []
    k0, window = ks[0], next(iter(shift.values())).get("window")
    segments = sorted({s for p in shift.values() for s in p.get("segments", {})}, key=int)

    def cell(entry: dict[str, Any]) -> str:
        return f"{pct(entry.get(f'recall@{k0}'))} ({_calls(entry.get('scorer_calls', 0))})"

    first = next(iter(shift.values()))["segments"]
    head = ["policy", *(f"segment {s} {first.get(s, {}).get('sample_id', '')} "
                        f"(n={first.get(s, {}).get('n', 0)})" for s in segments),
            f"first {window} after each shift", "rest of later segments"]
    rows = [[name, *(cell(p["segments"].get(s, {})) for s in segments),
             cell(p.get("after_shift", {})), cell(p.get("settled", {}))]
            for name, p in shift.items()]
    return ["", f"### --shift: recall@{k0} (%) and (scorer calls) per segment", "",
            *table(head, rows)]


def _tokens(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "–"
    return (f"{usage.get('calls', 0):,} calls, {usage.get('prompt_tokens', 0):,} prompt + "
            f"{usage.get('completion_tokens', 0):,} completion tokens")


def _answers(answers: dict[str, Any] | None, ks: Sequence[int]) -> list[str]:
    if not answers:
        return []
    if "error" in answers:
        return ["", f"### Answer accuracy: stopped ({answers['error']})"]
    policies: dict[str, Any] = answers.get("policies", {})
    cats = sorted({c for p in policies.values() for a in p.values()
                   for c in a.get("by_category", {})}, key=int)
    head = ["policy", *(f"accuracy@{k}" for k in ks),
            *(f"{c} {CATEGORY_NAMES.get(int(c), '')} @{ks[0]}" for c in cats),
            "graded", "failed", "unparsed"]
    rows = []
    for name, p in policies.items():
        first = p.get(f"accuracy@{ks[0]}", {})
        by_category = first.get("by_category", {})
        rows.append([name, *(pct(p.get(f"accuracy@{k}", {}).get("accuracy")) for k in ks),
                     *(pct(by_category.get(c, {}).get("accuracy")) for c in cats),
                     sum(p[f"accuracy@{k}"].get("graded", 0) for k in ks),
                     sum(p[f"accuracy@{k}"].get("failed", 0) for k in ks),
                     sum(p[f"accuracy@{k}"].get("unparsed", 0) for k in ks)])
    reader, grader = answers.get("reader", {}), answers.get("grader", {})
    return ["", f"### Answer accuracy (%): reader {reader.get('model')}, grader "
                f"{grader.get('model')}", "", *table(head, rows), "",
            f"Reader: {_tokens(answers.get('reader_usage'))}. "
            f"Grader: {_tokens(answers.get('grader_usage'))}."]


def format_markdown(results: dict[str, Any]) -> str:
    """The markdown report printed on stdout: policies, categories, stages, derived rows."""
    policies: Policies = results.get("policies", {})
    ks = results.get("settings", {}).get("ks") or [10, 20]
    cats = sorted({c for p in policies.values() for c in p.get("by_category", {})}, key=int)
    settings = results.get("settings", {})
    paper = (
        _paper_table(policies, ks, settings.get("candidates") or 200)
        if settings.get("profile") == "paper" else []
    )
    lines = [
        _title(results),
        "",
        *_summary(policies, ks),
        *_by_category(policies, ks, cats),
        *_by_stage(policies, ks[0]),
        *paper,
        *_derived(results.get("derived", {}), ks, cats),
        *_adversarial(results.get("adversarial"), ks),
        *_repeat(results.get("repeat"), ks),
        *_repeat_derived(results.get("repeat_derived"), ks),
        *_shift(results.get("shift"), ks),
        *_answers(results.get("answers"), ks),
    ]
    return "\n".join(lines) + "\n"
