"""``earm bench locomo``: replay LoCoMo through the real service and compare retrieval policies.

For each conversation file and each policy, in a fresh namespace (policies never share
experience), the runner ingests every dialogue turn as one memory and replays the
conversation's questions (categories 1–4, in file order; ``--include-adversarial`` adds
category 5, reported separately) through ``POST /retrieve`` with ``order="relevance"`` and
``k = max(--k)``. The service's relevance scorer is an oracle "LLM" on loopback that answers from
the evidence labels with a documented noise model (:mod:`service.bench.judge`), or the service's
local offline scorer (``--judge local``).

It reports evidence recall@K and hit@K per policy, overall and per category and budget stage,
scorer calls (absolute and relative to ``full``), the share of the top-K whose score was
estimated, and retrieve latency with and without scorer time; plus the derived rows of the
paper (observed − semantic: what direct scores add; earm − observed: what completion adds).

By default the service runs in-process on a loopback port over an embedded Postgres in a
temporary directory. With ``--url`` an already running service is used instead: the operator
must then point that service's scorer at the judge, i.e. start the benchmark with a fixed
``--judge-port P`` and the service with ``EARM_SCORER=openai
EARM_SCORER_BASE_URL=http://127.0.0.1:P/v1`` (the budget schedule is the service's own).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import httpx

from service.bench import metrics
from service.bench.judge import JudgeKind, NoiseModel, RunningJudge, start_judge
from service.bench.locomo import (
    CATEGORY_NAMES,
    DEFAULT_CATEGORIES,
    Conversation,
    Question,
    load_conversations,
)
from service.bench.metrics import QueryRecord

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("semantic", "observed", "earm", "full")
ADVERSARIAL = 5
INGEST_CHUNK = 500


@dataclass
class LocomoConfig:
    """Everything a replay run depends on (the CLI flags, as a dataclass)."""

    data_dir: Path
    out: Path | None = None
    plot: Path | None = None
    policies: tuple[str, ...] = POLICIES
    ks: tuple[int, ...] = (10, 20)
    candidates: int = 200
    schedule: str | None = None  # None: the service's default schedule
    judge: str = "oracle"
    judge_miss: float = 0.2
    judge_false: float = 0.05
    judge_noise: float = 0.1
    judge_port: int = 0
    seed: int = 0
    url: str | None = None
    include_adversarial: bool = False
    conversations: tuple[str, ...] | None = None
    max_questions: int | None = None  # per conversation, after the category filter
    max_sessions: int | None = None
    scorer_concurrency: int = 32
    database_url: str | None = None  # None: embedded Postgres in a temporary directory
    request_timeout_s: float = 600.0
    rolling_window: int = 25
    per_query: bool = False
    progress: bool | None = None  # None: show the bar when stderr is a terminal

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if not self.policies:
            raise ValueError("at least one policy is required")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError("--k needs positive integers")
        self.ks = tuple(sorted(set(self.ks)))
        if self.candidates < max(self.ks):
            raise ValueError("--candidates must be at least max(--k)")
        if self.judge not in ("oracle", "local"):
            raise ValueError("--judge must be 'oracle' or 'local'")

    @property
    def categories(self) -> tuple[int, ...]:
        """Categories in the replayed stream."""
        return DEFAULT_CATEGORIES + ((ADVERSARIAL,) if self.include_adversarial else ())

    def as_json(self) -> dict[str, Any]:
        """The settings block of RESULTS.json."""
        out = asdict(self)
        for key in ("data_dir", "out", "plot"):
            out[key] = None if out[key] is None else str(out[key])
        out["database_url"] = "external" if self.database_url else None
        out["policies"] = list(self.policies)
        out["ks"] = list(self.ks)
        out["conversations"] = list(self.conversations) if self.conversations else None
        return out


class ServiceError(RuntimeError):
    """The service answered with an error."""


# --- service plumbing -------------------------------------------------------------------------


@contextmanager
def _service(config: LocomoConfig, judge: RunningJudge) -> Iterator[tuple[str, dict[str, Any]]]:
    """The base URL of the service to use and a description of its settings."""
    if config.url:
        if config.schedule:
            logger.warning("--schedule is ignored with --url: the service's schedule applies")
        yield config.url.rstrip("/"), {"url": config.url, "external": True}
        return
    from service.bench.loopback import LoopbackServer
    from service.api.app import create_app
    from service.settings import DEFAULT_BUDGET_SCHEDULE, Settings

    with tempfile.TemporaryDirectory(prefix="earm-locomo-") as tmp:
        kwargs: dict[str, Any] = {
            "database_url": config.database_url,
            "data_dir": Path(tmp) / "pgdata",
            "embedder": "local",
            "scorer_concurrency": config.scorer_concurrency,
            "budget_schedule": config.schedule or DEFAULT_BUDGET_SCHEDULE,
            "max_candidates": max(config.candidates, 1000),
            "max_k": max(100, max(config.ks)),
            # Refits inside the request that makes them due: the replay is then exactly
            # reproducible (a background refit lands after a timing-dependent number of queries).
            "refit_in_background": False,
            **judge.service_settings(),
        }
        settings = Settings(**kwargs)
        described = settings.model_dump(
            mode="json",
            exclude={"scorer_api_key", "embedder_api_key", "data_dir", "database_url"},
        )
        described["external"] = False
        logger.info("starting the service (embedded Postgres in %s)", tmp)
        with LoopbackServer(create_app(settings)) as server:
            logger.info("service listening on %s", server.url)
            yield server.url, described


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.is_success:
        return response.json()
    try:
        err = response.json().get("error", {})
        detail = f"{err.get('code')}: {err.get('message')}"
    except (ValueError, AttributeError):
        detail = response.text[:500]
    raise ServiceError(f"{response.request.method} {response.request.url.path} -> "
                       f"{response.status_code} {detail}")


def ingest(client: httpx.Client, namespace: str, memories: Sequence[dict[str, Any]]) -> int:
    """Store memories in ``namespace`` in chunks; returns how many the service created."""
    created = 0
    for start in range(0, len(memories), INGEST_CHUNK):
        chunk = list(memories[start : start + INGEST_CHUNK])
        body = _check(client.post("/memories", json={"namespace": namespace, "memories": chunk}))
        created += int(body.get("created", 0))
    return created


def retrieve(
    client: httpx.Client,
    namespace: str,
    query: str,
    policy: str,
    k: int,
    candidates: int,
    seed: int,
) -> tuple[dict[str, Any], float]:
    """One ``POST /retrieve`` in relevance order; returns the body and the client-side ms."""
    body = {
        "namespace": namespace,
        "query": query,
        "k": k,
        "candidates": candidates,
        "policy": policy,
        "order": "relevance",
        "seed": seed,
    }
    started = time.perf_counter()
    response = client.post("/retrieve", json=body)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    return _check(response), elapsed_ms


def to_record(question: Question, reply: dict[str, Any], client_ms: float) -> QueryRecord:
    """A :class:`QueryRecord` from a question and the service's answer."""
    memories = sorted(reply.get("memories", []), key=lambda m: m.get("rank") or 1 << 30)
    timings = reply.get("timings") or {}
    return QueryRecord(
        sample_id=question.sample_id,
        qa_index=question.qa_index,
        query_index=int(reply.get("query_index", 0)),
        category=question.category,
        evidence=question.evidence,
        ranked=tuple(str(m.get("external_id")) for m in memories),
        sources=tuple(str(m.get("source")) for m in memories),
        stage=int(reply.get("stage") or 0),
        budget=int(reply.get("budget") or 0),
        scorer_calls=int(reply.get("scorer_calls") or 0),
        degraded=bool(reply.get("degraded")),
        total_ms=float(timings.get("total_ms") or 0.0),
        score_ms=float(timings.get("score_ms") or 0.0),
        client_ms=client_ms,
    )


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm import tqdm

    disable = None if enabled is None else not enabled  # None: only on a terminal
    return tqdm(total=total, unit="q", file=sys.stderr, disable=disable, dynamic_ncols=True,
                desc="locomo")


