"""The plot of ``earm bench locomo``: rolling recall@K over the query stream, recall@K per
budget stage, cumulative scorer calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from earm_bench.locomo import metrics
from earm_bench.locomo.metrics import QueryRecord
from earm_bench.locomo.report import pct

COLORS = {"semantic": "#7f7f7f", "observed": "#1f77b4", "earm": "#d62728", "top-b": "#9467bd",
          "full": "#2ca02c"}
Records = dict[str, list[QueryRecord]]


@dataclass
class _Stages:
    """Stage boundaries (the first query index at which each stage was reported) and budgets
    (from a budgeted policy, earm or observed, when run, else any that scores)."""

    start: dict[int, int]
    budgets: dict[int, list[int]]
    budget_policy: str | None

    @classmethod
    def of(cls, records: Records) -> _Stages:
        start: dict[int, int] = {}
        for recs in records.values():
            for r in recs:
                start[r.stage] = min(start.get(r.stage, r.query_index), r.query_index)
        budget_policy = next((p for p in ("earm", "observed", "full") if p in records), None)
        budgets: dict[int, list[int]] = {}
        for r in records.get(budget_policy, []) if budget_policy else []:
            budgets.setdefault(r.stage, []).append(r.budget)
        return cls(start, budgets, budget_policy)

    def mean_budget(self, stage: int) -> str | None:
        budgets = self.budgets.get(stage)
        return f"B={sum(budgets) / len(budgets):.0f}" if budgets else None


def _rolling_recall(ax: Any, records: Records, policies: dict[str, Any], stages: _Stages,
                    k: int, window: int) -> None:
    for name, recs in records.items():
        series = metrics.per_query_recall_series(recs, k)
        if not series:
            continue
        xs = list(series)
        ys = metrics.rolling_mean([series[t] for t in xs], window)
        label = f"{name} ({pct(policies[name].get(f'recall@{k}'))}%)"
        ax.plot(xs, [100 * y for y in ys], label=label, color=COLORS.get(name), lw=1.8)
    for stage, start in sorted(stages.start.items()):
        if start > 0:
            ax.axvline(start, color="black", ls=":", lw=0.8, alpha=0.6)
        budget = stages.mean_budget(stage)
        text = f"stage {stage}" + (f", {budget}" if budget else "")
        ax.text(start + 0.8, 0.02, text, transform=ax.get_xaxis_transform(), rotation=90,
                va="bottom", ha="left", fontsize=8, alpha=0.8)
    ax.set_xlabel("query index t within a conversation (mean over the conversations reaching t)")
    ax.set_ylabel(f"evidence recall@{k} (%), rolling mean of {window}")
    ax.set_title(f"recall@{k} over the query stream (categories 1–4)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9, framealpha=0.85)


def _recall_per_stage(ax: Any, policies: dict[str, Any], stages: _Stages, k: int) -> None:
    numbers = sorted({int(s) for p in policies.values() for s in p.get("by_stage", {})})
    names = list(policies)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        by_stage = policies[name].get("by_stage", {})
        values = [100 * (by_stage.get(str(s), {}).get(f"recall@{k}") or 0.0) for s in numbers]
        ax.bar([s + (i - (len(names) - 1) / 2) * width for s in range(len(numbers))], values,
               width=width, label=name, color=COLORS.get(name))
    labels = [f"{s}\n{stages.mean_budget(s)}" if stages.mean_budget(s) else str(s)
              for s in numbers]
    ax.set_xticks(range(len(numbers)), labels)
    ax.set_xlabel(f"budget stage (mean budget B of {stages.budget_policy or '–'})")
    ax.set_ylabel(f"evidence recall@{k} (%)")
    ax.set_title(f"recall@{k} per budget stage")
    ax.set_ylim(0, 112)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(names), loc="upper center", framealpha=0.85)


def _scorer_calls(ax: Any, records: Records, policies: dict[str, Any]) -> None:
    for name, recs in records.items():
        per_t: dict[int, int] = {}
        for r in recs:
            per_t[r.query_index] = per_t.get(r.query_index, 0) + r.scorer_calls
        xs = sorted(per_t)
        ys = list(accumulate(per_t[t] for t in xs))
        share = policies[name].get("calls_vs_full")
        label = f"{name}: {policies[name]['scorer_calls']:,} calls" + (
            f" ({pct(share)}% of full)" if share is not None else ""
        )
        ax.plot(xs, ys, label=label, color=COLORS.get(name), lw=1.8)
    ax.set_xlabel("query index t within a conversation")
    ax.set_ylabel("cumulative scorer calls (all conversations)")
    ax.set_title("scorer calls")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")


def plot_results(records: Records, results: dict[str, Any], path: Path, ks: Sequence[int],
                 window: int = 25) -> None:
    """PNG: rolling recall@K vs query index, recall@K per budget stage, cumulative scorer calls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies: dict[str, Any] = results["policies"]
    stages = _Stages.of(records)
    fig, (ax_roll, ax_stage, ax_calls) = plt.subplots(
        1, 3, figsize=(18, 5.2), gridspec_kw={"width_ratios": [2.2, 1.3, 1.5]}
    )
    _rolling_recall(ax_roll, records, policies, stages, ks[0], window)
    _recall_per_stage(ax_stage, policies, stages, ks[0])
    _scorer_calls(ax_calls, records, policies)
    dataset, settings = results.get("dataset", {}), results.get("settings", {})
    fig.suptitle(
        f"LoCoMo replay: {', '.join(dataset.get('conversations', []))}; "
        f"{dataset.get('questions')} questions; N={settings.get('candidates')}; "
        f"judge={settings.get('judge')}",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
