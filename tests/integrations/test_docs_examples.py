"""Each marked example of docs/integrations.md runs, as written, against a live service."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from service.client import EarmClient

pytestmark = pytest.mark.processes

if TYPE_CHECKING:
    from tests.integrations.conftest import LiveService

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(
    r"<!-- example: (?P<name>[\w-]+) -->\s*```(?P<language>\w+)\n(?P<code>.*?)```", re.S
)
PAGE = REPO / "docs" / "integrations.md"
#: What each Python example prints when it works.
PRINTS = {
    "client": ("recorded 1 replaced 1", "404 not_found"),
    "cohere": ("1.0 Alice is allergic to peanuts.", "query 1 memories [2, 3]"),
    "langchain-cohere": ("Melanie is planning a camping trip.",),
    "langchain-rerank": ("Melanie is planning a camping trip.", "recorded 1"),
    "llamaindex-rerank": ("Melanie is planning a camping trip. memory 1",),
    "llamaindex-cohere": ("Melanie is planning a camping trip.",),
    "mem0": ("Melanie is planning a camping trip.",),
    "langchain": ("Caroline went to a support group on 7 May.",),
    "langgraph": ("['I am allergic to peanuts.']",),
    "llamaindex": ("Melanie is planning a camping trip.",),
}
#: What Mem0's reranker prints first when its call failed: it falls back silently to score 0.0.
MEM0_FALLBACK = "0.0 "
#: The placeholder key of the MCP configurations.
EXAMPLE_KEY = "earm_your-key"


def examples() -> dict[str, tuple[str, str]]:
    return {m["name"]: (m["language"], m["code"]) for m in EXAMPLE.finditer(PAGE.read_text())}


def test_the_page_has_one_example_per_integration() -> None:
    assert set(examples()) == {"mcp-stdio", "mcp-http", *PRINTS}


#: The examples for SDKs made for hosted rerankers, which always send a key.
SDKS_THAT_SEND_A_KEY = ("cohere", "langchain-cohere", "llamaindex-cohere", "mem0")


def run_example(name: str, url: str, api_key: str | None) -> None:
    """Run the page's example ``name`` against ``url`` and check what it prints."""
    language, code = examples()[name]
    assert language == "python"
    env = {
        **{k: v for k, v in os.environ.items() if k != "EARM_API_KEY"},
        "EARM_URL": url,
        "PYTHONPATH": str(REPO),
        # Mem0 reports usage to PostHog unless told not to; the tests run offline.
        "MEM0_TELEMETRY": "False",
    }
    if api_key is not None:
        env["EARM_API_KEY"] = api_key
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    for printed in PRINTS[name]:
        assert printed in result.stdout, result.stdout
    if name == "mem0":
        assert not result.stdout.startswith(MEM0_FALLBACK), result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_python_example_runs_against_a_live_service(name: str, service: LiveService) -> None:
    run_example(name, service.url, service.agent_key)


@pytest.mark.parametrize("name", SDKS_THAT_SEND_A_KEY)
def test_reranker_sdk_example_runs_against_a_keyless_install_without_a_key(
    name: str, keyless_service: str
) -> None:
    run_example(name, keyless_service, api_key=None)


def config(name: str) -> dict[str, Any]:
    language, code = examples()[name]
    assert language == "json"
    return json.loads(code)["mcpServers"]["earm"]


async def add_and_search(client: Client, namespace: str | None) -> None:
    """What an agent does with the tools: store, recall (in the configured default namespace)."""
    arguments = {"namespace": namespace} if namespace else {}
    added = await client.call_tool(
        "add_memories", {"memories": [{"text": "I live in Porto."}], **arguments}
    )
    assert not added.is_error, added.content
    found = await client.call_tool("search_memories", {"query": "Where do I live?", **arguments})
    assert not found.is_error, found.content
    assert found.structured_content["memories"][0]["text"] == "I live in Porto."


def test_mcp_stdio_config_launches_earm_mcp_against_a_live_service(service: LiveService) -> None:
    server = config("mcp-stdio")
    assert server["command"] == "earm" and server["env"]["EARM_API_KEY"] == EXAMPLE_KEY
    args = [service.url if arg.startswith("http://") else arg for arg in server["args"]]
    env = {**server["env"], "EARM_API_KEY": service.agent_key, "PYTHONPATH": str(REPO)}
    # The `earm` script this environment installed (pip install -e .): its bin directory.
    command = str(Path(sys.executable).parent / server["command"])
    launch = StdioServerParameters(command=command, args=args, env=env, cwd=REPO)

    async def scenario() -> None:
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(launch, errlog=errlog)) as client:
                await add_and_search(client, namespace=None)

    asyncio.run(scenario())
    with EarmClient(service.url, api_key=service.admin_key) as earm:  # the config's namespace
        listed = earm.list(server["env"]["EARM_MCP_DEFAULT_NAMESPACE"]).memories
        assert [memory.text for memory in listed] == ["I live in Porto."]


def test_mcp_http_config_connects_to_a_live_service(service: LiveService) -> None:
    server = config("mcp-http")
    assert server["type"] == "http" and urlsplit(server["url"]).path == "/mcp"
    url = service.url + urlsplit(server["url"]).path
    headers = {
        name: value.replace(EXAMPLE_KEY, service.agent_key)
        for name, value in server["headers"].items()
    }

    async def scenario() -> None:
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            await add_and_search(client, namespace="agent-42")

    asyncio.run(scenario())
