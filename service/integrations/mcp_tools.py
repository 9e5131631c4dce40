"""earm's MCP tools: their arguments, their results and what each does with earm's public API,
one small function per tool. :mod:`service.integrations.mcp` builds the server of them and serves
it at ``/mcp`` and over stdio.

A tool reaches the API through a :data:`Connector`, so the same tools serve both transports; an
API error becomes a tool error whose text starts with the API's code.
"""

# No `from __future__ import annotations`: the SDK reads the tools' signatures at runtime, and the
# namespace argument's type is built per server (its description names the default namespace).

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, TypeAlias

import httpx
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, TypeAdapter

from service.api.fields import Timestamp
from service.api.retrieve import Source
from service.client import (
    AsyncEarmClient,
    EarmAPIError,
    FeedbackResult,
    IngestResult,
    MemoryPage,
    NamespaceStats,
)

#: namespace_stats answers the stats of ``GET /stats`` as a JSON object.
_STATS_JSON = TypeAdapter(NamespaceStats)

#: How a tool reaches the API for one call: an ``AsyncEarmClient`` for the caller of ``ctx``.
Connector = Callable[[Context], AbstractAsyncContextManager[AsyncEarmClient]]


class NewMemory(BaseModel):
    text: str = Field(
        description="The memory: one self-contained statement, e.g. 'Caroline went to a "
        "support group on 7 May 2023.'"
    )
    external_id: str | None = Field(
        default=None,
        description="Your own id for the memory. Adding a memory with an external_id the "
        "namespace already has changes nothing and returns the existing id.",
    )
    # The API's own type: an ISO-8601 string only (pydantic alone would read a number as Unix
    # time and store a date the API would have refused to guess).
    occurred_at: Timestamp | None = Field(
        default=None,
        description="When what the memory describes happened (ISO 8601, e.g. "
        "2023-05-07T14:00:00Z). Search results come in this order.",
    )
    metadata: dict[str, Any] | None = Field(
        default=None, description="Any JSON object to keep with the memory."
    )


class RecalledMemory(BaseModel):
    id: int = Field(description="The memory's id (for give_feedback and delete_memory).")
    external_id: str | None
    text: str
    occurred_at: datetime | None
    metadata: dict[str, Any]
    score: float = Field(description="Relevance to the query in [0, 1].")
    source: Source = Field(
        description="Where the score comes from: judged for this query (observed), predicted "
        "from earlier judgements (estimated), or embedding similarity alone (semantic)."
    )
    rank: int = Field(description="1 = most relevant.")


class SearchResult(BaseModel):
    query_id: int | None = Field(
        description="This search's id: pass it to give_feedback (null when the namespace has "
        "no memories yet: nothing was searched)."
    )
    memories: list[RecalledMemory]


class DeletedMemory(BaseModel):
    deleted: int = Field(description="The id of the memory that was deleted.")


@asynccontextmanager
async def _api(connect: Connector, ctx: Context) -> AsyncIterator[AsyncEarmClient]:
    """The API for one tool call; its refusals become tool errors carrying the API's code."""
    try:
        async with connect(ctx) as earm:
            yield earm
    except EarmAPIError as error:
        raise ToolError(f"{error.code} (HTTP {error.status}): {error.message}") from error
    except httpx.TransportError as error:
        raise ToolError(
            f"unreachable: earm did not answer ({type(error).__name__}: {error})"
        ) from error


@dataclass(frozen=True)
class Tools:
    """What the tools of one server share: how a call reaches the API, and the namespace a call
    that names none works in."""

    connect: Connector
    default_namespace: str

    @property
    def namespace_field(self) -> Any:
        """The ``Field`` of the tools' namespace argument; its description names the default."""
        return Field(
            description="The memory space to use (one agent's or user's memory); omit it for "
            f"the default, {self.default_namespace!r}.",
        )

    def namespace(self, given: str | None) -> str:
        return given or self.default_namespace

    def api(self, ctx: Context) -> AbstractAsyncContextManager[AsyncEarmClient]:
        return _api(self.connect, ctx)


#: A tool function as the SDK reads it: its name, signature and docstring are the tool's.
_Tool: TypeAlias = Callable[..., Awaitable[Any]]


def _add_memories(tools: Tools) -> _Tool:
    async def add_memories(
        memories: Annotated[
            list[NewMemory], Field(min_length=1, description="The memories to store.")
        ],
        ctx: Context,
        namespace: Annotated[str | None, tools.namespace_field] = None,
    ) -> IngestResult:
        """Store memories for later recall. Returns their ids in the given order, and how many
        were new (created) or already stored under their external_id (existing)."""
        async with tools.api(ctx) as earm:
            return await earm.add(
                tools.namespace(namespace), [m.model_dump(exclude_none=True) for m in memories]
            )

    return add_memories


