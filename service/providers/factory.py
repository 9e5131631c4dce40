"""The providers a deployment's settings select: its embedder and its relevance scorer."""

from __future__ import annotations

from pydantic import SecretStr

from service.errors import ConfigurationError
from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.embedders import LOCAL_DIM, Embedder, LocalEmbedder
from service.providers.openai_embedder import OpenAIEmbedder
from service.providers.scorers import LocalScorer, RelevanceScorer, ScorerObserver
from service.settings import Settings


def build_embedder(settings: Settings) -> Embedder | None:
    """The deployment's embedder; ``None`` when clients must send their own vectors."""
    kind = settings.embedder
    if kind == "none":
        return None
    if kind == "local":
        if settings.embedding_dim != LOCAL_DIM:
            raise ConfigurationError(
                f"the local embedder produces {LOCAL_DIM}-d vectors but EARM_EMBEDDING_DIM="
                f"{settings.embedding_dim}; set EARM_EMBEDDING_DIM={LOCAL_DIM} or use another embedder"
            )
        return LocalEmbedder(batch_size=settings.embedder_batch_size)
    if kind == "openai":
        base_url, api_key = _openai_endpoint(
            "EMBEDDER", settings.embedder_base_url, settings.embedder_api_key,
            "http://localhost:11434/v1",
        )
        return OpenAIEmbedder(
            base_url=base_url,
            model=settings.embedder_model,
            dim=settings.embedding_dim,
            api_key=api_key,
            timeout_s=settings.embedder_timeout_s,
            batch_size=settings.embedder_batch_size,
            max_retries=settings.embedder_max_retries,
        )
    raise ConfigurationError(f"unknown embedder {kind!r}; expected 'local', 'openai' or 'none'")


def build_scorer(settings: Settings, observer: ScorerObserver | None = None) -> RelevanceScorer:
    """The deployment's relevance scorer; ``observer`` hears about every scored pair."""
    if settings.scorer == "local":
        return LocalScorer(observer=observer)
    if settings.scorer == "openai":
        base_url, api_key = _openai_endpoint(
            "SCORER", settings.scorer_base_url, settings.scorer_api_key, "http://localhost:8001/v1"
        )
        return OpenAIChatScorer(
            base_url=base_url,
            model=settings.scorer_model,
            api_key=api_key,
            concurrency=settings.scorer_concurrency,
            timeout_s=settings.scorer_timeout_s,
            max_retries=settings.scorer_max_retries,
            observer=observer,
        )
    raise ConfigurationError(f"unknown scorer {settings.scorer!r}; expected 'local' or 'openai'")


def _openai_endpoint(
    provider: str, base_url: str | None, api_key: SecretStr | None, local_example: str
) -> tuple[str, str | None]:
    """The base URL (required) and the API key of an OpenAI-compatible ``EARM_<provider>``."""
    if not base_url:
        raise ConfigurationError(
            f"EARM_{provider}=openai requires EARM_{provider}_BASE_URL "
            f"(e.g. https://api.openai.com/v1 or {local_example})"
        )
    return base_url, api_key.get_secret_value() if api_key else None