# --- the run ----------------------------------------------------------------------------------


def replay(
    config: LocomoConfig,
    base_url: str,
    conversations: Sequence[Conversation],
    judge: RunningJudge,
    run_id: str,
    policies: Sequence[str],
    bar: Any,
) -> dict[str, list[QueryRecord]]:
    """Replay every conversation under the given policies; records per policy."""
    k = max(config.ks)
    streams = {c.sample_id: _stream(c, config) for c in conversations}
    records: dict[str, list[QueryRecord]] = {p: [] for p in policies}
    with httpx.Client(base_url=base_url, timeout=config.request_timeout_s) as client:
        for conv in conversations:
            if judge.oracle is not None:
                judge.oracle.set_active([conv.sample_id])
            memories = conv.memories()
            for policy in policies:
                namespace = namespace_for(
                    conv.sample_id, policy, run_id if config.url or config.database_url else None
                )
                bar.set_postfix_str(f"{conv.sample_id} {policy} ingest")
                started = time.perf_counter()
                created = ingest(client, namespace, memories)
                logger.info("%s: ingested %d turns (%d new) in %.1f s", namespace, len(memories),
                            created, time.perf_counter() - started)
                bar.set_postfix_str(f"{conv.sample_id} {policy}")
                for question in streams[conv.sample_id]:
                    reply, client_ms = retrieve(
                        client, namespace, question.question, policy, k, config.candidates,
                        config.seed,
                    )
                    records[policy].append(to_record(question, reply, client_ms))
                    bar.update(1)
    return records


