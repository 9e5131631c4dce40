"""earm for LangChain and LangGraph (``earm[langchain]``): EarmRetriever and EarmStore.

``EarmRetriever`` is a LangChain ``BaseRetriever`` (``invoke``/``ainvoke``, natively async) over
``POST /retrieve``; ``EarmStore`` is a LangGraph ``BaseStore``, so a LangGraph agent's long-term
memory (``graph.compile(store=EarmStore(...))``) lives in earm and its searches learn from earm's
reranking. Both talk to a running earm over its HTTP API with :mod:`service.client`. The store
is :mod:`service.integrations.langgraph_store`, exported here too.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import PrivateAttr, SecretStr

from service.client import DEFAULT_TIMEOUT_S
from service.integrations._clients import DEFAULT_URL, EarmClients, Policy, retrieved
from service.integrations.langgraph_store import EarmStore

__all__ = ["EarmRetriever", "EarmStore"]


class EarmRetriever(BaseRetriever):
    """The memories of an earm namespace most relevant to a query, as LangChain documents::

        retriever = EarmRetriever(url="http://127.0.0.1:8000", namespace="agent-42", k=5)
        for doc in retriever.invoke("What did Caroline do on 7 May?"):
            print(doc.metadata["rank"], doc.metadata["score"], doc.page_content)

    Each ``Document`` holds the memory's text; its metadata has ``id``, ``external_id``,
    ``namespace``, ``score``, ``source``, ``similarity``, ``rank``, ``occurred_at`` (ISO 8601),
    ``query_id`` (for ``POST /feedback``) and the memory's own ``metadata``.
    """

    url: str = DEFAULT_URL
    api_key: SecretStr | None = None
    namespace: str
    k: int = 10
    policy: Policy = "earm"
    #: Semantic candidates per query (None: the service's default).
    candidates: int | None = None
    #: The order of the documents: by time (the service's default) or by rank.
    order: Literal["chronological", "relevance"] = "chronological"
    #: Only memories whose metadata contains this JSON object.
    filters: dict[str, Any] | None = None
    timeout: float = DEFAULT_TIMEOUT_S

    _clients: EarmClients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        key = self.api_key.get_secret_value() if self.api_key else None
        self._clients = EarmClients(self.url, key, self.timeout)

    def _options(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "policy": self.policy,
            "candidates": self.candidates,
            "order": self.order,
            "filters": self.filters,
        }

    def _documents(self, result: Any) -> list[Document]:
        return [
            Document(page_content=text, metadata=metadata)
            for text, metadata in retrieved(result, self.namespace)
        ]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self._documents(
            self._clients.sync().retrieve(self.namespace, query, **self._options())
        )

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        earm = self._clients.for_running_loop()
        return self._documents(await earm.retrieve(self.namespace, query, **self._options()))
