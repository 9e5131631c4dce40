"""``earm mcp``: the MCP tools over stdio, for MCP clients that launch a command."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from service.checks import namespace_name
from service.integrations import MCP_MISSING
from service.settings import Settings


def add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``earm mcp``: each tool call an HTTP request to a running earm."""
    mcp = commands.add_parser(
        "mcp",
        help="serve earm's memory tools to an MCP client over stdio",
        description="The MCP tools over stdin/stdout, each call an HTTP request to a running earm.",
    )
    mcp.add_argument(
        "--url", default=None, help="the earm service (default EARM_URL, http://127.0.0.1:8000)"
    )
    mcp.add_argument("--api-key", default=None, help="its API key (default EARM_API_KEY)")
    mcp.add_argument(
        "--namespace",
        type=namespace_name,
        default=None,
        help="default namespace of the tools (default EARM_MCP_DEFAULT_NAMESPACE)",
    )
    mcp.set_defaults(func=_serve_mcp_stdio)


def _serve_mcp_stdio(args: argparse.Namespace, settings: Settings) -> int:
    if importlib.util.find_spec("mcp") is None:
        print(f"earm mcp: {MCP_MISSING}", file=sys.stderr)
        return 2
    from service.integrations.mcp import serve_stdio

    api_key = args.api_key or (settings.api_key.get_secret_value() if settings.api_key else None)
    serve_stdio(args.url or settings.url, api_key, args.namespace or settings.mcp_default_namespace)
    return 0
