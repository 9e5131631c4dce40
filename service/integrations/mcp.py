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

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, FastAPI, Request
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth import Authenticator
from service.client import AsyncEarmClient
from service.http.middleware import annotate
from service.integrations.mcp_tools import (
    TOOLS,
    Connector,
    DeletedMemory,
    NewMemory,
    RecalledMemory,
    SearchResult,
    Tools,
)
from service.settings_groups import IntegrationSettings, ServingSettings

__all__ = [
    "FORWARDED_HEADERS",
    "IN_PROCESS_URL",
    "INSTRUCTIONS",
    "MCP_PATH",
    "Connector",
    "DeletedMemory",
    "NewMemory",
    "RecalledMemory",
    "SearchResult",
    "build_server",
    "in_process_connector",
    "mount",
    "serve_stdio",
]

MCP_PATH = "/mcp"
#: Base URL of the in-process API calls; never resolved, the ASGI transport answers them.
IN_PROCESS_URL = "http://earm.in-process"
#: Headers of the MCP request that its API calls carry on (besides its request id): its key,
#: and the host it named, which the API checks as for any request of a loopback caller.
FORWARDED_HEADERS = ("authorization", "host")

INSTRUCTIONS = """\
earm is your long-term memory. Store facts worth remembering with add_memories (one
self-contained statement each, with occurred_at when you know it), recall them with
search_memories before you answer, and tell earm which recalled memories were useful with
give_feedback: retrieval learns from it. Every tool works in one namespace (one agent's or
user's memory); omit it to use the default one."""


def build_server(connect: Connector, default_namespace: str) -> MCPServer:
    """The MCP server of earm's tools; ``connect`` gives each call its API client."""
    server = MCPServer(
        name="earm",
        title="earm memory",
        instructions=INSTRUCTIONS,
        version=importlib.metadata.version("earm"),
    )
    tools = Tools(connect, default_namespace)
    for make_tool, hints in TOOLS:
        server.tool(annotations=hints)(make_tool(tools))
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

    def __init__(self, server: MCPServer, settings: ServingSettings) -> None:
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
        await _authenticate(Request(scope))
        await self.sessions(scope, receive, send)


async def _authenticate(request: Request) -> None:
    """Refuse the callers the API refuses, before the SDK opens anything: the app's handler
    answers the Unauthenticated raised here with 401 ``unauthenticated``, as for any route."""
    authenticator: Authenticator = request.app.state.authenticator  # set by the app's lifespan
    peer = request.client.host if request.client else None
    principal = await authenticator.authenticate(
        request.headers.get("authorization"), peer, request.headers.get("host")
    )
    if principal.key_id is not None:
        annotate(request, api_key_id=principal.key_id)


class _NamedRoute(Route):
    """A route that, like FastAPI's own, puts itself in the scope it matches, where the
    request's metrics and log line read its template (Starlette's Route does not)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


def mount(app: FastAPI, serving: ServingSettings, integrations: IntegrationSettings) -> None:
    """Serve the tools at ``/mcp`` (all methods; the SDK answers GET and DELETE itself). The
    route is outside the API's authentication dependency (it is no FastAPI route) but
    authenticates every request as the API does; each tool call is then an API request,
    limited to the key's namespaces."""
    endpoint = _StreamableHTTPEndpoint(
        build_server(in_process_connector(app), integrations.mcp_default_namespace), serving
    )
    app.include_router(APIRouter(lifespan=endpoint.lifespan))
    # On the app's own router: include_router would copy it into a plain Route.
    app.router.routes.append(_NamedRoute(MCP_PATH, endpoint=endpoint))


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
