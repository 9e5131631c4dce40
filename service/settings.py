"""All of earm's configuration, read from ``EARM_*`` environment variables (or a ``.env`` file).

One typed object, flat as the environment it is read from (the ``EARM_*`` names are the public
interface, and the checks that involve several settings stay in one place); the app factory
receives it and hands each component its group (``settings.scoring``, ``settings.database``,
... : ``service.settings_groups``), so nothing else reads the environment and tests build their
own ``Settings(...)`` instead of patching globals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.budget import DEFAULT_BUDGET_SCHEDULE, BudgetSchedule
from service.checks import BASE_URL_EXAMPLES, missing_base_url, namespace_name
from service.settings_groups import (
    AnchorSettings,
    AuthSettings,
    CompletionSettings,
    DatabaseSettings,
    EmbedderSettings,
    IndexingSettings,
    IntegrationSettings,
    LearningSettings,
    LimitSettings,
    ObservabilitySettings,
    RetrievalSettings,
    ScorerSettings,
    SearchSettings,
    ServingSettings,
)

#: The largest rank r of the completion model (EARM_RANK).
MAX_RANK = 64


#: What ``EARM_PROFILE=paper`` sets unless set explicitly: the EARM paper's one round of
#: anchors, its plain model, its balanced weights (the memory side weighted as the query side,
#: factors included, so they are not shrunk to nothing), and no transfer between paraphrases.
PAPER_PROFILE = {
    "anchor_policy": "paper", "completion_model": "plain", "memory_reg": 1.0, "factor_reg": 1.0,
    "paraphrase_transfer": False,
}


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("earm")) / "pgdata"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EARM_", env_file=".env", extra="ignore")

    # --- database -------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL of a Postgres with pgvector. Unset: embedded Postgres.",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Data directory of the embedded Postgres (persists across restarts).",
    )
    database_replica_urls: str = Field(
        default="",
        description="Comma-separated URLs of streaming replicas of the database that serve "
        "listings, traces, stats, the dashboard and semantic searches. Empty: none.",
    )
    replica_max_wait_ms: int = Field(
        default=50,
        ge=0,
        le=10_000,
        description="How long a replica read waits for the replica to replay this process's "
        "last commit of the namespace before it reads from the primary instead.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_lock_timeout_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="The longest a request waits for a lock (a namespace's row, which its "
        "writers take in turn) before it is answered 503 namespace_busy; 0: no bound. Set on "
        "each connection of the serving pool (refits wait as long as they need).",
    )
    db_prepared_statements: bool = Field(
        default=True,
        description="Let psycopg prepare a statement on a connection from its 5th execution "
        "there. False behind a transaction-pooling pooler that does not track prepared "
        "statements (PgBouncer before 1.21, or without max_prepared_statements): the next "
        "transaction may run on a server connection that lacks the statement.",
    )
    index_batch_size: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="Memories the background indexer moves into the HNSW index per transaction "
        "(about 300 per second at 100k memories on 2 cores).",
    )
    max_unindexed: int = Field(
        default=0,
        ge=0,
        description="Back-pressure on the indexer's backlog: an ingest that would add memories "
        "to a namespace with this many or more memories not in the HNSW index yet is refused "
        "(503 indexing_backlog, Retry-After), so its searches do not slow down without bound. "
        "A soft limit: concurrent ingests may each pass the check. 0: no limit.",
    )
    exact_scan_below: int = Field(default=20_000, ge=0, description="A namespace with fewer "
        "memories is searched by an exact scan of its rows, not the shared HNSW index. 0: never.")
    exact_scan_below_filtered: int = Field(default=50_000, ge=0, description="The same for a "
        "search with metadata filters, where the shared index misses some of the top-N.")
    index_poll_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often the background indexer looks for memories another process "
        "ingested (its own ingests wake it at once), and its wait after a database error.",
    )
    embedded_watch_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the service checks that its embedded Postgres is alive (it "
        "restarts it when it died).",
    )
    embedded_restart_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Attempts to restart a dead embedded Postgres before giving up (logged; "
        "requests then answer 503 until earm is restarted).",
    )
    embedded_restart_backoff_s: float = Field(
        default=1.0,
        gt=0,
        description="Wait after the first failed restart attempt, doubled after each further one.",
    )

    # --- embedder -------------------------------------------------------------------------
    embedding_dim: int = Field(default=384, ge=1, le=16000)
    embedder: Literal["local", "openai", "none"] = "local"
    # Checked with the provider it serves (validate_default): an HTTP provider needs one.
    embedder_base_url: str | None = Field(default=None, validate_default=True)
    embedder_model: str = "text-embedding-3-small"
    embedder_api_key: SecretStr | None = None
    embedder_timeout_s: float = Field(default=30.0, gt=0)
    embedder_batch_size: int = Field(default=64, ge=1, le=2048)
    embedder_max_retries: int = Field(default=3, ge=0, le=10)

    # --- relevance scorer -----------------------------------------------------------------
    scorer: Literal["local", "openai", "rerank", "tei"] = "local"
    scorer_base_url: str | None = Field(default=None, validate_default=True)
    scorer_model: str = "gpt-4o-mini"
    scorer_api_key: SecretStr | None = None
    # Requests in flight per scorer; over HTTP/1.1 at most one per connection, and the pool
    # keeps at most scorer_max_connections, of which at most scorer_max_connecting opened and not
    # answered yet (for 0.1 s at most): 4 is under the listen backlog of small servers (5 for
    # Python's http.server), beyond which the kernel drops connects and retries them after 1 s.
    scorer_concurrency: int = Field(default=256, ge=1, le=1024)
    scorer_max_connections: int = Field(default=64, ge=1, le=1024)
    scorer_max_connecting: int = Field(default=4, ge=1, le=1024)
    # Off by default: it halved-and-held a parallel /rerank backend whose few concurrent
    # requests each cost it a little serialized CPU (T1's 200-anchor rerank cell, 209 ms
    # against 64 ms; docs/performance.md T10).
    scorer_queue_signal: bool = Field(
        default=False,
        description="Cut the scorer's window to twice what its backend works on at once when "
        "the backend's latency rises with the requests at it (a backend that queues silently: "
        "llama.cpp slots, OLLAMA_NUM_PARALLEL). Off by default: it also cuts a parallel "
        "backend whose requests each cost it a little serialized CPU.",
    )
    # A backend that refused this many connects in a row is taken as down: its requests fail at
    # once (unavailable), but for one probe every scorer_breaker_delay_s, until one is answered.
    scorer_breaker_threshold: int = Field(default=5, ge=1)
    scorer_breaker_delay_s: float = Field(default=5.0, gt=0)
    scorer_timeout_s: float = Field(default=10.0, gt=0)
    # Answer deadline of a retrieve's scoring (None or 0: off), below the scorer timeout, which
    # bounds the late anchors scored after the answer; shutdown waits late_drain_s for them.
    score_deadline_ms: float | None = Field(default=None, ge=0)
    late_drain_s: float = Field(default=10.0, ge=0)
    scorer_max_retries: int = Field(default=2, ge=0, le=10)
    # Bytes of a scorer answer's body read at most; beyond, its pairs fail (too_large). 8 MiB:
    # twice a batch of 64 documents echoed back at 8000 chars (service.providers.http_client).
    scorer_max_answer_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # Documents per /rerank request (rerank, tei); a retrieve's batches run concurrently.
    scorer_batch_size: int = Field(default=64, ge=1, le=4096)
    # How a reranker's score becomes a relevance in [0, 1]: clip for probabilities, sigmoid
    # for logits (llama.cpp server).
    scorer_score_transform: Literal["clip", "sigmoid"] = "clip"
    # Chat scorer: the per-pair prompt template ({query}, {memory}; the built-in one if unset),
    # how the answer is read (a number, or P(yes) from logprobs), memories per prompt.
    scorer_prompt_file: Path | None = None
    scorer_chat_mode: Literal["number", "logprobs"] = "number"
    scorer_chat_batch: int = Field(default=1, ge=1, le=64)

    # --- completion model and budget ------------------------------------------------------
    rank: int = Field(
        default=8, ge=1, le=MAX_RANK, description="Rank r of the completion model."
    )
    reg: float = Field(
        default=1.0, gt=0, description="L2 weight of the query-side ridge solves (c_q, β_q, v_q)."
    )
    memory_reg: float = Field(
        default=1000.0,
        gt=0,
        description="L2 weight of a memory's bias b_m (and of its factors at factor_reg=off): "
        "how much history a memory needs before it departs from the content prior.",
    )
    content_reg: float = Field(
        default=100.0, gt=0, description="L2 weight of the content prior's embedding weights w."
    )
    factor_reg: Literal["auto", "off"] | Annotated[float, Field(gt=0)] = Field(
        default="off",
        description="L2 weight of the completion's factors u_m and v_q alike: off, weighted as "
        "the memory bias (EARM_MEMORY_REG), which shrinks them to nothing; a number; or auto, "
        "chosen by each full refit from the namespace's own causal error among off, 3, 1 and "
        "0.3 (neutral to harmful on the benchmark, hence not the default).",
    )
    refit_every: int = Field(default=50, ge=1, description="Full refit every this many queries.")
    refit_growth: float = Field(default=0.25, ge=0, description="A full refit also waits until "
        "the namespace's queries have grown by this share since the last one (from 200 queries "
        "on at the defaults): refit work per retrieve stays flat; 0: every EARM_REFIT_EVERY.")
    refit_process: Literal["child", "thread"] = Field(default="child", description="Where a "
        "full refit runs: child, a process this one starts for refits, so their CPU never "
        "stalls requests; thread, in this process (its event loop decodes the read and write): "
        "for where a child process cannot be started (a sandbox that allows no new process, an "
        "application embedding the app without a __main__ guard) or its own interpreter's "
        "memory is too much.")
    background_work: bool = Field(
        default=True,
        description="Run the background work (full refits and the HNSW indexer) in this "
        "serving process. False (`earm serve --no-background-work`): retrieves only count "
        "the queries toward a refit and ingests leave memories unindexed (searchable by the "
        "exact scan); `earm worker` processes on the same database do both.",
    )
    worker_poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often `earm worker` looks for namespaces due for a refit.",
    )
    query_traces: bool = Field(
        default=True,
        description="Keep every retrieve's candidates in rank order on its query row (about "
        "30 bytes per candidate, ~6 KB per query at 200 candidates) for GET /queries/{id} and "
        "the dashboard. False: only the stage and phase timings are kept; traces then list no "
        "candidates and the experience matrix shows observed cells only.",
    )
    reuse_observations: bool = Field(
        default=True,
        description="A query repeating an earlier one of its namespace (same normalised text, "
        "or the same client vector) takes the observations of those askings instead of scoring "
        "them again, and spends its budget on candidates not observed yet. False: a repeat "
        "still takes the client's feedback on earlier askings (feedback is authoritative), "
        "nothing else.",
    )
    paraphrase_transfer: bool = Field(
        default=True,
        description="Paraphrase transfer (earm policy): what earlier queries close to a new one "
        "observed informs its estimates and steers its exploring anchors elsewhere, so a "
        "rephrased need gains from its earlier wordings (docs/benchmarks.md). False: off.",
    )
    paraphrase_similarity: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="Paraphrase transfer: observations of earlier queries at least this "
        "cosine-similar to a new one count, weighted by (cos - threshold) / (1 - threshold); "
        "the exploring half of its anchors avoids candidates they observed with a summed weight "
        "of 0.7 or more (its exploiting half always judges its own head).",
    )
    paraphrase_prior: float = Field(
        default=0.25,
        gt=0,
        description="Weight κ of the model's estimate against the paraphrases' observations.",
    )
    paraphrase_window: int = Field(
        default=2000,
        ge=1,
        description="Paraphrase transfer looks for neighbours among the namespace's latest this "
        "many queries (an exact scan, one cosine each: the bound on its cost per retrieve).",
    )
    als_iterations: int = Field(default=10, ge=1, le=200)
    budget_schedule: str = DEFAULT_BUDGET_SCHEDULE
    profile: Literal["earm", "paper"] = Field(
        default="earm",
        description="A preset of the learning settings, each of which an explicit setting "
        "still overrides. 'paper': the EARM paper's configuration (EARM_ANCHOR_POLICY=paper, "
        "EARM_COMPLETION_MODEL=plain, EARM_MEMORY_REG=1, EARM_FACTOR_REG=1, "
        "EARM_PARAPHRASE_TRANSFER=false: one round of anchors, the plain low-rank model with "
        "balanced weights, observed and estimated scores ranked together); 'earm': the "
        "defaults listed here.",
    )
    completion_model: Literal["earm", "plain"] = Field(
        default="earm",
        description="'earm': the bias-aware low-rank model with a per-query similarity slope "
        "and a content prior (docs/design.md); 'plain': the EARM paper's model, biases and "
        "factors only, learning nothing from similarity or the memories' embeddings.",
    )
    anchor_policy: Literal["learned", "paper"] = Field(
        default="learned",
        description="Which candidates a budget scores. 'learned': the most similar two thirds "
        "of the budget and the rest on the highest estimates (EARM_ANCHOR_ROUNDS), of which an "
        "exploring share the namespace learns is drawn at random (an unscored candidate ranks "
        "among the scored ones only when EARM_TRUST_PROBABILITY says so); 'paper': the EARM "
        "paper's one round, half the most similar, half drawn uniformly from the rest.",
    )
    anchor_rounds: int = Field(
        default=1,
        ge=1,
        le=2,
        description="The learned rule's scorer rounds. 1: the anchors after the head are "
        "picked with it, by what the namespace knew before the query (memory biases, the "
        "content prior), and every anchor leaves at once; 2: they wait for the head's scores, "
        "folded in (a second scorer latency; needed by EARM_STOP_EXPECTED, which skips it).",
    )
    trust_probability: float = Field(
        default=0.95,
        ge=0.5,
        lt=1,
        description="The learned rule's ranking: an unscored candidate outranks a scored one "
        "only when the posterior of its score gives at least this probability that it scores "
        "higher (it ranks at the score it beats with this probability; 0.5: at its estimate).",
    )
    acquisition_quantile: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="The learned rule's round two (EARM_ANCHOR_ROUNDS=2): its exploiting "
        "picks are the unscored "
        "candidates with the highest posterior quantile at this level (0.5: the highest "
        "estimates; above, an upper confidence bound that favours candidates the anchors "
        "leave uncertain).",
    )
    stop_expected: float = Field(
        default=0.0,
        ge=0,
        description="The learned rule's stop: round two is not scored when the unscored "
        "candidates are expected (by the posterior) to put fewer than this many of them above "
        "the k-th observed score; the budget is then a ceiling. 0: never stop early.",
    )

    # --- request limits -------------------------------------------------------------------
    max_batch: int = Field(default=1000, ge=1, description="Memories per POST /memories.")
    max_text_chars: int = Field(default=8000, ge=1)
    max_k: int = Field(default=100, ge=1)
    max_candidates: int = Field(default=1000, ge=1)
    default_candidates: int = Field(default=200, ge=1)
    max_page_size: int = Field(default=500, ge=1)
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, description="Request body size limit (413 above it)."
    )
    max_metadata_bytes: int = Field(
        default=64 * 1024,
        ge=2,
        description="Serialized JSON size of one memory's metadata or filters.",
    )
    max_metadata_depth: int = Field(
        default=16, ge=1, description="Nesting depth of one memory's metadata or filters."
    )

    # --- authentication (service/auth.py, docs/security.md) -------------------------------
    api_keys: SecretStr | None = Field(
        default=None,
        description="Keys seeded at start-up: 'KEY=PATTERN[,PATTERN...]' entries separated by ';'.",
    )
    allow_anonymous: bool = Field(
        default=False,
        description=(
            "Serve without API keys on a non-loopback address (earm serve refuses otherwise)."
        ),
    )
    auth_cache_ttl_s: float = Field(
        default=2.0, ge=0, le=60, description="Key lookups are cached this long (revocation delay)."
    )
    metrics_public: bool = Field(
        default=False,
        description=(
            "Serve /metrics without an API key once key enforcement is on (it needs an admin "
            "key otherwise: its gauges name the busiest namespaces)."
        ),
    )

    # --- agent integrations (service/integrations/) ---------------------------------------
    mcp_default_namespace: str = Field(
        default="default",
        description="Namespace of the MCP tools when a call names none (/mcp and `earm mcp`).",
    )
    rerank_namespace: str | None = Field(
        default=None,
        description="Namespace of the rerank protocol's calls (/v1/rerank, /v2/rerank, "
        "/rerank) that name none, neither by a model `earm/<namespace>` nor by the "
        "X-Earm-Namespace header. Unset: such calls are refused (422).",
    )
    rerank_document_ttl_s: float = Field(
        default=30 * 86400.0,
        ge=0,
        description="Retention of the memories the rerank protocol stores for documents: one "
        "that no call has named for this long and that was never observed (no scorer score, "
        "no feedback) is deleted by the background maintenance (earm serve, earm worker). "
        "Memories ingested through /memories never expire. 0: documents are kept forever.",
    )
    rerank_repeat_window_s: float = Field(
        default=600.0,
        ge=0,
        description="A rerank call identical to one answered this recently (same namespace, "
        "query, documents in the same order and top_n) gets the same answer with no scorer "
        "call and nothing recorded; in-process, so per replica. 0: every call is answered anew "
        "(a repeat then explores as a re-asked retrieve does).",
    )
    url: str = Field(
        default="http://127.0.0.1:8000",
        description="The earm service `earm mcp` talks to (its --url flag overrides it).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="The API key `earm mcp` sends (its --api-key flag overrides it).",
    )

    # --- serving --------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    access_log: bool = Field(
        default=True,
        description="Log one line per request (earm.access) at INFO; false leaves them out, "
        "e.g. for a terminal someone reads during a demo (other lines are unchanged).",
    )
    trace_content: bool = Field(
        default=False,
        description="With tracing on (the OTEL_* variables, docs/operations.md \"Tracing\"), "
        "also put content in spans: the query text, the memories' texts, metadata and scores, "
        "the rerank scores. Off: ids, counts and sizes only.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's line and headers must arrive within this time (earm serve "
        "answers 408 and closes the connection otherwise); it also bounds a new connection's "
        "silence before its first request.",
    )
    body_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="A request's body must arrive within this time of its headers (408 "
        "request_timeout, connection closed otherwise).",
    )
    shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="On SIGTERM or SIGINT, requests still running after this long are "
        "cancelled (their transactions roll back) and the process stops.",
    )

    @model_validator(mode="before")
    @classmethod
    def _profile_presets(cls, values: object) -> object:
        """``EARM_PROFILE=paper`` fills in the paper's settings that are not set explicitly."""
        if isinstance(values, dict) and values.get("profile") == "paper":
            return PAPER_PROFILE | values
        return values

    @field_validator("budget_schedule")
    @classmethod
    def _parseable_schedule(cls, schedule: str) -> str:
        BudgetSchedule.parse(schedule)  # raises ValueError naming the bad entry
        return schedule

    @model_validator(mode="after")
    def _stop_rule_has_a_round_to_stop(self) -> Settings:
        if self.stop_expected > 0 and self.anchor_rounds == 1:
            raise ValueError(
                f"EARM_STOP_EXPECTED={self.stop_expected:g} skips the learned rule's round two, "
                "and EARM_ANCHOR_ROUNDS=1 has none: set EARM_ANCHOR_ROUNDS=2 with it"
            )
        return self

    @model_validator(mode="after")
    def _default_candidates_allowed(self) -> Settings:
        if self.default_candidates > self.max_candidates:
            raise ValueError(
                f"EARM_DEFAULT_CANDIDATES={self.default_candidates} is above "
                f"EARM_MAX_CANDIDATES={self.max_candidates}: every retrieve that sets no "
                "candidates would be refused"
            )
        return self

    @field_validator("score_deadline_ms")
    @classmethod
    def _deadline_below_timeout(cls, deadline: float | None, info: ValidationInfo) -> float | None:
        timeout_s = info.data.get("scorer_timeout_s")
        if deadline and timeout_s is not None and deadline >= timeout_s * 1000:
            raise ValueError(
                f"{deadline:g} ms is not below EARM_SCORER_TIMEOUT_S={timeout_s:g} s, which "
                "bounds the scoring of late anchors: set a shorter deadline or a longer timeout"
            )
        return deadline or None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, level: object) -> object:
        # Python's and uvicorn's levels are case-insensitive names; so is the setting.
        return level.upper() if isinstance(level, str) else level

    @field_validator("mcp_default_namespace", "rerank_namespace")
    @classmethod
    def _namespace_name(cls, namespace: str | None) -> str | None:
        return None if namespace is None else namespace_name(namespace)

    @field_validator("embedder_base_url", "scorer_base_url")
    @classmethod
    def _http_base_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        # Checked with the settings, so `earm serve` refuses a missing or unusable URL before it
        # starts Postgres or the embedder, not at the provider's first call.
        provider = "embedder" if info.field_name == "embedder_base_url" else "scorer"
        kind = str(info.data.get(provider))  # "None" when that setting is itself invalid
        if not url:
            if (provider, kind) in BASE_URL_EXAMPLES:
                raise ValueError(missing_base_url(provider, kind))
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL, e.g. http://localhost:8000/v1")
        return url.rstrip("/")

    @property
    def replica_urls(self) -> list[str]:
        """``EARM_DATABASE_REPLICA_URLS`` as a list (blanks between commas dropped)."""
        return [url.strip() for url in self.database_replica_urls.split(",") if url.strip()]


    # --- the groups each component receives (service.settings_groups) ---------------------

    @property
    def database(self) -> DatabaseSettings:
        return DatabaseSettings(
            url=self.database_url,
            data_dir=self.data_dir,
            replica_urls=tuple(self.replica_urls),
            replica_max_wait_ms=self.replica_max_wait_ms,
            pool_size=self.db_pool_size,
            lock_timeout_s=self.db_lock_timeout_s,
            prepared_statements=self.db_prepared_statements,
            embedding_dim=self.embedding_dim,
            embedded_watch_interval_s=self.embedded_watch_interval_s,
            embedded_restart_attempts=self.embedded_restart_attempts,
            embedded_restart_backoff_s=self.embedded_restart_backoff_s,
        )

    @property
    def indexing(self) -> IndexingSettings:
        return IndexingSettings(
            batch_size=self.index_batch_size,
            poll_interval_s=self.index_poll_interval_s,
            max_unindexed=self.max_unindexed,
            document_ttl_s=self.rerank_document_ttl_s,
        )

    @property
    def embedding(self) -> EmbedderSettings:
        return EmbedderSettings(
            kind=self.embedder,
            dim=self.embedding_dim,
            base_url=self.embedder_base_url,
            model=self.embedder_model,
            api_key=self.embedder_api_key,
            timeout_s=self.embedder_timeout_s,
            batch_size=self.embedder_batch_size,
            max_retries=self.embedder_max_retries,
        )

    @property
    def scoring(self) -> ScorerSettings:
        return ScorerSettings(
            kind=self.scorer,
            base_url=self.scorer_base_url,
            model=self.scorer_model,
            api_key=self.scorer_api_key,
            concurrency=self.scorer_concurrency,
            max_connections=self.scorer_max_connections,
            max_connecting=self.scorer_max_connecting,
            queue_signal=self.scorer_queue_signal,
            breaker_threshold=self.scorer_breaker_threshold,
            breaker_delay_s=self.scorer_breaker_delay_s,
            timeout_s=self.scorer_timeout_s,
            max_retries=self.scorer_max_retries,
            max_answer_bytes=self.scorer_max_answer_bytes,
            batch_size=self.scorer_batch_size,
            score_transform=self.scorer_score_transform,
            prompt_file=self.scorer_prompt_file,
            chat_mode=self.scorer_chat_mode,
            chat_batch=self.scorer_chat_batch,
        )

    @property
    def completion(self) -> CompletionSettings:
        return CompletionSettings(
            model=self.completion_model,
            rank=self.rank,
            reg=self.reg,
            memory_reg=self.memory_reg,
            content_reg=self.content_reg,
            factor_reg=self.factor_reg,
            als_iterations=self.als_iterations,
            embedding_dim=self.embedding_dim,
        )

    @property
    def learning(self) -> LearningSettings:
        return LearningSettings(
            completion=self.completion,
            every=self.refit_every,
            growth=self.refit_growth,
            process=self.refit_process,
            background_work=self.background_work,
            worker_poll_interval_s=self.worker_poll_interval_s,
            log_level=self.log_level,
            db_prepared_statements=self.db_prepared_statements,
        )

    @property
    def search(self) -> SearchSettings:
        return SearchSettings(
            default_candidates=self.default_candidates,
            rank=self.rank,
            reuse_observations=self.reuse_observations,
            exact_scan_below=self.exact_scan_below,
            exact_scan_below_filtered=self.exact_scan_below_filtered,
            paraphrase_transfer=self.paraphrase_transfer,
            paraphrase_similarity=self.paraphrase_similarity,
            paraphrase_window=self.paraphrase_window,
        )

    @property
    def anchors(self) -> AnchorSettings:
        return AnchorSettings(
            policy=self.anchor_policy,
            rounds=self.anchor_rounds,
            trust_probability=self.trust_probability,
            acquisition_quantile=self.acquisition_quantile,
            stop_expected=self.stop_expected,
            budget_schedule=self.budget_schedule,
            content_prior=self.completion_model == "earm",
            paraphrase_prior=self.paraphrase_prior,
        )

    @property
    def retrieval(self) -> RetrievalSettings:
        return RetrievalSettings(
            score_deadline_ms=self.score_deadline_ms,
            late_drain_s=self.late_drain_s,
            query_traces=self.query_traces,
            embedding_dim=self.embedding_dim,
            document_ttl_s=self.rerank_document_ttl_s,
        )

    @property
    def limits(self) -> LimitSettings:
        return LimitSettings(
            max_batch=self.max_batch,
            max_text_chars=self.max_text_chars,
            max_k=self.max_k,
            max_candidates=self.max_candidates,
            default_candidates=self.default_candidates,
            max_page_size=self.max_page_size,
            max_body_bytes=self.max_body_bytes,
            max_metadata_bytes=self.max_metadata_bytes,
            max_metadata_depth=self.max_metadata_depth,
            embedding_dim=self.embedding_dim,
            max_unindexed=self.max_unindexed,
        )

    @property
    def auth(self) -> AuthSettings:
        return AuthSettings(
            api_keys=self.api_keys,
            allow_anonymous=self.allow_anonymous,
            cache_ttl_s=self.auth_cache_ttl_s,
            metrics_public=self.metrics_public,
        )

    @property
    def serving(self) -> ServingSettings:
        return ServingSettings(
            host=self.host,
            port=self.port,
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            shutdown_timeout_s=self.shutdown_timeout_s,
            max_body_bytes=self.max_body_bytes,
        )

    @property
    def observability(self) -> ObservabilitySettings:
        return ObservabilitySettings(
            log_level=self.log_level, access_log=self.access_log, trace_content=self.trace_content
        )

    @property
    def integrations(self) -> IntegrationSettings:
        return IntegrationSettings(
            mcp_default_namespace=self.mcp_default_namespace,
            rerank_namespace=self.rerank_namespace,
            rerank_repeat_window_s=self.rerank_repeat_window_s,
            url=self.url,
            api_key=self.api_key,
        )
