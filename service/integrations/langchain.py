"""earm for LangChain and LangGraph (``earm[langchain]``): EarmRetriever, EarmRerank, EarmStore.

``EarmRetriever`` is a LangChain ``BaseRetriever`` (``invoke``/``ainvoke``, natively async) over
``POST /retrieve``; ``EarmRerank`` is a ``BaseDocumentCompressor`` over ``POST /v1/rerank``, for
a stack that keeps its own store and wants earm in its reranker's slot; ``EarmStore`` is a
LangGraph ``BaseStore``, so a LangGraph agent's long-term memory
(``graph.compile(store=EarmStore(...))``) lives in earm and its searches learn from earm's
reranking. All talk to a running earm over its HTTP API with :mod:`service.client`. The store
is :mod:`service.integrations.langgraph_store`, exported here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from pydantic import PrivateAttr, SecretStr

from service.api.retrieve import Policy
from service.client import DEFAULT_TIMEOUT_S, CohereRerankOut
from service.integrations._clients import DEFAULT_URL, EarmClients, reranked, retrieved
from service.integrations.langgraph_store import EarmStore

__all__ = ["EarmRerank", "EarmRetriever", "EarmStore"]


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


class EarmRerank(BaseDocumentCompressor):
    """The caller's documents reordered by earm's relevance to a query, best first (``top_n``
    of them; None: all), e.g. as a ``ContextualCompressionRetriever``'s compressor::

        reranker = EarmRerank(url="http://127.0.0.1:8000", namespace="agent-42", top_n=3)
        for doc in reranker.compress_documents(documents, "Is Alice allergic to peanuts?"):
            print(doc.metadata["relevance_score"], doc.page_content)

    Each returned ``Document`` is a copy of the caller's with ``relevance_score`` (as
    ``CohereRerank`` puts it), ``query_id`` and ``memory_id`` added to its metadata, so
    ``POST /feedback`` can grade the call. earm learns in ``namespace``.
    """

    url: str = DEFAULT_URL
    api_key: SecretStr | None = None
    namespace: str
    top_n: int | None = None
    timeout: float = DEFAULT_TIMEOUT_S

    _clients: EarmClients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        key = self.api_key.get_secret_value() if self.api_key else None
        self._clients = EarmClients(self.url, key, self.timeout)

    @staticmethod
    def _reordered(documents: Sequence[Document], answer: CohereRerankOut) -> list[Document]:
        return [
            Document(
                page_content=documents[index].page_content,
                metadata={**documents[index].metadata, **earm},
                id=documents[index].id,
            )
            for index, earm in reranked(answer)
        ]

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        if not documents:  # earm refuses a call without documents; there is nothing to rank
            return []
        texts = [document.page_content for document in documents]
        answer = self._clients.sync().rerank(self.namespace, query, texts, self.top_n)
        return self._reordered(documents, answer)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        if not documents:
            return []
        texts = [document.page_content for document in documents]
        earm = self._clients.for_running_loop()
        answer = await earm.rerank(self.namespace, query, texts, self.top_n)
        return self._reordered(documents, answer)
