"""earm's memory as MCP tools: Streamable HTTP at ``/mcp``, stdio in ``earm mcp``.

One implementation of the tools, on earm's public HTTP API (``service.client.AsyncEarmClient``):

- at ``/mcp`` the client calls the very app that serves the MCP request, in-process (httpx's ASGI
  transport), with the caller's ``Authorization`` header and peer address;
- in ``earm mcp`` it calls a running earm over HTTP (``--url``, ``--api-key``).

So the API authenticates the key, limits it to its namespaces, validates the arguments and
answers with its stable error codes exactly as for a REST call, and nothing here depends on the
service's internals. An API error becomes an MCP tool error (``is_error``) whose text starts with
the API's code: ``forbidden (HTTP 403): this API key (...) is not allowed to use namespace 'x'``.

Built on the SDK's 2.x line (``mcp>=2.3,<3``), whose high-level server is ``MCPServer``.
"""

# No `from __future__ import annotations`: the SDK reads the tools' signatures at runtime, and the
# namespace argument's type is built per server (its description names the default namespace).

import importlib.metadata
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal, TypeAlias

import anyio
import httpx
from fastapi import APIRouter, FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, TypeAdapter
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from service.client import (
    AsyncEarmClient,
    EarmAPIError,
    FeedbackResult,
    IngestResult,
    MemoryPage,
    NamespaceStats,
)
from service.http.schemas import Timestamp
from service.retrieve.rerank import Source
from service.settings import Settings

MCP_PATH = "/mcp"
#: Base URL of the in-process API calls; never resolved, the ASGI transport answers them.
IN_PROCESS_URL = "http://earm.in-process"
#: namespace_stats answers the stats of ``GET /stats`` as a JSON object.
_STATS_JSON = TypeAdapter(NamespaceStats)
#: Headers of the MCP request that its API calls carry on (besides its request id): its key,
#: and the host it named, which the API checks as for any request of a loopback caller.
FORWARDED_HEADERS = ("authorization", "host")

#: How a tool reaches the API for one call: an ``AsyncEarmClient`` for the caller of ``ctx``.
Connector = Callable[[Context], AbstractAsyncContextManager[AsyncEarmClient]]

INSTRUCTIONS = """\
earm is your long-term memory. Store facts worth remembering with add_memories (one
self-contained statement each, with occurred_at when you know it), recall them with
search_memories before you answer, and tell earm which recalled memories were useful with
give_feedback: retrieval learns from it. Every tool works in one namespace (one agent's or
user's memory); omit it to use the default one."""


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
        "from earlier judgements (estimated; expanded: a memory outside the semantic "
        "candidates that search expansion added), or embedding similarity alone (semantic)."
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


