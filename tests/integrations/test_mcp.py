"""The MCP tools through the SDK's own clients: Streamable HTTP at /mcp, `earm mcp` over stdio."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import httpx
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from pydantic import ValidationError

from service.api.memories import MemoryIn
from service.api.retrieve import RetrievedMemory, Source
from service.client import EarmClient
from service.http.app import create_app
from service.integrations.mcp import NewMemory, RecalledMemory
from service.settings import Settings

if TYPE_CHECKING:
    from tests.integrations.conftest import LiveService

REPO = Path(__file__).resolve().parents[2]
DEFAULT_NAMESPACE = "agent-default"  # the service fixture's EARM_MCP_DEFAULT_NAMESPACE too
TOOLS = {
    "add_memories",
    "search_memories",
    "give_feedback",
    "list_memories",
    "delete_memory",
    "namespace_stats",
}
MEMORIES = [
    {"text": "My dog is called Rex and loves the beach.", "external_id": "dog"},
    {"text": "I work night shifts as a nurse.", "metadata": {"topic": "work"}},
    {"text": "We went camping at the lake in June.", "occurred_at": "2023-06-10T12:00:00Z"},
]

Connect = Callable[[str | None], AbstractAsyncContextManager[Client]]


def test_recalled_memories_carry_every_source_a_retrieve_returns() -> None:
    """search_memories validates the API's memories into its own model: a source it did not
    know would fail the whole tool call."""
    for source in get_args(Source):
        memory = RetrievedMemory(1, None, "text", None, {}, 0.5, source, 0.4, 1)
        assert RecalledMemory.model_validate(memory, from_attributes=True).source == source


@pytest.mark.parametrize("occurred_at", [1683554160, "1683554160", 1683554160000.0])
def test_add_memories_refuses_a_numeric_occurred_at_like_the_api(occurred_at: object) -> None:
    """POST /memories refuses Unix times rather than guess their unit; the tool's model read
    them as dates and the API stored them."""
    for model in (NewMemory, MemoryIn):
        with pytest.raises(ValidationError, match="ISO-8601"):
            model.model_validate({"text": "x", "occurred_at": occurred_at})
    assert NewMemory(text="x", occurred_at="2023-05-08T13:56:00Z").occurred_at == datetime(
        2023, 5, 8, 13, 56, tzinfo=UTC
    )


def over_http(service_url: str) -> Connect:
    """The SDK's Streamable HTTP client at /mcp, sending ``key`` as a bearer token."""

    @asynccontextmanager
    async def connect(key: str | None) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(f"{service_url}/mcp", http_client=http)) as client,
        ):
            yield client

    return connect


def over_stdio(service_url: str) -> Connect:
    """`python -m service mcp --url ... --namespace ...` launched by the SDK's stdio client, as
    Claude Desktop launches it (the key through EARM_API_KEY, the way its config passes
    secrets; the example of docs/integrations.md covers EARM_MCP_DEFAULT_NAMESPACE)."""

    @asynccontextmanager
    async def connect(key: str | None) -> AsyncIterator[Client]:
        env = {"PYTHONPATH": str(REPO)}
        if key:
            env["EARM_API_KEY"] = key
        server = StdioServerParameters(
            command=sys.executable,
            args=["-m", "service", "mcp", "--url", service_url, "--namespace", DEFAULT_NAMESPACE],
            env=env,
            cwd=REPO,
        )
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(server, errlog=errlog)) as client:
                yield client

    return connect


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, error_text(result)
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return error_text(result)


# ------------------------------------------------------------------------------ scenarios