def namespace_for(sample_id: str, policy: str, run_id: str | None = None) -> str:
    """The namespace of one (conversation, policy) replay.

    In-process, every policy gets its own service and empty database, so the name is the same
    for all policies and carries no run id: the service derives anchors from (namespace, query
    index, seed), so ``observed`` and ``earm`` score the very same anchors and differ only in
    how they rank the rest (a paired comparison), and a run is reproducible. Against a shared
    service or database (``--url``, ``--database-url``) policy and run id keep every replay in
    a fresh namespace; the policies then sample different anchors.
    """
    if run_id is None:
        return f"locomo-{sample_id}"
    return f"locomo-{sample_id}-{policy}-{run_id}"


def _stream(conv: Conversation, config: LocomoConfig) -> list[Question]:
    questions = conv.replay_questions(config.categories)
    if config.max_questions is not None:
        questions = questions[: config.max_questions]
    return questions


def dataset_summary(conversations: Sequence[Conversation], config: LocomoConfig) -> dict[str, Any]:
    """The ``dataset`` block: conversations, questions per category, skipped questions."""
    per_category: dict[str, int] = {}
    skipped: dict[str, int] = {}
    per_conv: dict[str, Any] = {}
    for conv in conversations:
        stream = _stream(conv, config)
        per_conv[conv.sample_id] = {
            "turns": len(conv.turns),
            "questions": len(stream),
            "skipped_no_evidence": sum(1 for q in stream if not q.has_evidence),
        }
        for q in stream:
            per_category[str(q.category)] = per_category.get(str(q.category), 0) + 1
            if not q.has_evidence:
                skipped[str(q.category)] = skipped.get(str(q.category), 0) + 1
    main = sum(v for c, v in per_category.items() if int(c) in DEFAULT_CATEGORIES)
    return {
        "conversations": [c.sample_id for c in conversations],
        "per_conversation": per_conv,
        "turns": sum(len(c.turns) for c in conversations),
        "questions": main,
        "questions_per_category": dict(sorted(per_category.items())),
        "category_names": {str(c): n for c, n in CATEGORY_NAMES.items()},
        "skipped_no_evidence": sum(v for c, v in skipped.items() if int(c) in DEFAULT_CATEGORIES),
        "skipped_per_category": dict(sorted(skipped.items())),
    }


def build_results(
    config: LocomoConfig,
    records: dict[str, list[QueryRecord]],
    conversations: Sequence[Conversation],
) -> dict[str, Any]:
    """The RESULTS dict (without settings) from the replay records."""
    policies: dict[str, Any] = {}
    for policy, recs in records.items():
        policies[policy] = metrics.summarize_policy(recs, config.ks, DEFAULT_CATEGORIES)
    full_calls = policies["full"]["scorer_calls"] if "full" in policies else None
    for entry in policies.values():
        entry["calls_vs_full"] = (
            entry["scorer_calls"] / full_calls if full_calls else None
        )
    out: dict[str, Any] = {
        "dataset": dataset_summary(conversations, config),
        "policies": policies,
        "derived": metrics.derived(policies, config.ks),
    }
    if config.include_adversarial:
        out["adversarial"] = {
            policy: metrics.quality([r for r in recs if r.category == ADVERSARIAL], config.ks)
            for policy, recs in records.items()
        }
    if config.per_query:
        out["per_query"] = {
            policy: [
                {
                    "sample_id": r.sample_id,
                    "qa_index": r.qa_index,
                    "t": r.query_index,
                    "category": r.category,
                    "stage": r.stage,
                    "budget": r.budget,
                    "scorer_calls": r.scorer_calls,
                    **{
                        f"recall@{k}": metrics.recall_at_k(r.ranked, r.evidence, k)
                        for k in config.ks
                    },
                    "estimated@%d" % max(config.ks): sum(
                        1 for s in r.sources[: max(config.ks)] if s == "estimated"
                    ),
                }
                for r in recs
            ]
            for policy, recs in records.items()
        }
    return out


