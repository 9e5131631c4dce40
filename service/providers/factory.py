"""The providers a deployment's settings select: its embedder and its relevance scorer, each
built from its own group of settings (``Settings.embedding``, ``Settings.scoring``)."""

from __future__ import annotations

from pydantic import SecretStr

from service.checks import missing_base_url
from service.errors import ConfigurationError
from service.providers.breaker import Breaker
from service.providers.chat_scorer import USER_PROMPT, OpenAIChatScorer, check_template
from service.providers.embedders import CLIENT_MODEL_ID, Embedder
from service.providers.http_client import PoolLimits
from service.providers.local_embedder import LOCAL_DIM, LOCAL_MODEL_ID, LocalEmbedder
from service.providers.openai_embedder import OpenAIEmbedder, openai_model_id
from service.providers.rerank_scorer import RerankScorer
from service.providers.scorers import LocalScorer, RelevanceScorer, ScorerObserver
from service.settings_groups import EmbedderSettings, ScorerSettings


def build_embedder(settings: EmbedderSettings) -> Embedder | None:
    """The deployment's embedder; ``None`` when clients must send their own vectors."""
    kind = settings.kind
    if kind == "none":
        return None
    if kind == "local":
        if settings.dim != LOCAL_DIM:
            raise ConfigurationError(
                f"the local embedder produces {LOCAL_DIM}-d vectors but EARM_EMBEDDING_DIM="
                f"{settings.dim}; set EARM_EMBEDDING_DIM={LOCAL_DIM} "
                "or use another embedder"
            )
        return LocalEmbedder(batch_size=settings.batch_size)
    if kind == "openai":
        base_url, api_key = _endpoint(
            "embedder", kind, settings.base_url, settings.api_key
        )
        return OpenAIEmbedder(
            base_url=base_url,
            model=settings.model,
            dim=settings.dim,
            api_key=api_key,
            timeout_s=settings.timeout_s,
            batch_size=settings.batch_size,
            max_retries=settings.max_retries,
        )
    raise ConfigurationError(f"unknown embedder {kind!r}; expected 'local', 'openai' or 'none'")


def embedding_model_id(settings: EmbedderSettings) -> str:
    """The model id the deployment's embedder stores with its vectors (``CLIENT_MODEL_ID`` for
    ``EARM_EMBEDDER=none``: clients send their own), without building the embedder."""
    if settings.kind == "local":
        return LOCAL_MODEL_ID
    if settings.kind == "openai":
        return openai_model_id(settings.model)
    return CLIENT_MODEL_ID


def scorer_source(settings: ScorerSettings) -> str:
    """What the deployment's scorer records as each observation's source (``scores.scored_by``):
    the backend, model and what sets its scale (the chat mode; a reranker's transform), so the
    observations of each scale get a map of their own (``service.completion.scale``)."""
    if settings.kind == "local":
        return "local"
    if settings.kind == "openai":
        return f"openai:{settings.model}:{settings.chat_mode}"
    return f"{settings.kind}:{settings.model}:{settings.score_transform}"


def build_scorer(
    settings: ScorerSettings, observer: ScorerObserver | None = None
) -> RelevanceScorer:
    """The deployment's relevance scorer; ``observer`` hears about every scored pair."""
    kind = settings.kind
    if kind == "local":
        return LocalScorer(observer=observer)
    if kind not in ("openai", "rerank", "tei"):
        raise ConfigurationError(
            f"unknown scorer {kind!r}; expected 'local', 'openai', 'rerank' or 'tei'"
        )
    base_url, api_key = _endpoint("scorer", kind, settings.base_url, settings.api_key)
    if kind == "openai":
        return OpenAIChatScorer(
            mode=settings.chat_mode,
            prompt_template=_prompt_template(settings),
            batch=settings.chat_batch,
            base_url=base_url,
            model=settings.model,
            api_key=api_key,
            concurrency=settings.concurrency,
            timeout_s=settings.timeout_s,
            max_retries=settings.max_retries,
            observer=observer,
            max_answer_bytes=settings.max_answer_bytes,
            pool=_pool_limits(settings),
            breaker=_breaker(settings),
        )
    return RerankScorer(
        base_url=base_url,
        model=settings.model,
        protocol=kind,
        api_key=api_key,
        concurrency=settings.concurrency,
        timeout_s=settings.timeout_s,
        max_retries=settings.max_retries,
        batch_size=settings.batch_size,
        transform=settings.score_transform,
        observer=observer,
        max_answer_bytes=settings.max_answer_bytes,
        pool=_pool_limits(settings),
        breaker=_breaker(settings),
    )


def _pool_limits(settings: ScorerSettings) -> PoolLimits:
    return PoolLimits(settings.max_connections, settings.max_connecting,
                      queue_signal=settings.queue_signal)


def _breaker(settings: ScorerSettings) -> Breaker:
    return Breaker(settings.breaker_threshold, settings.breaker_delay_s)


def _endpoint(
    provider: str, kind: str, base_url: str | None, api_key: SecretStr | None
) -> tuple[str, str | None]:
    """The base URL and the API key of the HTTP provider ``EARM_<provider>=<kind>``. Settings
    refuse such a provider without a URL; settings changed by ``model_copy`` are not checked."""
    if not base_url:
        raise ConfigurationError(missing_base_url(provider, kind))
    return base_url, api_key.get_secret_value() if api_key else None


def _prompt_template(settings: ScorerSettings) -> str:
    """The chat scorer's per-pair prompt: EARM_SCORER_PROMPT_FILE's text, or the built-in one."""
    path = settings.prompt_file
    if path is None:
        return USER_PROMPT
    try:
        return check_template(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"EARM_SCORER_PROMPT_FILE={path}: cannot read it ({exc})") from exc
    except ValueError as exc:
        raise ConfigurationError(f"EARM_SCORER_PROMPT_FILE={path}: {exc}") from exc
