"""earm for LlamaIndex (``earm[llamaindex]``): :class:`EarmRetriever`, a ``BaseRetriever`` over
``POST /retrieve``, and :class:`EarmRerank`, a ``BaseNodePostprocessor`` over ``POST /v1/rerank``
for a stack that keeps its own index and wants earm in its reranker's slot."""

from __future__ import annotations

from typing import Any, Literal

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from service.api.retrieve import Policy
from service.client import DEFAULT_TIMEOUT_S, CohereRerankOut, RetrieveResult
from service.integrations._clients import (
    BOOKKEEPING_KEYS,
    DEFAULT_URL,
    RERANK_KEYS,
    EarmClients,
    reranked,
    retrieved,
)

__all__ = ["EarmRerank", "EarmRetriever"]


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


class EarmRerank(BaseNodePostprocessor):
    """The caller's nodes reordered by earm's relevance to the query, best first (``top_n`` of
    them; None: all), e.g. as a query engine's ``node_postprocessors``::

        reranker = EarmRerank(url="http://127.0.0.1:8000", namespace="agent-42", top_n=3)
        for hit in reranker.postprocess_nodes(nodes, query_str="Is Alice allergic to peanuts?"):
            print(hit.score, hit.node.get_content())

    Each ``NodeWithScore`` has earm's relevance as its score and a copy of the caller's node
    whose metadata adds ``relevance_score``, ``query_id`` and ``memory_id`` (for ``POST
    /feedback``; kept from the LLM and the embedder). earm learns in ``namespace``.
    """

    url: str = DEFAULT_URL
    namespace: str
    top_n: int | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    api_key: str | None = Field(default=None, exclude=True, repr=False)

    _clients: EarmClients = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._clients = EarmClients(self.url, self.api_key, self.timeout)

    @classmethod
    def class_name(cls) -> str:
        return "EarmRerank"

    @staticmethod
    def _texts(nodes: list[NodeWithScore]) -> list[str]:
        # The content alone, without metadata: earm knows a document by its text, so the same
        # text is the same memory (and keeps its history) whatever metadata a node carries.
        return [hit.node.get_content(metadata_mode=MetadataMode.NONE) for hit in nodes]

    @staticmethod
    def _reordered(nodes: list[NodeWithScore], answer: CohereRerankOut) -> list[NodeWithScore]:
        hits = []
        for index, earm in reranked(answer):
            node = nodes[index].node
            copy = node.model_copy(update={
                "metadata": {**node.metadata, **earm},
                "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys, *RERANK_KEYS],
                "excluded_embed_metadata_keys": [
                    *node.excluded_embed_metadata_keys, *RERANK_KEYS
                ],
            })
            hits.append(NodeWithScore(node=copy, score=earm["relevance_score"]))
        return hits

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("EarmRerank needs the query (query_bundle or query_str)")
        if not nodes:  # earm refuses a call without documents; there is nothing to rank
            return []
        earm = self._clients.sync()
        answer = earm.rerank(self.namespace, query_bundle.query_str, self._texts(nodes), self.top_n)
        return self._reordered(nodes, answer)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("EarmRerank needs the query (query_bundle or query_str)")
        if not nodes:
            return []
        earm = self._clients.for_running_loop()
        texts = self._texts(nodes)
        answer = await earm.rerank(self.namespace, query_bundle.query_str, texts, self.top_n)
        return self._reordered(nodes, answer)
