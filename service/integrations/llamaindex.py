"""earm for LlamaIndex: :class:`EarmRetriever`, a ``BaseRetriever`` over ``POST /retrieve``
(``earm[llamaindex]``)."""

from __future__ import annotations

from typing import Any, Literal

from llama_index.core.callbacks import CallbackManager
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from service.client import DEFAULT_TIMEOUT_S, RetrieveResult
from service.integrations._clients import (
    BOOKKEEPING_KEYS,
    DEFAULT_URL,
    EarmClients,
    Policy,
    retrieved,
)

__all__ = ["EarmRetriever"]


class EarmRetriever(BaseRetriever):
    """The memories of an earm namespace most relevant to a query, as scored nodes::

        retriever = EarmRetriever(url="http://127.0.0.1:8000", namespace="agent-42", k=5)
        for hit in retriever.retrieve("What did Caroline do on 7 May?"):
            print(hit.score, hit.node.get_content())

    Each ``NodeWithScore`` has earm's score; its ``TextNode`` is the memory (``id_`` = the
    memory id) with the metadata of :class:`service.integrations.langchain.EarmRetriever`'s
    documents. Only ``occurred_at`` and the memory's own ``metadata`` reach the LLM and the
    embedder; the rest is bookkeeping.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        namespace: str,
        k: int = 10,
        policy: Policy = "earm",
        candidates: int | None = None,
        order: Literal["chronological", "relevance"] = "chronological",
        filters: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.namespace = namespace
        self.options: dict[str, Any] = {
            "k": k,
            "policy": policy,
            "candidates": candidates,
            "order": order,
            "filters": filters,
        }
        self._clients = EarmClients(url, api_key, timeout)

    def _nodes(self, result: RetrieveResult) -> list[NodeWithScore]:
        return [
            NodeWithScore(
                node=TextNode(
                    id_=str(metadata["id"]),
                    text=text,
                    metadata=metadata,
                    excluded_llm_metadata_keys=list(BOOKKEEPING_KEYS),
                    excluded_embed_metadata_keys=list(BOOKKEEPING_KEYS),
                ),
                score=metadata["score"],
            )
            for text, metadata in retrieved(result, self.namespace)
        ]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        earm = self._clients.sync()
        return self._nodes(earm.retrieve(self.namespace, query_bundle.query_str, **self.options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        earm = self._clients.for_running_loop()
        return self._nodes(
            await earm.retrieve(self.namespace, query_bundle.query_str, **self.options)
        )
