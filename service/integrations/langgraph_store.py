"""earm as LangGraph's long-term memory (``earm[langchain]``): :class:`EarmStore`, a
``BaseStore`` whose items are earm memories. Exported by :mod:`service.integrations.langchain`
beside the retriever.

The store maps LangGraph's namespace tuples and keys onto earm namespaces and external ids; its
batched get/put/search/delete/list_namespaces operations are plans of client calls
(:mod:`service.integrations._store_plans`), so each is written once for sync and async.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from service.api.retrieve import Policy
from service.client import DEFAULT_TIMEOUT_S, EarmAPIError, Memory
from service.integrations._clients import DEFAULT_URL, EarmClients
from service.integrations._store_matching import (
    as_text,
    check_filter,
    contains,
    field_at,
    matches,
)
from service.integrations._store_plans import Call, Plan, adrive, drive

__all__ = ["EarmStore"]

#: The memory metadata key under which the store keeps an item (value and times); the store
#: sees only memories that have it.
STORE_KEY = "langgraph"
#: Memories per page when the store lists a namespace.
PAGE_SIZE = 200
#: Attempts of a put that finds its key rewritten by another writer in the meantime.
PUT_ATTEMPTS = 5


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
            drive(
                self._plan(op), lambda call: getattr(earm, call.method)(*call.args, **call.kwargs)
            )
            for op in ops
        ]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        earm = self._clients.for_running_loop()
        return [
            await adrive(
                self._plan(op), lambda call: getattr(earm, call.method)(*call.args, **call.kwargs)
            )
            for op in ops
        ]

    # ----------------------------------------------------------------------- the operations

    def _plan(self, op: Op) -> Plan:
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
            as_text(part) for path in paths if (part := field_at(value, path)) not in (None, "")
        ]
        return "\n".join(parts) or as_text(value)

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

    def _get(self, op: GetOp) -> Plan:
        page = yield Call(
            "list", (self._namespace(op.namespace),), {"limit": 1, "external_id": op.key}
        )
        item = self._item(page.memories[0], op.namespace) if page.memories else None
        return None if item is None else Item(**item)

    def _put(self, op: PutOp, value: Mapping[str, Any]) -> Plan:
        namespace = self._namespace(op.namespace)
        now = datetime.now(UTC).isoformat()
        stored = {"value": value, "created_at": now, "updated_at": now}
        memory = {
            "text": self._text(value, op.index),
            "external_id": op.key,
            "metadata": {STORE_KEY: stored},
        }
        for _ in range(PUT_ATTEMPTS):
            added = yield Call("add", (namespace, [memory]))
            if added.created:
                return None
            # The key holds an earlier memory: keep it if it says the same, else replace it.
            try:
                current: Memory = yield Call("get", (added.ids[0],))
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

    def _delete_memory(self, memory_id: int) -> Generator[Call, Any, None]:
        try:
            yield Call("delete", (memory_id,))
        except EarmAPIError as error:
            if error.code != "not_found":  # already gone is what a delete wants
                raise

    def _delete(self, op: PutOp) -> Plan:
        page = yield Call(
            "list", (self._namespace(op.namespace),), {"limit": 1, "external_id": op.key}
        )
        for memory in page.memories:
            yield from self._delete_memory(memory.id)
        return None

    def _search(self, op: SearchOp) -> Plan:
        check_filter(op.filter)
        namespace = self._namespace(op.namespace_prefix)
        if op.query is None:
            return (yield from self._list_items(op, namespace))
        # Only the store's memories, and of those the ones whose value contains the filter.
        filters = {STORE_KEY: {"value": op.filter or {}}}
        try:
            result = yield Call(
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

    def _list_items(self, op: SearchOp, namespace: str) -> Plan:
        wanted, cursor = op.offset + op.limit, None
        found: list[SearchItem] = []
        while len(found) < wanted:
            page = yield Call("list", (namespace,), {"limit": PAGE_SIZE, "cursor": cursor})
            for memory in page.memories:
                item = self._item(memory, op.namespace_prefix)
                if item is not None and contains(item["value"], op.filter or {}):
                    found.append(SearchItem(**item))
            if (cursor := page.next_cursor) is None:
                break
        return found[op.offset : wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> Plan:
        stats = yield Call("stats")
        start = self.prefix + "."
        namespaces = {
            tuple(row.namespace[len(start) :].split("."))
            for row in stats.namespaces
            if row.namespace.startswith(start) and row.memories > 0
        }
        matching = {
            namespace[: op.max_depth] if op.max_depth is not None else namespace
            for namespace in namespaces
            if all(matches(namespace, condition) for condition in op.match_conditions or ())
        }
        return sorted(matching)[op.offset : op.offset + op.limit]
