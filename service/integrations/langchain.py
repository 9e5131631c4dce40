"""earm for LangChain and LangGraph (``earm[langchain]``): EarmRetriever and EarmStore.

``EarmRetriever`` is a LangChain ``BaseRetriever`` (``invoke``/``ainvoke``, natively async) over
``POST /retrieve``; ``EarmStore`` is a LangGraph ``BaseStore``, so a LangGraph agent's long-term
memory (``graph.compile(store=EarmStore(...))``) lives in earm and its searches learn from earm's
reranking. Both talk to a running earm over its HTTP API with :mod:`service.client`.

Over 400 lines on purpose: LangGraph's ``BaseStore`` contract (batched get/put/search/delete/
list_namespaces ops, sync and async) is one adapter, and splitting it would scatter the mapping
of namespace tuples and keys onto earm namespaces and external ids across modules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)
from pydantic import PrivateAttr, SecretStr

from service.client import DEFAULT_TIMEOUT_S, EarmAPIError, Memory
from service.integrations._clients import DEFAULT_URL, EarmClients, retrieved

__all__ = ["EarmRetriever", "EarmStore"]

Policy = Literal["earm", "semantic", "full", "observed"]


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


# ---------------------------------------------------------------------------- LangGraph store

#: The memory metadata key under which the store keeps an item (value and times); the store
#: sees only memories that have it.
STORE_KEY = "langgraph"
#: Memories per page when the store lists a namespace.
PAGE_SIZE = 200
#: Attempts of a put that finds its key rewritten by another writer in the meantime.
PUT_ATTEMPTS = 5


@dataclass(frozen=True)
class _Call:
    """One call of the earm client, made by the sync or the async driver."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


#: An operation as the client calls it needs: it yields calls, receives their results (or
#: their EarmAPIError, thrown in) and returns the operation's result.
_Plan = Generator[_Call, Any, Result]


def _drive(plan: _Plan, perform: Callable[[_Call], Any]) -> Result:
    try:
        call = next(plan)
        while True:
            try:
                outcome = perform(call)
            except EarmAPIError as error:
                call = plan.throw(error)
            else:
                call = plan.send(outcome)
    except StopIteration as done:
        result: Result = done.value  # what the plan returned (typeshed types it Any)
        return result


async def _adrive(plan: _Plan, perform: Callable[[_Call], Any]) -> Result:
    try:
        call = next(plan)
        while True:
            try:
                outcome = await perform(call)
            except EarmAPIError as error:
                call = plan.throw(error)
            else:
                call = plan.send(outcome)
    except StopIteration as done:
        result: Result = done.value
        return result


def _contains(value: Any, pattern: Any) -> bool:
    """JSON containment, as Postgres' jsonb ``@>`` (what ``/retrieve`` filters with)."""
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            key in value and _contains(value[key], item) for key, item in pattern.items()
        )
    if isinstance(pattern, list):
        return isinstance(value, list) and all(
            any(_contains(candidate, item) for candidate in value) for item in pattern
        )
    return bool(value == pattern)


def _operators(pattern: Any) -> list[str]:
    """The ``$``-operators (``$gt``, ``$ne``, ...) anywhere in a filter."""
    if isinstance(pattern, dict):
        return [key for key in pattern if key.startswith("$")] + [
            op for item in pattern.values() for op in _operators(item)
        ]
    if isinstance(pattern, list):
        return [op for item in pattern for op in _operators(item)]
    return []


def _check_filter(pattern: dict[str, Any] | None) -> None:
    if operators := _operators(pattern):
        raise ValueError(
            "EarmStore filters match values by containment (like Postgres jsonb @>); "
            f"operators such as {operators[0]!r} are not supported"
        )


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(expected in ("*", label) for expected, label in zip(path, part, strict=True))