# Over 60 lines on purpose: the six tool declarations (signature, JSON-schema'd arguments and
# the description an LLM reads) are one list, each tool a few lines over the shared client.
def build_server(connect: Connector, default_namespace: str) -> MCPServer:
    """The MCP server of earm's tools; ``connect`` gives each call its API client."""
    server = MCPServer(
        name="earm",
        title="earm memory",
        instructions=INSTRUCTIONS,
        version=importlib.metadata.version("earm"),
    )
    # The namespace argument of the tools; its description names this server's default.
    Namespace: TypeAlias = Annotated[
        str | None,
        Field(
            description="The memory space to use (one agent's or user's memory); omit it for "
            f"the default, {default_namespace!r}.",
        ),
    ]

    @server.tool(annotations=ToolAnnotations(idempotent_hint=False, destructive_hint=False))
    async def add_memories(
        memories: Annotated[
            list[NewMemory], Field(min_length=1, description="The memories to store.")
        ],
        ctx: Context,
        namespace: Namespace = None,
    ) -> IngestResult:
        """Store memories for later recall. Returns their ids in the given order, and how many
        were new (created) or already stored under their external_id (existing)."""
        async with _api(connect, ctx) as earm:
            return await earm.add(
                namespace or default_namespace, [m.model_dump(exclude_none=True) for m in memories]
            )

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    async def search_memories(
        query: Annotated[str, Field(description="What you want to remember, in plain words.")],
        ctx: Context,
        namespace: Namespace = None,
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
        async with _api(connect, ctx) as earm:
            result = await earm.retrieve(namespace or default_namespace, query, k=k, policy=policy)
        return SearchResult(
            query_id=result.query_id,
            memories=[
                RecalledMemory.model_validate(m, from_attributes=True) for m in result.memories
            ],
        )

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
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
        async with _api(connect, ctx) as earm:
            namespace = (await earm.get(memory_id)).namespace
            return await earm.feedback(namespace, query_id, {memory_id: score})

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def list_memories(
        ctx: Context,
        namespace: Namespace = None,
        limit: Annotated[int, Field(ge=1, description="Memories per page.")] = 20,
        cursor: Annotated[
            str | None, Field(description="The next_cursor of the previous page, for the next one.")
        ] = None,
    ) -> MemoryPage:
        """List stored memories, oldest first, one page at a time (next_cursor is null on the
        last page)."""
        async with _api(connect, ctx) as earm:
            return await earm.list(namespace or default_namespace, limit=limit, cursor=cursor)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def delete_memory(
        memory_id: Annotated[int, Field(ge=1, description="The id of the memory to delete.")],
        ctx: Context,
    ) -> DeletedMemory:
        """Delete a memory for good (for example one that is wrong or outdated)."""
        async with _api(connect, ctx) as earm:
            await earm.delete(memory_id)
        return DeletedMemory(deleted=memory_id)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def namespace_stats(ctx: Context, namespace: Namespace = None) -> dict[str, Any]:
        """How many memories and queries a namespace holds and how much its retrieval has
        learned (calls_saved: the share of judging calls saved by what it learned)."""
        async with _api(connect, ctx) as earm:
            stats = await earm.stats(namespace or default_namespace)
        # GET /stats answers one namespace's stats when it names one, never the list.
        assert isinstance(stats, NamespaceStats)
        as_json: dict[str, Any] = _STATS_JSON.dump_python(stats, mode="json")
        return as_json

    return server


# --------------------------------------------------------------------- /mcp in the service


def in_process_connector(app: ASGIApp) -> Connector:
    """Tool calls as API requests to ``app`` itself, made as its MCP caller: its key, its peer
    address (loopback and anonymous rules apply as over HTTP) and its request id."""

    @asynccontextmanager
    async def connect(ctx: Context) -> AsyncIterator[AsyncEarmClient]:
        request = ctx.request_context.request  # the HTTP request that carried this call
        if request is None:  # only a stdio session has none, and it has its own connector
            raise RuntimeError("an /mcp tool call came without its HTTP request")
        headers = {
            name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers
        }
        # The access log lines of the call's API requests then share the MCP request's id.
        if (request_id := getattr(request.state, "request_id", None)) is not None:
            headers["x-request-id"] = request_id
        transport = httpx.ASGITransport(
            app=app,
            client=request.scope.get("client"),
            # A 500 is an answer (internal_error), not an exception in the tool.
            raise_app_exceptions=False,
        )
        async with httpx.AsyncClient(
            transport=transport, base_url=IN_PROCESS_URL, headers=headers, trust_env=False
        ) as http:
            yield AsyncEarmClient(IN_PROCESS_URL, http_client=http)

    return connect


class _StreamableHTTPEndpoint:
    """The ASGI endpoint of ``/mcp``: the session manager of the app's current run.

    A session manager runs once, so each lifespan (a test client may start an app twice) makes
    its own. Stateless: every POST stands alone, so any replica or worker can answer it."""

    def __init__(self, server: MCPServer, settings: Settings) -> None:
        self.server = server
        self.settings = settings
        self.sessions: StreamableHTTPASGIApp | None = None

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        # The SDK protects a loopback-bound server from DNS rebinding (Host and Origin checks).
        self.server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            max_request_body_size=self.settings.max_body_bytes,
            host=self.settings.host,
        )
        manager = self.server.session_manager
        async with manager.run():
            self.sessions = StreamableHTTPASGIApp(manager)
            try:
                yield
            finally:
                self.sessions = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.sessions is None:
            raise RuntimeError("/mcp is served only while the app runs (its lifespan)")
        await self.sessions(scope, receive, send)


def mount(app: FastAPI, settings: Settings) -> None:
    """Serve the tools at ``/mcp`` (all methods; the SDK answers GET and DELETE itself). The
    route is outside the API's authentication dependency: the handshake and the tool list are
    public like the OpenAPI document, and every tool call is authenticated by its API request."""
    endpoint = _StreamableHTTPEndpoint(
        build_server(in_process_connector(app), settings.mcp_default_namespace), settings
    )
    router = APIRouter(lifespan=endpoint.lifespan)
    router.routes.append(Route(MCP_PATH, endpoint=endpoint))
    app.include_router(router)


# ------------------------------------------------------------------------- `earm mcp` (stdio)


def serve_stdio(url: str, api_key: str | None, default_namespace: str) -> None:
    """The tools on stdin/stdout, each call an HTTP request to the earm at ``url``."""

    async def serve() -> None:
        async with AsyncEarmClient(url, api_key) as earm:

            @asynccontextmanager
            async def connect(ctx: Context) -> AsyncIterator[AsyncEarmClient]:
                yield earm

            await build_server(connect, default_namespace).run_stdio_async()

    anyio.run(serve)