async def lists_the_tools_with_described_arguments(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40, tool.name
        for name, schema in tool.input_schema.get("properties", {}).items():
            assert "description" in schema or "$ref" in schema or "items" in schema, (
                tool.name,
                name,
            )
    add = tools["add_memories"].input_schema
    assert add["required"] == ["memories"]
    memory_schema = add["$defs"]["NewMemory"]["properties"]
    assert set(memory_schema) == {"text", "external_id", "occurred_at", "metadata"}
    search = tools["search_memories"].input_schema["properties"]
    assert search["k"]["default"] == 10 and search["policy"]["default"] == "earm"
    assert DEFAULT_NAMESPACE in search["namespace"]["description"]
    assert tools["delete_memory"].annotations.destructive_hint is True


async def adds_searches_and_records_feedback(client: Client) -> None:
    added = await call(client, "add_memories", memories=MEMORIES, namespace="agent-1")
    assert added["created"] == 3 and len(added["ids"]) == 3
    again = await call(client, "add_memories", memories=MEMORIES[:1], namespace="agent-1")
    assert again == {"ids": added["ids"][:1], "created": 0, "existing": 1, "updated": 0}

    # semantic: nothing is judged while searching, so the feedback is the first observation.
    found = await call(
        client,
        "search_memories",
        query="What is my dog's name?",
        namespace="agent-1",
        k=2,
        policy="semantic",
    )
    assert len(found["memories"]) == 2 and found["query_id"] >= 1
    best = min(found["memories"], key=lambda m: m["rank"])
    assert best["id"] == added["ids"][0] and best["text"] == MEMORIES[0]["text"]
    assert set(best) == {
        "id",
        "external_id",
        "text",
        "occurred_at",
        "metadata",
        "score",
        "source",
        "rank",
    }
    assert best["source"] == "semantic" and best["external_id"] == "dog"

    feedback = await call(
        client, "give_feedback", query_id=found["query_id"], memory_id=best["id"], score=1.0
    )
    assert feedback == {"recorded": 1, "replaced": 0}
    stats = await call(client, "namespace_stats", namespace="agent-1")
    assert (stats["memories"], stats["queries"], stats["observations"]) == (3, 1, 1)

    page = await call(client, "list_memories", namespace="agent-1", limit=2)
    assert [m["id"] for m in page["memories"]] == added["ids"][:2] and page["next_cursor"]
    rest = await call(client, "list_memories", namespace="agent-1", cursor=page["next_cursor"])
    assert [m["id"] for m in rest["memories"]] == added["ids"][2:] and rest["next_cursor"] is None

    assert await call(client, "delete_memory", memory_id=added["ids"][1]) == {
        "deleted": added["ids"][1]
    }
    assert "not_found (HTTP 404)" in await refused(
        client, "delete_memory", memory_id=added["ids"][1]
    )


async def uses_the_default_namespace(client: Client) -> None:
    added = await call(client, "add_memories", memories=[{"text": "I like green tea."}])
    found = await call(client, "search_memories", query="Which tea do I like?")
    assert [m["id"] for m in found["memories"]] == added["ids"]
    assert (await call(client, "namespace_stats"))["namespace"] == DEFAULT_NAMESPACE


async def reports_the_api_error_codes(client: Client) -> None:
    assert "validation_error (HTTP 422)" in await refused(
        client, "add_memories", memories=[{"text": "x"}], namespace="not a namespace"
    )
    assert "not_found (HTTP 404)" in await refused(
        client, "namespace_stats", namespace="agent-nobody"
    )


async def scenario_with(
    connect: Connect, key: str, *steps: Callable[[Client], Awaitable[None]]
) -> None:
    async with connect(key) as client:
        for step in steps:
            await step(client)


def seed_other_namespace(service: LiveService) -> int:
    with EarmClient(service.url, api_key=service.admin_key) as earm:
        return earm.add("team-x", ["A secret of another team."]).ids[0]


async def refuses_calls_without_a_key(connect: Connect) -> None:
    async with connect(None) as anonymous:
        assert {tool.name for tool in (await anonymous.list_tools()).tools} == TOOLS
        text = await refused(
            anonymous, "add_memories", memories=[{"text": "x"}], namespace="agent-1"
        )
        assert "unauthenticated (HTTP 401)" in text
        assert "unauthenticated (HTTP 401)" in await refused(anonymous, "namespace_stats")


async def refuses_calls_outside_the_keys_namespaces(
    connect: Connect, agent_key: str, other_memory: int
) -> None:
    async with connect(agent_key) as agent:
        text = await refused(agent, "add_memories", memories=[{"text": "x"}], namespace="team-x")
        assert "forbidden (HTTP 403)" in text and "team-x" in text
        assert "forbidden (HTTP 403)" in await refused(
            agent, "search_memories", query="secret", namespace="team-x"
        )
        assert "forbidden (HTTP 403)" in await refused(
            agent, "delete_memory", memory_id=other_memory
        )
        assert "forbidden (HTTP 403)" in await refused(
            agent, "give_feedback", query_id=1, memory_id=other_memory, score=1.0
        )


# ------------------------------------------------- both transports: /mcp and `earm mcp`

TRANSPORTS = {"streamable-http": over_http, "stdio": over_stdio}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mcp_lists_tools_adds_searches_and_records_feedback(
    transport: str, service: LiveService
) -> None:
    assert service.default_namespace == DEFAULT_NAMESPACE
    run(
        lambda: scenario_with(
            TRANSPORTS[transport](service.url),
            service.agent_key,
            lists_the_tools_with_described_arguments,
            adds_searches_and_records_feedback,
            uses_the_default_namespace,
            reports_the_api_error_codes,
        )
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mcp_refuses_calls_outside_the_keys_namespaces(
    transport: str, service: LiveService
) -> None:
    other_memory = seed_other_namespace(service)
    run(
        lambda: refuses_calls_outside_the_keys_namespaces(
            TRANSPORTS[transport](service.url), service.agent_key, other_memory
        )
    )
    with EarmClient(service.url, api_key=service.admin_key) as earm:
        assert earm.get(other_memory).text == "A secret of another team."  # nothing was deleted


def test_earm_mcp_without_a_key_lists_the_tools_but_every_call_is_refused(
    service: LiveService,
) -> None:
    """`earm mcp` speaks MCP on its own stdio; its calls reach the API without a key (over
    HTTP, /mcp refuses the whole request: the test below)."""
    run(lambda: refuses_calls_without_a_key(over_stdio(service.url)))


# --------------------------------------------------------------------- Streamable HTTP /mcp


def test_mcp_over_http_refuses_a_forged_key(service: LiveService) -> None:
    with httpx.Client(base_url=service.url, timeout=10) as http:
        tool_call = {"name": "list_memories", "arguments": {"namespace": "agent-1"}}
        response = http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": tool_call},
            headers=RAW_HEADERS | {"Authorization": "Bearer earm_not-a-key"},
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_mcp_over_http_answers_401_before_opening_anything_without_a_key(
    service: LiveService, method: str
) -> None:
    """/mcp authenticates like every route once keys are enforced: a GET without a key opened
    an event stream that stayed open (20 of 20 after 17 s, where /stats answered 401)."""
    tools_list = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx.Client(base_url=service.url, timeout=10) as http, http.stream(
        method, "/mcp", headers=RAW_HEADERS, json=tools_list if method == "POST" else None
    ) as response:
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="earm"'
        assert json.loads(response.read())["error"]["code"] == "unauthenticated"


def test_mcp_over_http_speaks_the_handshake_protocol_too(service: LiveService) -> None:
    """Clients on the 2025 protocol (initialize handshake, e.g. Claude Desktop) work as well."""

    async def scenario() -> None:
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {service.agent_key}"}
        ) as http:
            transport = streamable_http_client(f"{service.url}/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                added = await call(
                    client,
                    "add_memories",
                    memories=[{"text": "Legacy works."}],
                    namespace="agent-2",
                )
                assert added["created"] == 1

    run(scenario)
    # Its requests are counted under their route, not as requests that matched none.
    metrics = httpx.get(
        f"{service.url}/metrics", headers={"Authorization": f"Bearer {service.admin_key}"}
    ).text
    assert re.search(r'earm_http_requests_total\{[^}]*route="/mcp"[^}]*\} [1-9]', metrics)
    assert 'route="<unmatched>"' not in metrics


def test_mcp_tool_calls_reach_the_api_with_the_callers_request_id(
    service: LiveService, caplog: pytest.LogCaptureFixture
) -> None:
    """The API requests a tool call makes carry the MCP request's id: one id in the logs."""
    caplog.set_level(logging.INFO, logger="earm.access")

    async def scenario() -> None:
        headers = {"Authorization": f"Bearer {service.agent_key}", "X-Request-ID": "mcp-call-42"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(f"{service.url}/mcp", http_client=http)) as client,
        ):
            found = await call(client, "search_memories", query="q", namespace="agent-nobody")
            assert found == {"query_id": None, "memories": []}

    run(scenario)
    lines = [vars(r) for r in caplog.records if r.name == "earm.access"]
    api_calls = [line for line in lines if line["path"] == "/retrieve"]
    assert [(line["status"], line["request_id"]) for line in api_calls] == [(200, "mcp-call-42")]
    assert all(line["request_id"] == "mcp-call-42" for line in lines)


