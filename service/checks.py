"""Rules the settings and the API both apply: what a namespace may be called, and what to say of
a provider reached over HTTP without a base URL. At the bottom of the dependency rule (nothing
of earm's is imported here), since a setting (``mcp_default_namespace``) names a namespace too.
"""

from __future__ import annotations

import re

#: The namespace names the API accepts (``service.api.fields`` builds its ``NamespaceName``
#: from it).
NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


def namespace_name(namespace: str) -> str:
    """``namespace`` if the API accepts it as a namespace name, else ValueError."""
    if not re.match(NAMESPACE_PATTERN, namespace):
        raise ValueError(f"{namespace!r} is not a namespace name ({NAMESPACE_PATTERN})")
    return namespace


#: The providers reached over HTTP, (EARM_EMBEDDER or EARM_SCORER, its value), which need a
#: base URL: an example of one for each.
BASE_URL_EXAMPLES = {
    ("embedder", "openai"): "https://api.openai.com/v1 or http://localhost:11434/v1",
    ("scorer", "openai"): "https://api.openai.com/v1 or http://localhost:8001/v1",
    ("scorer", "rerank"): "https://api.cohere.com/v2 or http://localhost:8000/v1",
    ("scorer", "tei"): "http://localhost:8080",
}


def missing_base_url(provider: str, kind: str) -> str:
    """What to say when ``EARM_<provider>=<kind>`` has no base URL."""
    setting = f"EARM_{provider.upper()}"
    example = BASE_URL_EXAMPLES[(provider, kind)]
    return f"{setting}={kind} requires {setting}_BASE_URL (e.g. {example})"