def run_locomo(config: LocomoConfig) -> dict[str, Any]:
    """Run the benchmark; returns the RESULTS dict (also written/plotted if configured)."""
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    conversations = load_conversations(
        config.data_dir, config.conversations, max_sessions=config.max_sessions
    )
    run_id = secrets.token_hex(3)
    noise = NoiseModel(
        miss=config.judge_miss, false=config.judge_false, noise=config.judge_noise, seed=config.seed
    )
    judge_kind = cast(JudgeKind, config.judge)
    total = sum(len(_stream(c, config)) for c in conversations) * len(config.policies)
    records: dict[str, list[QueryRecord]] = {}
    shared_service = bool(config.url or config.database_url)
    # One service (and empty database) per policy in-process, so policies never share
    # experience yet replay identical namespaces; one shared service otherwise.
    policy_groups = [config.policies] if shared_service else [(p,) for p in config.policies]
    with start_judge(judge_kind, conversations, noise, port=config.judge_port) as judge, _progress(
        total, config.progress
    ) as bar:
        for policies in policy_groups:
            with _service(config, judge) as (base_url, service_settings):
                records |= replay(config, base_url, conversations, judge, run_id, policies, bar)
        judge_block = judge.describe()
        if judge.oracle is not None:
            judge_block["stats"] = judge.oracle.stats()
    results = build_results(config, records, conversations)
    results = {
        "settings": {
            **config.as_json(),
            "run_id": run_id,
            "started_at": started_at,
            "duration_s": round(time.perf_counter() - started, 1),
            "judge_model": judge_block,
            "service": service_settings,
        },
        **results,
    }
    if judge.oracle is not None and judge.oracle.unknown:
        logger.warning("the oracle judge could not identify %d prompts (answered 0)",
                       judge.oracle.unknown)
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        logger.info("wrote %s", config.out)
    if config.plot is not None:
        plot_results(records, results, config.plot, config.ks, config.rolling_window)
        logger.info("wrote %s", config.plot)
    return results


# --- reporting --------------------------------------------------------------------------------