def _field(value: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (``"$"``: the whole value), None where it has none."""
    if path == "$":
        return value
    current: Any = value
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _as_text(part: Any) -> str:
    return part if isinstance(part, str) else json.dumps(part, ensure_ascii=False, sort_keys=True)


class EarmStore(BaseStore):
    """A LangGraph ``BaseStore`` on earm: every item is a memory, searchable by meaning.

    - The namespace tuple ``("users", "alice")`` is the earm namespace ``<prefix>.users.alice``
      (``prefix`` lets an API key's patterns, e.g. ``agent-*``, cover the store). Labels may only
      hold the characters of earm namespace names.
    - ``put`` stores the value as a memory with ``external_id=key``: its text is the value's
      ``fields`` (dotted paths, ``"$"`` = the whole value as JSON, the default), or the item's
      own ``index`` list; the value itself is kept in the memory's metadata. Changing an item
      replaces its memory (a new memory id; what earm learned about the old text goes with it).
      Every item is searchable: ``index=False`` is not needed, so it is ignored.
    - ``search`` with a ``query`` is ``POST /retrieve`` (with ``policy``, ranked by relevance,
      ``score`` = earm's score); without one it lists items oldest first. ``filter`` matches
      values by containment (``{"kind": "fact"}``), as Postgres' jsonb ``@>``.
    - ``search`` covers the one namespace its prefix names: earm keeps each namespace's
      memories, queries and learned model apart, so a search never spans namespaces.
    - ``list_namespaces`` lists the store's non-empty namespaces the key can see.
    - No TTL (``supports_ttl = False``).
    """

    supports_ttl = False

    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        prefix: str = "langgraph",
        fields: Sequence[str] = ("$",),
        policy: Policy = "earm",
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.prefix = prefix
        self.fields = list(fields)
        self.policy = policy
        self._clients = EarmClients(url, api_key, timeout)

    # ------------------------------------------------------------------------ the two drivers

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        earm = self._clients.sync()
        return [
            _drive(
                self._plan(op), lambda call: getattr(earm, call.method)(*call.args, **call.kwargs)
            )
            for op in ops
        ]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        earm = self._clients.for_running_loop()
        return [
            await _adrive(
                self._plan(op), lambda call: getattr(earm, call.method)(*call.args, **call.kwargs)
            )
            for op in ops
        ]

    # ----------------------------------------------------------------------- the operations

    def _plan(self, op: Op) -> _Plan:
        validate_op_namespace(op)
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, PutOp):
            return self._put(op, op.value) if op.value is not None else self._delete(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise ValueError(f"unknown store operation {op!r}")

    def _namespace(self, namespace: tuple[str, ...]) -> str:
        return ".".join((self.prefix, *namespace))

    def _text(self, value: Mapping[str, Any], index: list[str] | Literal[False] | None) -> str:
        paths = index if isinstance(index, list) else self.fields
        parts = [
            _as_text(part) for path in paths if (part := _field(value, path)) not in (None, "")
        ]
        return "\n".join(parts) or _as_text(value)

    @staticmethod
    def _item(memory: Any, namespace: tuple[str, ...]) -> dict[str, Any] | None:
        """The fields of the item a memory holds (None for a memory the store did not write)."""
        stored = memory.metadata.get(STORE_KEY)
        if not isinstance(stored, dict) or not isinstance(stored.get("value"), dict):
            return None
        return {
            "namespace": namespace,
            "key": memory.external_id,
            "value": stored["value"],
            "created_at": stored["created_at"],
            "updated_at": stored["updated_at"],
        }

    def _get(self, op: GetOp) -> _Plan:
        page = yield _Call(
            "list", (self._namespace(op.namespace),), {"limit": 1, "external_id": op.key}
        )
        item = self._item(page.memories[0], op.namespace) if page.memories else None
        return None if item is None else Item(**item)

    def _put(self, op: PutOp, value: Mapping[str, Any]) -> _Plan:
        namespace = self._namespace(op.namespace)
        now = datetime.now(UTC).isoformat()
        stored = {"value": value, "created_at": now, "updated_at": now}
        memory = {
            "text": self._text(value, op.index),
            "external_id": op.key,
            "metadata": {STORE_KEY: stored},
        }
        for _ in range(PUT_ATTEMPTS):
            added = yield _Call("add", (namespace, [memory]))
            if added.created:
                return None
            # The key holds an earlier memory: keep it if it says the same, else replace it.
            try:
                current: Memory = yield _Call("get", (added.ids[0],))
            except EarmAPIError as error:
                if error.code != "not_found":
                    raise
                continue  # deleted meanwhile: add again
            earlier = current.metadata.get(STORE_KEY)
            if (
                current.text == memory["text"]
                and isinstance(earlier, dict)
                and earlier.get("value") == value
            ):
                return None
            if isinstance(earlier, dict) and earlier.get("created_at"):
                stored["created_at"] = earlier["created_at"]
            yield from self._delete_memory(current.id)
        raise RuntimeError(
            f"could not store {op.key!r} in {namespace!r}: other writers kept changing it"
        )

    def _delete_memory(self, memory_id: int) -> Generator[_Call, Any, None]:
        try:
            yield _Call("delete", (memory_id,))
        except EarmAPIError as error:
            if error.code != "not_found":  # already gone is what a delete wants
                raise

    def _delete(self, op: PutOp) -> _Plan:
        page = yield _Call(
            "list", (self._namespace(op.namespace),), {"limit": 1, "external_id": op.key}
        )
        for memory in page.memories:
            yield from self._delete_memory(memory.id)
        return None

    def _search(self, op: SearchOp) -> _Plan:
        _check_filter(op.filter)
        namespace = self._namespace(op.namespace_prefix)
        if op.query is None:
            return (yield from self._list_items(op, namespace))
        # Only the store's memories, and of those the ones whose value contains the filter.
        filters = {STORE_KEY: {"value": op.filter or {}}}
        try:
            result = yield _Call(
                "retrieve",
                (namespace, op.query),
                {
                    "k": op.offset + op.limit,
                    "policy": self.policy,
                    "order": "relevance",
                    "filters": filters,
                },
            )
        except EarmAPIError as error:
            if error.code == "not_found":  # an empty or unknown namespace
                return []
            raise
        items = [
            SearchItem(**item, score=memory.score)
            for memory in result.memories
            if (item := self._item(memory, op.namespace_prefix)) is not None
        ]
        return items[op.offset :]

    def _list_items(self, op: SearchOp, namespace: str) -> _Plan:
        wanted, cursor = op.offset + op.limit, None
        found: list[SearchItem] = []
        while len(found) < wanted:
            page = yield _Call("list", (namespace,), {"limit": PAGE_SIZE, "cursor": cursor})
            for memory in page.memories:
                item = self._item(memory, op.namespace_prefix)
                if item is not None and _contains(item["value"], op.filter or {}):
                    found.append(SearchItem(**item))
            if (cursor := page.next_cursor) is None:
                break
        return found[op.offset : wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> _Plan:
        stats = yield _Call("stats")
        start = self.prefix + "."
        namespaces = {
            tuple(row.namespace[len(start) :].split("."))
            for row in stats.namespaces
            if row.namespace.startswith(start) and row.memories > 0
        }
        matching = {
            namespace[: op.max_depth] if op.max_depth is not None else namespace
            for namespace in namespaces
            if all(_matches(namespace, condition) for condition in op.match_conditions or ())
        }
        return sorted(matching)[op.offset : op.offset + op.limit]
