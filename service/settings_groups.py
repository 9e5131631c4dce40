"""The settings each component reads, as small frozen value objects.

``service.settings.Settings`` is the one thing loaded from the environment (its ``EARM_*``
names are the public interface and its validators check them together); each of its group
properties (``settings.scoring``, ``settings.database``, ...) builds one of these from its
fields. A component receives its group, not the whole ``Settings``: what it reads is in its
signature, and this module imports nothing of the service, so a provider or the numeric
core never depends on how the configuration is loaded.

Field names drop the group's prefix (``EARM_SCORER_TIMEOUT_S`` is ``ScorerSettings.timeout_s``);
a field means what its ``EARM_*`` variable means (``service/settings.py``, docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

EmbedderKind = Literal["local", "openai", "none"]
ScorerKind = Literal["local", "openai", "rerank", "tei"]
CompletionModel = Literal["earm", "plain"]
AnchorPolicy = Literal["learned", "paper"]
FactorReg = Literal["auto", "off"] | float
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@dataclass(frozen=True)
class DatabaseSettings:
    """The database engine and its pools (``service.db.engine``), and the embedded Postgres's
    supervision when no URL is set."""

    url: str | None
    data_dir: Path
    replica_urls: tuple[str, ...]
    replica_max_wait_ms: int
    pool_size: int
    lock_timeout_s: float
    prepared_statements: bool
    #: The width of the schema's vector columns (migrations and the schema check).
    embedding_dim: int
    embedded_watch_interval_s: float
    embedded_restart_attempts: int
    embedded_restart_backoff_s: float


@dataclass(frozen=True)
class IndexingSettings:
    """The background indexer and its document sweep (``service.ingest.indexer``), and the
    ingest's back-pressure on its backlog."""

    batch_size: int
    poll_interval_s: float
    max_unindexed: int
    #: Retention of the rerank protocol's documents (``EARM_RERANK_DOCUMENT_TTL_S``); 0: kept.
    document_ttl_s: float


@dataclass(frozen=True)
class EmbedderSettings:
    """The embedder (``service.providers.factory.build_embedder``)."""

    kind: EmbedderKind
    dim: int
    base_url: str | None
    model: str
    api_key: SecretStr | None
    timeout_s: float
    batch_size: int
    max_retries: int


@dataclass(frozen=True)
class ScorerSettings:
    """The relevance scorer (``service.providers.factory.build_scorer``)."""

    kind: ScorerKind
    base_url: str | None
    model: str
    api_key: SecretStr | None
    concurrency: int
    max_connections: int
    max_connecting: int
    #: Whether a latency rising with the requests at the backend cuts the window.
    queue_signal: bool
    breaker_threshold: int
    breaker_delay_s: float
    timeout_s: float
    max_retries: int
    max_answer_bytes: int
    batch_size: int
    score_transform: Literal["clip", "sigmoid"]
    prompt_file: Path | None
    chat_mode: Literal["number", "logprobs"]
    chat_batch: int


@dataclass(frozen=True)
class CompletionSettings:
    """The completion model's hyperparameters (full refits, ``service.retrieve.refit``, and the
    per-query solves of ``service.retrieve.learning``)."""

    model: CompletionModel
    rank: int
    reg: float
    memory_reg: float
    content_reg: float
    factor_reg: FactorReg
    als_iterations: int
    #: The width of the memories' embeddings the content prior reads.
    embedding_dim: int


@dataclass(frozen=True)
class LearningSettings:
    """What a namespace learns with, and when and where its full refits run (the learner,
    ``service.retrieve.learning``; ``refit_process``; ``service.worker``)."""

    completion: CompletionSettings
    every: int
    growth: float
    process: Literal["child", "thread"]
    #: False: this process only counts queries toward a refit (``earm worker`` refits).
    background_work: bool
    worker_poll_interval_s: float
    #: A child refit process logs at the parent's level, on its own connection.
    log_level: LogLevel
    db_prepared_statements: bool


@dataclass(frozen=True)
class SearchSettings:
    """The search step (``service.retrieve.search_step``): the semantic candidates, how they are
    read, and paraphrase transfer's neighbours."""

    default_candidates: int
    rank: int
    reuse_observations: bool
    exact_scan_below: int
    exact_scan_below_filtered: int
    paraphrase_transfer: bool
    paraphrase_similarity: float
    paraphrase_window: int


@dataclass(frozen=True)
class AnchorSettings:
    """Which candidates a budget scores and how the unscored rank (the planner,
    ``service.retrieve.plan_step``, and the pipeline's ranking)."""

    policy: AnchorPolicy
    rounds: int
    trust_probability: float
    acquisition_quantile: float
    stop_expected: float
    budget_schedule: str
    #: The content prior's estimates (completion model ``earm``) rank the candidates.
    content_prior: bool
    paraphrase_prior: float


@dataclass(frozen=True)
class RetrievalSettings:
    """The retrieve pipeline's own (``service.retrieve.pipeline``): its answer deadline, the
    late anchors' drain, and what a query row keeps."""

    score_deadline_ms: float | None
    late_drain_s: float
    query_traces: bool
    #: A client's query vector must have this width.
    embedding_dim: int
    #: The rerank protocol's documents (``EARM_RERANK_DOCUMENT_TTL_S``): how often a call that
    #: names one refreshes its sighting.
    document_ttl_s: float


@dataclass(frozen=True)
class LimitSettings:
    """Request limits (the routes and the pipeline's checks)."""

    max_batch: int
    max_text_chars: int
    max_k: int
    max_candidates: int
    default_candidates: int
    max_page_size: int
    max_body_bytes: int
    max_metadata_bytes: int
    max_metadata_depth: int
    #: A client's vectors must have this width.
    embedding_dim: int
    #: The ingest's back-pressure on the indexer's backlog (0: none).
    max_unindexed: int


@dataclass(frozen=True)
class AuthSettings:
    """API keys and who may call without one (``service.auth``, ``service.http.deps``)."""

    api_keys: SecretStr | None
    allow_anonymous: bool
    cache_ttl_s: float
    metrics_public: bool


@dataclass(frozen=True)
class ServingSettings:
    """The HTTP server (``service.http.server``) and the app's body limits."""

    host: str
    port: int
    header_timeout_s: float
    body_timeout_s: float
    shutdown_timeout_s: float
    max_body_bytes: int


@dataclass(frozen=True)
class ObservabilitySettings:
    """Logs and tracing (``service.logs``, ``service.tracing``)."""

    log_level: LogLevel
    access_log: bool
    trace_content: bool


@dataclass(frozen=True)
class IntegrationSettings:
    """The agent integrations (``service.integrations``, the rerank protocol) and the client
    side of ``earm mcp``."""

    mcp_default_namespace: str
    rerank_namespace: str | None
    rerank_repeat_window_s: float
    url: str
    api_key: SecretStr | None
