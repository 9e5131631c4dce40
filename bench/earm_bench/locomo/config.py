"""The configuration of ``earm bench locomo``: the CLI flags, as a dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from earm_bench.locomo.answers import Endpoint, Readers
from earm_bench.locomo.data import DEFAULT_CATEGORIES
from earm_bench.locomo.judge import YourScorer
from earm_bench.locomo.judge_errors import JUDGE_ERRORS
from service.budget import DEFAULT_BUDGET_SCHEDULE, BudgetSchedule

ADVERSARIAL = 5

#: The comparator a user would pick instead of earm: the service's ``full`` over the semantic
#: top B alone, B the budget earm's schedule gives that query, stateless (its own service, with
#: no reuse of earlier askings' cells). A policy of the bench, not of the service.
TOP_B = "top-b"

#: The policies of the replay (the service's and top-b) in the order the reports compare them:
#: from no scorer call to a scorer call for every candidate.
POLICIES: tuple[str, ...] = ("semantic", "observed", "earm", TOP_B, "full")

#: What ``--profile paper`` replays unless ``--policies`` says otherwise: the EARM paper's four
#: policies (Semantic, Observed-only, Mixed, Full).
PAPER_POLICIES: tuple[str, ...] = ("semantic", "observed", "earm", "full")

#: What ``--via rerank`` replays (earm_bench.locomo.via_rerank): the client's own first stage,
#: earm in a reranker's slot, and the judge called directly on all or the top B.
VIA_RERANK_POLICIES: tuple[str, ...] = ("semantic", "earm", TOP_B, "full")

#: Policies whose service never reuses an earlier asking's cells (EARM_REUSE_OBSERVATIONS=false):
#: every asking pays for what it ranks, as a peer's reranker does.
STATELESS_POLICIES = frozenset({TOP_B, "full"})


@dataclass
class LocomoConfig:
    """Everything a replay run depends on (the CLI flags, as a dataclass)."""

    data_dir: Path
    out: Path | None = None
    plot: Path | None = None
    policies: tuple[str, ...] = ()  # none given: POLICIES, or PAPER_POLICIES with the profile
    # The service's learning preset (EARM_PROFILE): "earm" (its defaults) or "paper"
    profile: str = "earm"
    ks: tuple[int, ...] = (10, 20)
    candidates: int = 200
    schedule: str | None = None  # None: the service's default schedule
    judge: str = "oracle"
    judge_protocol: str = "chat"
    judge_miss: float = 0.2
    judge_false: float = 0.05
    judge_noise: float = 0.1
    # how the oracle's scores err (earm_bench.locomo.judge_errors): independent, correlated or
    # crossencoder
    judge_errors: str = "independent"
    judge_port: int = 0
    # --judge scorer: the user's own scorer (its key and other settings: EARM_SCORER_* in the
    # environment, as the service reads them)
    scorer: str = "openai"
    scorer_url: str | None = None
    scorer_model: str = "gpt-4o-mini"
    seed: int = 0
    url: str | None = None
    include_adversarial: bool = False
    conversations: tuple[str, ...] | None = None
    max_questions: int | None = None  # per conversation, after the category filter
    max_sessions: int | None = None
    # After each conversation's stream, this many rounds re-ask its questions (shuffled; half
    # verbatim, half rephrased by a template).
    repeat: int = 0
    scorer_concurrency: int = 32
    database_url: str | None = None  # one database shared by every policy's service
    # A running Postgres (a URL of a database on it, with the right to create databases): each
    # policy's service gets a fresh database there instead of an embedded Postgres of its own.
    database_server: str | None = None
    request_timeout_s: float = 600.0
    rolling_window: int = 25
    per_query: bool = False
    # --shift: all conversations in one namespace, one after another (earm_bench.locomo.shift)
    shift: bool = False
    shift_window: int = 20  # the first queries of each later segment, reported "after shift"
    progress: bool | None = None  # None: show the bar when stderr is a terminal
    # "retrieve": the service searches and ranks (POST /retrieve); "rerank": the client searches
    # itself and earm reranks its candidates (POST /v1/rerank; earm_bench.locomo.via_rerank)
    via: str = "retrieve"
    # --reader-url: answer accuracy (earm_bench.locomo.answers) by a reader and a grader LLM,
    # OpenAI-compatible; their keys come from the environment, never the command line
    reader_url: str | None = None
    reader_model: str | None = None
    grader_url: str | None = None  # None: the reader's
    grader_model: str | None = None  # None: the reader's
    reader_concurrency: int = 8

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.profile not in ("earm", "paper"):
            raise ValueError("--profile must be 'earm' or 'paper'")
        if not self.policies:
            self.policies = PAPER_POLICIES if self.profile == "paper" else POLICIES
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError("--k needs positive integers")
        self.ks = tuple(sorted(set(self.ks)))
        if self.candidates < max(self.ks):
            raise ValueError("--candidates must be at least max(--k)")
        if self.judge not in ("oracle", "local", "scorer"):
            raise ValueError("--judge must be 'oracle', 'local' or 'scorer'")
        if (self.judge == "scorer") != (self.scorer_url is not None):
            raise ValueError("--judge scorer and --scorer-url go together")
        if self.scorer not in ("openai", "rerank", "tei"):
            raise ValueError("--scorer must be 'openai', 'rerank' or 'tei'")
        if self.repeat < 0:
            raise ValueError("--repeat must be 0 or more")
        if self.shift_window < 1:
            raise ValueError("--shift-window needs a positive integer")
        if self.shift and self.repeat:
            raise ValueError("--shift and --repeat are separate streams: choose one")
        if self.judge_errors not in JUDGE_ERRORS:
            raise ValueError(f"--judge-errors must be one of {', '.join(JUDGE_ERRORS)}")
        if self.judge_protocol not in ("chat", "rerank"):
            raise ValueError("--judge-protocol must be 'chat' or 'rerank'")
        if self.database_server and (self.database_url or self.url):
            raise ValueError("--database-server is for in-process services with a database "
                             "each: not with --database-url or --url")
        if self.via == "rerank":
            self._check_via_rerank()
        elif self.via != "retrieve":
            raise ValueError("--via must be 'retrieve' or 'rerank'")
        self._check_readers()
        _ = self.budget_schedule  # a bad --schedule fails here, before any service starts

    def _check_readers(self) -> None:
        if self.reader_url is None:
            if self.reader_model or self.grader_url or self.grader_model:
                raise ValueError("--reader-model, --grader-url and --grader-model go with "
                                 "--reader-url")
            return
        if not self.reader_model:
            raise ValueError("--reader-url needs --reader-model")
        if self.grader_url and not self.grader_model:
            raise ValueError("--grader-url needs --grader-model")
        if self.reader_concurrency < 1:
            raise ValueError("--reader-concurrency needs a positive integer")

    def readers(self, environ: Mapping[str, str]) -> Readers | None:
        """The reader and grader of ``--reader-url`` (None without it), their keys from
        ``environ``: ``EARM_BENCH_READER_API_KEY``, and ``EARM_BENCH_GRADER_API_KEY`` for a
        grader of its own (else the reader's)."""
        if self.reader_url is None or self.reader_model is None:
            return None
        reader = Endpoint(self.reader_url, self.reader_model,
                          environ.get("EARM_BENCH_READER_API_KEY"))
        grader_key = environ.get("EARM_BENCH_GRADER_API_KEY") or reader.api_key
        grader = Endpoint(self.grader_url or reader.url, self.grader_model or reader.model,
                          grader_key if self.grader_url else reader.api_key)
        return Readers(reader, grader, self.reader_concurrency)

    def _check_via_rerank(self) -> None:
        """``--via rerank``: the default policies become those it runs; the judge is the oracle
        over the rerank protocol (earm's upstream, and the client's for full and top-b)."""
        if self.policies == POLICIES:
            self.policies = VIA_RERANK_POLICIES
        unsupported = [p for p in self.policies if p not in VIA_RERANK_POLICIES]
        if unsupported:
            raise ValueError(f"--via rerank runs {', '.join(VIA_RERANK_POLICIES)}, "
                             f"not {', '.join(unsupported)}")
        if self.judge != "oracle":
            raise ValueError("--via rerank calls the oracle judge directly: not --judge local")
        if self.shift:
            raise ValueError("--via rerank replays each conversation on its own: not --shift")
        self.judge_protocol = "rerank"

    @property
    def your_scorer(self) -> YourScorer | None:
        """``--judge scorer``'s endpoint (None for the oracle and the local scorer)."""
        if self.scorer_url is None:
            return None
        return YourScorer(self.scorer, self.scorer_url, self.scorer_model)

    @cached_property
    def budget_schedule(self) -> BudgetSchedule:
        """The budget schedule: ``--schedule``, else the service's default. With ``--url`` the
        service's own may differ; top-b's budgets follow this one."""
        return BudgetSchedule.parse(self.schedule or DEFAULT_BUDGET_SCHEDULE)

    @property
    def shared_service(self) -> bool:
        """Whether the policies share one database (``--url``, ``--database-url``): each
        replays in namespaces of its own then, named with the run id."""
        return bool(self.url or self.database_url)

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
        out["database_server"] = "external" if self.database_server else None
        out["policies"] = list(self.policies)
        out["ks"] = list(self.ks)
        out["conversations"] = list(self.conversations) if self.conversations else None
        return out