# ------------------------------------------------------------------------------ stdio


def test_earm_mcp_over_stdio_reports_an_unreachable_service_as_a_tool_error() -> None:
    async def scenario() -> None:
        async with over_stdio("http://127.0.0.1:9")("earm_any-key") as client:
            assert "unreachable: earm did not answer" in await refused(client, "namespace_stats")

    run(scenario)


# ------------------------------------------------- raw JSON-RPC: peer address, Host, Origin

#: What a 2025-protocol client sends with a POST (stateless: no session, no handshake needed).
RAW_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}


def post_tool_call(
    http: TestClient, tool: str, arguments: dict[str, Any], **headers: str
) -> httpx.Response:
    """One JSON-RPC tools/call POST to /mcp."""
    call = {"name": tool, "arguments": arguments}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
    return http.post("/mcp", json=body, headers=RAW_HEADERS | headers)


def tool_result(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_keyless_earm_refuses_mcp_callers_from_another_host(settings: Settings) -> None:
    """Without keys earm answers loopback clients only, at /mcp too; and the tool calls of a
    loopback caller are made as that caller (in-process, with its peer address)."""
    app = create_app(settings)  # no API keys, loopback bind address
    arguments = {"memories": [{"text": "x"}], "namespace": "agent-1"}
    with TestClient(app, base_url="http://127.0.0.1:8000", client=("203.0.113.9", 4711)) as remote:
        response = post_tool_call(remote, "add_memories", arguments)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    with TestClient(app, base_url="http://127.0.0.1:8000", client=("127.0.0.1", 4711)) as local:
        result = tool_result(post_tool_call(local, "add_memories", arguments))
    assert not result["isError"] and result["structuredContent"]["created"] == 1


def test_mcp_checks_host_and_origin_on_a_loopback_address_only(
    settings: Settings, clean_database: str
) -> None:
    """DNS rebinding: a web page must not reach a loopback earm's tools through the browser;
    an earm bound to all interfaces answers whatever name its clients know it by."""
    with TestClient(create_app(settings), base_url="http://rebound.example:8000") as rebound:
        assert post_tool_call(rebound, "namespace_stats", {}).status_code == 421
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8000") as local:
        foreign = post_tool_call(local, "namespace_stats", {}, Origin="http://rebound.example")
        assert foreign.status_code == 403

    key = "rebinding-test-key-0123456789"
    exposed = Settings(
        database_url=clean_database, host="0.0.0.0", api_keys=f"{key}=*", _env_file=None
    )
    with TestClient(create_app(exposed), base_url="http://earm.internal:8000") as remote:
        response = post_tool_call(
            remote, "add_memories", {"memories": [{"text": "x"}]}, Authorization=f"Bearer {key}"
        )
        assert tool_result(response)["structuredContent"]["created"] == 1