def _pct(value: Any, signed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{100.0 * value:+.1f}" if signed else f"{100.0 * value:.1f}"


def _ms(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "–"


def format_markdown(results: dict[str, Any]) -> str:
    """The markdown report printed on stdout: policies, categories, stages, derived rows."""
    settings = results.get("settings", {})
    dataset = results.get("dataset", {})
    policies: dict[str, Any] = results.get("policies", {})
    ks = settings.get("ks") or [10, 20]
    k0 = ks[0]
    judge = settings.get("judge_model", {})
    if judge.get("kind") == "oracle":
        judge_text = (f"oracle judge (miss {judge.get('miss')}, false {judge.get('false')}, "
                      f"noise {judge.get('noise')}, seed {judge.get('seed')})")
    else:
        judge_text = "local scorer"
    lines = [
        f"## LoCoMo replay: {len(dataset.get('conversations', []))} conversation(s) "
        f"({', '.join(dataset.get('conversations', []))}), {dataset.get('questions')} questions "
        f"of categories 1–4 ({dataset.get('skipped_no_evidence')} without resolvable evidence, "
        f"skipped for recall), N = {settings.get('candidates')} candidates, {judge_text}",
        "",
    ]
    head = ["policy"] + [f"{m}@{k}" for m in ("recall", "hit") for k in ks] + [
        "scorer calls", "% of full", f"estimated share@{k0}", "p50 ms", "p95 ms",
        "p50 ms excl. scorer", "degraded",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, p in policies.items():
        row = [name] + [_pct(p.get(f"{m}@{k}")) for m in ("recall", "hit") for k in ks]
        lat = p.get("latency_ms", {})
        row += [
            f"{p.get('scorer_calls', 0):,}",
            _pct(p.get("calls_vs_full")),
            _pct(p.get(f"estimated_share@{k0}")),
            _ms(lat.get("p50")),
            _ms(lat.get("p95")),
            _ms(lat.get("p50_excl_scorer")),
            str(p.get("degraded", 0)),
        ]
        lines.append("| " + " | ".join(row) + " |")

    cats = sorted({c for p in policies.values() for c in p.get("by_category", {})}, key=int)
    if cats:
        any_p = next(iter(policies.values()))
        cuts = [ks[0]] if len(ks) == 1 else [ks[0], ks[-1]]
        lines += ["", f"### {' / '.join(f'recall@{k}' for k in cuts)} per category (%)", ""]
        head = ["policy"] + [
            f"{c} {CATEGORY_NAMES.get(int(c), '')} "
            f"(n={any_p['by_category'].get(c, {}).get('n', 0)})"
            for c in cats
        ]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, p in policies.items():
            row = [name]
            for c in cats:
                entry = p.get("by_category", {}).get(c, {})
                row.append(" / ".join(_pct(entry.get(f"recall@{k}")) for k in cuts))
            lines.append("| " + " | ".join(row) + " |")

    stages = sorted({s for p in policies.values() for s in p.get("by_stage", {})}, key=int)
    if stages:
        lines += ["", f"### recall@{k0} per budget stage (%)", ""]
        ref = policies.get("earm") or policies.get("observed") or next(iter(policies.values()))
        head = ["policy"]
        for s in stages:
            entry = ref.get("by_stage", {}).get(s, {})
            budget = entry.get("budget_mean")
            budget_txt = f", budget {budget:.0f}" if isinstance(budget, (int, float)) else ""
            head.append(
                f"stage {s} (t ≥ {entry.get('first_query_index', '?')}{budget_txt}, "
                f"n={entry.get('n', 0)})"
            )
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, p in policies.items():
            row = [name] + [
                _pct(p.get("by_stage", {}).get(s, {}).get(f"recall@{k0}")) for s in stages
            ]
            lines.append("| " + " | ".join(row) + " |")

    derived = results.get("derived", {})
    if derived:
        lines += ["", "### derived rows (percentage points)", ""]
        names = [f"{m}@{k}" for m in ("recall", "hit") for k in ks]
        head = ["row"] + names + [f"recall@{k0} cat {c}" for c in cats]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, d in derived.items():
            row = [name.replace("_minus_", " − ")] + [_pct(d.get(n), signed=True) for n in names]
            row += [
                _pct(d.get("by_category", {}).get(c, {}).get(f"recall@{k0}"), signed=True)
                for c in cats
            ]
            lines.append("| " + " | ".join(row) + " |")

    adversarial = results.get("adversarial")
    if adversarial:
        lines += ["", "### category 5 (adversarial), reported separately (%)", ""]
        head = ["policy"] + [f"{m}@{k}" for m in ("recall", "hit") for k in ks] + ["n"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, a in adversarial.items():
            row = [name] + [_pct(a.get(f"{m}@{k}")) for m in ("recall", "hit") for k in ks]
            row.append(str(a.get("n")))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_results(
    records: dict[str, list[QueryRecord]],
    results: dict[str, Any],
    path: Path,
    ks: Sequence[int],
    window: int = 25,
) -> None:
    """PNG: rolling recall@K vs query index, recall@K per budget stage, cumulative scorer calls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = ks[0]
    colors = {"semantic": "#7f7f7f", "observed": "#1f77b4", "earm": "#d62728", "full": "#2ca02c"}
    policies: dict[str, Any] = results["policies"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2), gridspec_kw={"width_ratios": [2.2, 1.3, 1.5]})
    ax_roll, ax_stage, ax_calls = axes

    # Stage boundaries: the first query index at which each stage was reported.
    # Stage budgets: from a budgeted policy (earm/observed) when run, else any that scores.
    stage_start: dict[int, int] = {}
    stage_budget: dict[int, list[int]] = {}
    for recs in records.values():
        for r in recs:
            stage_start[r.stage] = min(stage_start.get(r.stage, r.query_index), r.query_index)
    budget_policy = next((p for p in ("earm", "observed", "full") if p in records), None)
    for r in records.get(budget_policy, []) if budget_policy else []:
        stage_budget.setdefault(r.stage, []).append(r.budget)

    for name, recs in records.items():
        series = metrics.per_query_recall_series(recs, k)
        if not series:
            continue
        xs = list(series)
        ys = metrics.rolling_mean([series[t] for t in xs], window)
        label = f"{name} ({_pct(policies[name].get(f'recall@{k}'))}%)"
        ax_roll.plot(xs, [100 * y for y in ys], label=label, color=colors.get(name), lw=1.8)
    for stage, start in sorted(stage_start.items()):
        if start > 0:
            ax_roll.axvline(start, color="black", ls=":", lw=0.8, alpha=0.6)
        budgets = stage_budget.get(stage)
        text = f"stage {stage}" + (f", B={sum(budgets) / len(budgets):.0f}" if budgets else "")
        ax_roll.text(start + 0.8, 0.02, text, transform=ax_roll.get_xaxis_transform(), rotation=90,
                     va="bottom", ha="left", fontsize=8, alpha=0.8)
    ax_roll.set_xlabel(
        "query index t within a conversation (mean over the conversations reaching t)"
    )
    ax_roll.set_ylabel(f"evidence recall@{k} (%), rolling mean of {window}")
    ax_roll.set_title(f"recall@{k} over the query stream (categories 1–4)")
    ax_roll.set_ylim(0, 100)
    ax_roll.grid(alpha=0.3)
    ax_roll.legend(loc="best", fontsize=9, framealpha=0.85)

    stages = sorted({int(s) for p in policies.values() for s in p.get("by_stage", {})})
    names = list(policies)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        by_stage = policies[name].get("by_stage", {})
        values = [100 * (by_stage.get(str(s), {}).get(f"recall@{k}") or 0.0) for s in stages]
        ax_stage.bar([s + (i - (len(names) - 1) / 2) * width for s in range(len(stages))], values,
                     width=width, label=name, color=colors.get(name))
    labels = []
    for s in stages:
        budgets = stage_budget.get(s)
        labels.append(f"{s}\nB={sum(budgets) / len(budgets):.0f}" if budgets else str(s))
    ax_stage.set_xticks(range(len(stages)), labels)
    ax_stage.set_xlabel(f"budget stage (mean budget B of {budget_policy or '–'})")
    ax_stage.set_ylabel(f"evidence recall@{k} (%)")
    ax_stage.set_title(f"recall@{k} per budget stage")
    ax_stage.set_ylim(0, 112)
    ax_stage.grid(axis="y", alpha=0.3)
    ax_stage.legend(fontsize=8, ncol=len(names), loc="upper center", framealpha=0.85)

    for name, recs in records.items():
        per_t: dict[int, int] = {}
        for r in recs:
            per_t[r.query_index] = per_t.get(r.query_index, 0) + r.scorer_calls
        cumulative = 0
        xs, ys = [], []
        for t in sorted(per_t):
            cumulative += per_t[t]
            xs.append(t)
            ys.append(cumulative)
        share = policies[name].get("calls_vs_full")
        label = f"{name}: {policies[name]['scorer_calls']:,} calls" + (
            f" ({_pct(share)}% of full)" if share is not None else ""
        )
        ax_calls.plot(xs, ys, label=label, color=colors.get(name), lw=1.8)
    ax_calls.set_xlabel("query index t within a conversation")
    ax_calls.set_ylabel("cumulative scorer calls (all conversations)")
    ax_calls.set_title("scorer calls")
    ax_calls.grid(alpha=0.3)
    ax_calls.legend(fontsize=9, loc="upper left")

    dataset = results.get("dataset", {})
    settings = results.get("settings", {})
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


# --- command line -----------------------------------------------------------------------------


def _csv(kind: type) -> Any:
    def parse(value: str) -> tuple[Any, ...]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        try:
            return tuple(kind(v) for v in items)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a probability in [0, 1]")
    return p


def add_locomo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``locomo`` sub-command (``earm bench locomo …``)."""
    parser = subparsers.add_parser(
        "locomo",
        help="LoCoMo replay: recall@K and scorer calls of semantic/observed/earm/full",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, type=Path,
                        help="directory of LoCoMo conversation files (<sample_id>.json)")
    parser.add_argument("--out", type=Path, default=None, help="write RESULTS.json here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.add_argument("--policies", type=_csv(str), default=POLICIES,
                        help="comma-separated subset of semantic,observed,earm,full (default all)")
    parser.add_argument("--k", dest="ks", type=_csv(int), default=(10, 20),
                        help="cut-offs K, comma-separated (default 10,20)")
    parser.add_argument("--candidates", type=int, default=200,
                        help="semantic candidates N per query (default 200)")
    parser.add_argument("--schedule", default=None,
                        help="budget schedule 't:ratio,…' (default: the service's, "
                             "0:1.0,5:0.5,15:0.3,30:0.175)")
    parser.add_argument("--judge", choices=("oracle", "local"), default="oracle",
                        help="oracle: labels + noise over loopback chat-completions; "
                             "local: the service's offline scorer")
    parser.add_argument("--judge-miss", type=_probability, default=0.2,
                        help="oracle: probability an evidence turn is missed (default 0.2)")
    parser.add_argument("--judge-false", type=_probability, default=0.05,
                        help="oracle: probability of a false positive (default 0.05)")
    parser.add_argument("--judge-noise", type=float, default=0.1,
                        help="oracle: std of the Gaussian score noise (default 0.1)")
    parser.add_argument("--judge-port", type=int, default=0,
                        help="oracle: fixed loopback port (for --url setups; default: any free)")
    parser.add_argument("--seed", type=int, default=0, help="judge noise and anchor sampling seed")
    parser.add_argument("--url", default=None,
                        help="use a running service instead of starting one; point its scorer "
                             "at the judge (EARM_SCORER=openai "
                             "EARM_SCORER_BASE_URL=http://127.0.0.1:<--judge-port>/v1)")
    parser.add_argument("--include-adversarial", action="store_true",
                        help="add category 5 to the query stream (reported separately)")
    parser.add_argument("--conversations", type=_csv(str), default=None,
                        help="only these sample ids, e.g. conv-26,conv-30 (default: all files)")
    parser.add_argument("--max-questions", type=int, default=None,
                        help="replay at most this many questions per conversation")
    parser.add_argument("--max-sessions", type=int, default=None,
                        help="ingest only the first sessions (keeps questions whose evidence "
                             "lies inside them)")
    parser.add_argument("--scorer-concurrency", type=int, default=32,
                        help="the in-process service's scorer concurrency (default 32)")
    parser.add_argument("--database-url", default=None,
                        help="Postgres for the in-process service (default: embedded, temporary)")
    parser.add_argument("--window", dest="rolling_window", type=int, default=25,
                        help="rolling-mean window of the plot (default 25)")
    parser.add_argument("--per-query", action="store_true",
                        help="also store per-query rows (ids and numbers only) in RESULTS.json")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                        default=None, help="hide the progress bar")
    parser.set_defaults(func=run_locomo_command)
    return parser


def config_from_args(args: argparse.Namespace) -> LocomoConfig:
    """A :class:`LocomoConfig` from parsed CLI arguments."""
    return LocomoConfig(
        data_dir=args.data,
        out=args.out,
        plot=args.plot,
        policies=tuple(args.policies),
        ks=tuple(args.ks),
        candidates=args.candidates,
        schedule=args.schedule,
        judge=args.judge,
        judge_miss=args.judge_miss,
        judge_false=args.judge_false,
        judge_noise=args.judge_noise,
        judge_port=args.judge_port,
        seed=args.seed,
        url=args.url,
        include_adversarial=args.include_adversarial,
        conversations=tuple(args.conversations) if args.conversations else None,
        max_questions=args.max_questions,
        max_sessions=args.max_sessions,
        scorer_concurrency=args.scorer_concurrency,
        database_url=args.database_url,
        rolling_window=args.rolling_window,
        per_query=args.per_query,
        progress=args.progress,
    )


def run_locomo_command(args: argparse.Namespace) -> int:
    """Entry point of ``earm bench locomo``: run, write outputs, print the markdown table."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    if config.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # Say so before a run of many minutes, not after it.
        logger.error("--plot needs matplotlib: pip install -e '.[bench]'")
        return 2
    # One INFO line per HTTP request (hundreds of thousands of scorer calls) drowns the run.
    for noisy in ("httpx", "httpcore", "earm.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger(noisy).level))
    results = run_locomo(config)
    sys.stdout.write(format_markdown(results))
    sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m service.bench.run_locomo --data DIR …``."""
    parser = argparse.ArgumentParser(prog="python -m service.bench.run_locomo")
    sub = parser.add_subparsers(dest="bench", required=True)
    add_locomo_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "locomo":
        argv = ["locomo", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