def _search_memories(tools: Tools) -> _Tool:
    async def search_memories(
        query: Annotated[str, Field(description="What you want to remember, in plain words.")],
        ctx: Context,
        namespace: Annotated[str | None, tools.namespace_field] = None,
        k: Annotated[int, Field(ge=1, description="How many memories to return.")] = 10,
        policy: Annotated[
            Literal["earm", "semantic", "full", "observed"],
            Field(
                description="earm (default): learned reranking; semantic: embedding "
                "similarity only (fastest); full: judge every candidate (slowest, most "
                "accurate); observed: judged candidates only."
            ),
        ] = "earm",
    ) -> SearchResult:
        """Recall the k memories most relevant to a query, listed in the order they occurred,
        each with its rank (1 = most relevant). Keep query_id to tell give_feedback which ones
        helped."""
        async with tools.api(ctx) as earm:
            result = await earm.retrieve(tools.namespace(namespace), query, k=k, policy=policy)
        return SearchResult(
            query_id=result.query_id,
            memories=[
                RecalledMemory.model_validate(m, from_attributes=True) for m in result.memories
            ],
        )

    return search_memories


def _give_feedback(tools: Tools) -> _Tool:
    async def give_feedback(
        query_id: Annotated[int, Field(ge=1, description="The query_id search_memories returned.")],
        memory_id: Annotated[
            int, Field(ge=1, description="The id of a memory that search returned.")
        ],
        score: Annotated[
            float,
            Field(
                ge=0.0,
                le=1.0,
                description="How useful the memory was for that query: 1 = exactly what was "
                "needed, 0 = irrelevant.",
            ),
        ],
        ctx: Context,
    ) -> FeedbackResult:
        """Say how useful a recalled memory was; later searches learn from it. It replaces any
        earlier judgement of that memory for this query (counted in replaced)."""
        async with tools.api(ctx) as earm:
            namespace = (await earm.get(memory_id)).namespace
            return await earm.feedback(namespace, query_id, {memory_id: score})

    return give_feedback


def _list_memories(tools: Tools) -> _Tool:
    async def list_memories(
        ctx: Context,
        namespace: Annotated[str | None, tools.namespace_field] = None,
        limit: Annotated[int, Field(ge=1, description="Memories per page.")] = 20,
        cursor: Annotated[
            str | None, Field(description="The next_cursor of the previous page, for the next one.")
        ] = None,
    ) -> MemoryPage:
        """List stored memories, oldest first, one page at a time (next_cursor is null on the
        last page)."""
        async with tools.api(ctx) as earm:
            return await earm.list(tools.namespace(namespace), limit=limit, cursor=cursor)

    return list_memories


def _delete_memory(tools: Tools) -> _Tool:
    async def delete_memory(
        memory_id: Annotated[int, Field(ge=1, description="The id of the memory to delete.")],
        ctx: Context,
    ) -> DeletedMemory:
        """Delete a memory for good (for example one that is wrong or outdated)."""
        async with tools.api(ctx) as earm:
            await earm.delete(memory_id)
        return DeletedMemory(deleted=memory_id)

    return delete_memory


def _namespace_stats(tools: Tools) -> _Tool:
    async def namespace_stats(
        ctx: Context, namespace: Annotated[str | None, tools.namespace_field] = None
    ) -> dict[str, Any]:
        """How many memories and queries a namespace holds and how much its retrieval has
        learned (calls_saved: the share of judging calls saved by what it learned)."""
        async with tools.api(ctx) as earm:
            stats = await earm.stats(tools.namespace(namespace))
        # GET /stats answers one namespace's stats when it names one, never the list.
        assert isinstance(stats, NamespaceStats)
        as_json: dict[str, Any] = _STATS_JSON.dump_python(stats, mode="json")
        return as_json

    return namespace_stats


#: Every tool, in the order the server lists them, with the hints an MCP client reads.
TOOLS: tuple[tuple[Callable[[Tools], _Tool], ToolAnnotations], ...] = (
    (_add_memories, ToolAnnotations(idempotent_hint=False, destructive_hint=False)),
    (_search_memories, ToolAnnotations(read_only_hint=False, destructive_hint=False)),
    (_give_feedback, ToolAnnotations(idempotent_hint=True, destructive_hint=False)),
    (_list_memories, ToolAnnotations(read_only_hint=True)),
    (_delete_memory, ToolAnnotations(destructive_hint=True, idempotent_hint=True)),
    (_namespace_stats, ToolAnnotations(read_only_hint=True)),
)
